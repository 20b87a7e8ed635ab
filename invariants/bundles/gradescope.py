"""Gradescope: the autograder zip a course uploads, and the grading entry its run_autograder calls.

    invariants-bundle gradescope -a p01 --secret-file course.secret -o bundles/    # bundles/p01-gradescope.zip

The zip holds setup.sh (a virtualenv /autograder/gate with the wheel, pinned by constraints.txt), run_autograder, the
assignment and the course secret. Gradescope unpacks it into /autograder/source, runs setup.sh once as root, and
run_autograder for each submission: the gate grades /autograder/submission in its confined worker (the landlock tool in
Gradescope's Docker container, docs/gate.md) and writes /autograder/results/results.json in Gradescope's format.

The secret lies in /autograder/source, which setup.sh makes root's alone (0700, the file 0600); the worker runs as an
unprivileged uid of its own, and under Landlock it can open nothing outside its allowed trees (neither /autograder/source
nor the reports), so no student code can read it, nor the assignment's hidden invariants.
"""

from __future__ import annotations

import json
import shutil
import zipfile
from pathlib import Path

from invariants.bundles.course import SECRET_FILE, render, run_gate

ROOT = Path("/autograder")  # Gradescope's: source/ (the zip, unpacked), submission/, results/results.json
REPORTS = "gate-reports"  # under ROOT: the gate's full reports (report.json, summary.md, ...), the staff's, out of the results folder
EXECUTABLE = 0o755


def build(course, out):
    """Write OUT/<assignment>-gradescope.zip; its path."""
    staging = out / "gradescope"
    shutil.rmtree(staging, ignore_errors=True)
    names = course.write_shared(staging)
    major, minor = course.python_minimum()
    (staging / "setup.sh").write_text(render("gradescope/setup.sh", PYTHON_MAJOR=major, PYTHON_MINOR=minor, INDEX_OPTIONS=course.index_options,
                                             REQUIREMENT=course.requirement, SECRET_FILE=SECRET_FILE))
    (staging / "run_autograder").write_text(render("gradescope/run_autograder", ASSIGNMENT=course.assignment_file.name, SECRET_FILE=SECRET_FILE))
    target = out / f"{course.assignment_file.stem}-gradescope.zip"
    with zipfile.ZipFile(target, "w", zipfile.ZIP_DEFLATED) as archive:  # the files at the archive's root, as Gradescope wants them
        for name in ["setup.sh", "run_autograder", *names]:
            entry = zipfile.ZipInfo(name, date_time=(2020, 1, 1, 0, 0, 0))  # the same bytes for the same inputs
            mode = EXECUTABLE if name in ("setup.sh", "run_autograder") else 0o600 if name == SECRET_FILE else 0o644
            entry.external_attr = (0o100000 | mode) << 16
            entry.compress_type = zipfile.ZIP_DEFLATED
            archive.writestr(entry, (staging / name).read_bytes())
    shutil.rmtree(staging)
    return target


def grade(assignment, secret_file, *, root=ROOT):
    """Grade root/submission and write root/results/results.json (the gate's own; one saying so where the gate wrote none); the gate's exit code."""
    reports, results = root / REPORTS, root / "results" / "results.json"
    code = run_gate(root / "submission", assignment, secret_file, reports)
    results.parent.mkdir(parents=True, exist_ok=True)
    written = reports / "results.json"
    if written.is_file():
        shutil.copy(written, results)
    else:  # a usage or assignment error (exit 2), or the gate died: the staff's to fix, said without a word the submission wrote
        results.write_text(json.dumps(not_graded(code), indent=2) + "\n")
    return code


def not_graded(code):
    """Gradescope's results.json for a grading that wrote no results: no score, and why in words that quote nothing."""
    reason = (f"The autograder could not grade this submission (invariants-gate exited with {code} and wrote no results). "
              "This is not your code's fault: the course staff can see why in the autograder's output.")
    return {"score": 0, "output": reason, "output_format": "text", "visibility": "visible", "stdout_visibility": "hidden",
            "tests": [{"name": "The submission was graded", "score": 0, "max_score": 0, "status": "failed", "output": reason,
                       "visibility": "visible"}]}
