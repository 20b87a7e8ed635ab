"""PrairieLearn: an external grader (the image's recipe and a question that uses it), and the grading entry the image runs.

    invariants-bundle prairielearn -a p01 --secret-file course.secret -o bundles/ --image myorg/invariants-gate:p01

OUT/prairielearn/image/ is the image's recipe (a Dockerfile, the wheel, constraints.txt): it holds the gate and nothing
of the course, so it may be public. OUT/prairielearn/question/ is a question folder for the course repository: info.json
(external grading with that image and its entry point), question.html (a file upload) and tests/, which holds the
assignment and the secret. PrairieLearn mounts tests/ at /grade/tests for each job and never shows it to students; the
gate reads them there as root, and its worker (an unprivileged uid of its own, Landlock in PrairieLearn's Docker
container) cannot open /grade at all. The entry grades /grade/student and writes /grade/results/results.json in
PrairieLearn's format: score in [0, 1], the likely bug as the message, one test per visible invariant, and the hidden
invariants as one line of points (PrairieLearn has no "after the due date": a hidden name never reaches a student);
a submission that cannot be graded, or a gate error, is `gradable: false`, which costs the student no attempt.
"""

from __future__ import annotations

import json
import shutil
import uuid
from pathlib import Path

from invariants.bundles.course import SECRET_FILE, render, run_gate

ROOT = Path("/grade")  # PrairieLearn's: student/, tests/ (the question's), results/results.json
ENTRY = "/opt/gate/bin/invariants-bundle"  # where the image's Dockerfile installs the gate
MAX_TIMEOUT = 600  # PrairieLearn's ceiling for a grading job, in seconds
OUTPUT_CHARS = 8000  # a test's output in results.json (PrairieLearn keeps results.json under 1 MB)
GRADED = (0, 1)  # the gate's exit codes of a verdict with a score: passed, failed


def build(course, out, image):
    """Write OUT/prairielearn/{image,question}; the folder."""
    folder = out / "prairielearn"
    shutil.rmtree(folder, ignore_errors=True)
    recipe, question = folder / "image", folder / "question"
    course.write_shared(recipe, secret=False)
    (recipe / course.assignment_file.name).unlink()  # the image carries no course file: the job brings it
    major, minor = course.python_minimum()
    (recipe / "Dockerfile").write_text(render("prairielearn/Dockerfile", IMAGE=image, PYTHON_MAJOR=major, PYTHON_MINOR=minor,
                                              WHEEL=course.wheel.name, INDEX_OPTIONS=course.index_options, REQUIREMENT=course.requirement))
    tests = question / "tests"
    course.write_shared(tests)
    for name in (course.wheel.name, "constraints.txt"):
        (tests / name).unlink()
    entry = [ENTRY, "grade", "prairielearn", "--assignment", f"/grade/tests/{course.assignment_file.name}",
             "--secret-file", f"/grade/tests/{SECRET_FILE}"]
    info = {"uuid": str(uuid.uuid5(uuid.NAMESPACE_URL, f"invariants-bundle:{course.assignment.name}")), "title": course.assignment.name,
            "topic": "Transformers", "type": "v3", "gradingMethod": "External", "singleVariant": True,
            "externalGradingOptions": {"enabled": True, "image": image, "entrypoint": entry,
                                       "timeout": min(MAX_TIMEOUT, int(course.assignment.limits.run_seconds) + 60)}}
    (question / "info.json").write_text(json.dumps(info, indent=2) + "\n")
    (question / "question.html").write_text(render("prairielearn/question.html", NAME=course.assignment.name))
    return folder


def grade(assignment, secret_file, *, root=ROOT):
    """Grade root/student and write root/results/results.json in PrairieLearn's format; the gate's exit code."""
    reports = root / "gate-reports"  # the gate's full reports: the staff's, beside the results
    code = run_gate(root / "student", assignment, secret_file, reports)
    written = reports / "results.json"
    gradescope = json.loads(written.read_text(encoding="utf-8")) if written.is_file() else None
    results = root / "results" / "results.json"
    results.parent.mkdir(parents=True, exist_ok=True)  # PrairieLearn does not make it
    results.write_text(json.dumps(to_prairielearn(code, gradescope), indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    return code


def to_prairielearn(code, gradescope):
    """PrairieLearn's results from the gate's exit code and its Gradescope results (the student's view: hidden names already hidden.N)."""
    if gradescope is None:
        reason = (f"The grader could not grade this submission (invariants-gate exited with {code} and wrote no results). "
                  "This is not your code's fault: the course staff can see why in the grading job's output.")
        return {"gradable": False, "format_errors": [reason], "message": reason}
    if code not in GRADED:  # not gradable (exit 3: the reason is the student's to fix) or a gate error (4: ours): no attempt is lost
        return {"gradable": False, "format_errors": [gradescope["tests"][0]["output"]], "message": gradescope["output"]}
    tests, hidden = [], []
    for test in gradescope["tests"]:
        if test.get("visibility", "visible") != "visible":
            hidden.append(test)
            continue
        statement, _, detail = test["output"].partition("\n\n")
        tests.append({"name": test["name"], "description": statement, "points": test["score"], "max_points": test["max_score"],
                      "message": test["status"], "output": _capped(detail)})
    if hidden:
        tests.append({"name": f"hidden invariants ({len(hidden)})", "description": "graded, and named after the due date",
                      "points": sum(t["score"] for t in hidden), "max_points": sum(t["max_score"] for t in hidden),
                      "message": "", "output": ""})
    score = gradescope["score"] / gradescope["max_score"] if gradescope["max_score"] else 0.0
    return {"gradable": True, "score": score, "message": gradescope["output"], "output": "", "tests": tests}


def _capped(text):
    return text if len(text) <= OUTPUT_CHARS else text[:OUTPUT_CHARS] + f"\n[... {len(text) - OUTPUT_CHARS} characters cut ...]"
