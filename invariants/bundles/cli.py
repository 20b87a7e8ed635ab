"""invariants-bundle: build what a course uploads to its grading platform, and grade there.

    invariants-bundle gradescope   -a p01 --secret-file course.secret -o bundles/     # bundles/p01-gradescope.zip
    invariants-bundle prairielearn -a p01 --secret-file course.secret -o bundles/ --image myorg/invariants-gate:p01
    invariants-bundle github       -a p01 -o bundles/ --shards 8                      # the students' and the staff's workflows
    invariants-bundle grade gradescope|prairielearn --assignment FILE --secret-file FILE   # on the platform (the bundles call it)

Exit codes: building, 0 written and 2 a usage, assignment, secret or wheel error (one line saying which); grading, the
gate's own (docs/gate.md), with the platform's results file written whatever it is.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

from invariants.bundles import github, gradescope, prairielearn
from invariants.bundles.course import BundleError, Course
from invariants.pipes import quiet_when_reader_leaves

USAGE_ERROR_EXIT = 2  # as invariants-gate's


def _parser():
    p = argparse.ArgumentParser(prog="invariants-bundle", description="Build what a course uploads to Gradescope, PrairieLearn or GitHub "
                                "Classroom, from an assignment and the course secret (docs/courses.md).")
    commands = p.add_subparsers(dest="command", required=True, metavar="{gradescope,prairielearn,github,grade}")
    for name, text in (("gradescope", "the autograder zip"), ("prairielearn", "the external grader's image recipe and a question"),
                       ("github", "the students' preview workflow and the staff's sharded grading workflow")):
        build = commands.add_parser(name, help=text, description=f"Write {text} into -o.")
        build.add_argument("-a", "--assignment", required=True, help="assignment file (TOML, or a pyproject.toml with [tool.invariants-gate]), "
                                                                     "or a shipped one by name (p01)")
        build.add_argument("-o", "--out", default="bundles", help="folder to write into (default: bundles)")
        build.add_argument("--wheel", help="the project's wheel to ship (default: built from this checkout)")
        build.add_argument("--no-torch", dest="torch", action="store_false", default=None,
                           help="leave torch out (default: torch goes too unless the assignment's backend is numpy)")
        if name != "github":  # the workflows carry no secret: the staff's reads the repository secret GATE_SECRET
            build.add_argument("--secret-file", help="file holding the course secret (default: the assignment's [seed], else the secret "
                                                     "the gate keeps on this machine: docs/gate.md, Seeds)")
            build.add_argument("--secret-env", help="environment variable holding the course secret")
    commands.choices["prairielearn"].add_argument("--image", default="YOUR-ORG/invariants-gate:latest",
                                                  help="the image name info.json names (push the built image there)")
    commands.choices["github"].add_argument("--shards", type=int, default=4, help="CI jobs the staff's class grading is split over (default 4)")
    grade = commands.add_parser("grade", help="on the platform: grade its submission and write its results file",
                                description="Grade the submission where the platform puts it and write its results file (the bundles call this).")
    grade.add_argument("platform", choices=("gradescope", "prairielearn"))
    grade.add_argument("--assignment", required=True, help="the assignment file the bundle carries")
    grade.add_argument("--secret-file", required=True, help="the course secret the bundle carries")
    grade.add_argument("--root", help="the platform's folder (default /autograder or /grade): for a trial run elsewhere")
    return p


@quiet_when_reader_leaves
def main(argv=None):
    args = _parser().parse_args(argv)
    if args.command == "grade":
        return _grade(args)
    try:
        with tempfile.TemporaryDirectory(prefix="invariants-bundle-") as work:
            course = Course.make(args.assignment, secret_file=getattr(args, "secret_file", None), secret_env=getattr(args, "secret_env", None),
                                 wheel=args.wheel, torch=args.torch, with_secret=args.command != "github", workdir=work)
            out = Path(args.out)
            out.mkdir(parents=True, exist_ok=True)
            if args.command == "gradescope":
                written = gradescope.build(course, out)
            elif args.command == "prairielearn":
                written = prairielearn.build(course, out, args.image)
            else:
                written = github.build(course, out, args.shards)
    except (BundleError, OSError) as exc:
        print(f"invariants-bundle: {exc}", file=sys.stderr)
        return USAGE_ERROR_EXIT
    secret = f"the course secret {course.secret.fingerprint} ({course.secret.source})" if course.secret else "no secret"
    print(f"wrote {written}: {course.assignment.name}, {len(course.assignment.selected)} invariants, {course.wheel.name}"
          f"{' with torch' if course.torch else ''}, {secret}")
    if args.command == "github":
        print("set the staff repository's secrets: gh secret set GATE_SECRET < course.secret; gh secret set CLASSROOM_TOKEN")
    return 0


def _grade(args):
    platform = {"gradescope": gradescope, "prairielearn": prairielearn}[args.platform]
    return platform.grade(args.assignment, args.secret_file, root=Path(args.root) if args.root else platform.ROOT)


if __name__ == "__main__":
    sys.exit(main())
