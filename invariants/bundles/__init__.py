"""Bundles: what a course uploads to grade where it grades, built from an assignment and the course secret (docs/courses.md).

    invariants-bundle gradescope -a p01 --secret-file course.secret -o bundles/

One module per platform, each with build() (the files the course uploads) and, where the platform runs a grading
entry, grade() (the gate's CLI on the platform's folders, then the platform's results file): invariants.bundles.gradescope,
invariants.bundles.prairielearn, invariants.bundles.github. invariants.bundles.course holds what they share: the
checked assignment, the secret, the wheel and its pins. The gate itself (invariants.gate) is called through its CLI.
"""
