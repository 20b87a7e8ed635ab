"""GitHub Classroom and Actions: the students' workflow (a preview on every push) and the staff's sharded class grading.

    invariants-bundle github -a p01 -o bundles/ --shards 8

OUT/github/student/ goes into the assignment's starter repository: .github/workflows/invariants-gate.yml and
.github/gate/ (the wheel, constraints.txt and <assignment>-preview.toml: the visible invariants alone, so the hidden
ones are not named in the students' repositories). It carries no secret: whatever a student's repository can read, its
student can (a workflow is theirs to edit), so the preview draws a fresh seed and is never the grade of record.
OUT/github/staff/ goes into a private staff repository: .github/workflows/grade-class.yml collects the students'
repositories, grades them in N shards (`invariants-gate --batch ... --shard K/N`) with the course secret from the
repository secret GATE_SECRET, and merges the shards into the class summary (`--merge`).
"""

from __future__ import annotations

import shutil

import tomllib

from invariants.bundles.course import BundleError, render

STUDENT_WORKFLOW = ".github/workflows/invariants-gate.yml"
STAFF_WORKFLOW = ".github/workflows/grade-class.yml"
GATE_FOLDER = ".github/gate"


def build(course, out, shards):
    """Write OUT/github/{student,staff}; the folder."""
    if shards < 1:
        raise BundleError(f"--shards {shards} must be at least 1")
    folder = out / "github"
    shutil.rmtree(folder, ignore_errors=True)
    student, staff = folder / "student", folder / "staff"
    common = {"INDEX_OPTIONS": course.index_options, "REQUIREMENT": course.requirement}
    course.write_shared(student / GATE_FOLDER, secret=False)
    (student / GATE_FOLDER / course.assignment_file.name).unlink()
    preview = f"{course.assignment_file.stem}-preview.toml"
    (student / GATE_FOLDER / preview).write_text(preview_assignment(course))
    _write(student / STUDENT_WORKFLOW, render("github/student.yml", PREVIEW=preview, **common))
    course.write_shared(staff / GATE_FOLDER, secret=False)
    _write(staff / STAFF_WORKFLOW, render("github/staff.yml", ASSIGNMENT=course.assignment_file.name, SHARDS=shards, WHEEL=course.wheel.name,
                                          SHARD_LIST=", ".join(str(k) for k in range(1, shards + 1)), **common))
    return folder


def _write(path, text):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def preview_assignment(course):
    """The assignment as students may read it: every table as written, and [[invariants]] listing the visible invariants by name."""
    data = tomllib.loads(course.assignment_file.read_text(encoding="utf-8"))
    if course.assignment_file.name == "pyproject.toml":
        data = data["tool"]["invariants-gate"]
    lines = [f"# {course.assignment.name}: the visible invariants, for the students' preview (written by invariants-bundle github).",
             "# The course grades with the full assignment; hidden invariants are graded there and named after the due date."]
    for table, values in data.items():
        if table == "invariants":
            continue
        lines += ["", f"[{table}]", *(f"{key} = {_toml(value)}" for key, value in values.items())]
    for selected in course.assignment.selected:
        if selected.visibility == "visible":
            lines += ["", "[[invariants]]", f"select = [{_toml(selected.name)}]", f"points = {_toml(selected.points)}"]
    return "\n".join(lines) + "\n"


def _toml(value):
    """A TOML value for what an assignment table holds: strings, numbers, booleans and lists of them."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, str):
        return '"' + value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") + '"'
    if isinstance(value, list):
        return "[" + ", ".join(_toml(v) for v in value) + "]"
    raise BundleError(f"the assignment holds a value the preview cannot write: {value!r}")
