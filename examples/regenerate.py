"""Regenerate examples/reports/ from examples/submissions/ with invariants/gate/assignments/p01.toml.

    python examples/regenerate.py

The reports are what students see for these submissions (and the class summary what staff
see); tests/test_gate_examples.py checks they are in sync. Timestamps and durations are zeroed
(the JSON, JUnit and Gradescope reports' and the class summary's) so that the files change only
when the gate's verdicts or messages do. Each submission is seeded as a course's secret would seed
it, from SECRET, published so that every machine regenerates the same reports. P01 requires the
sandbox: run this where bubblewrap is installed, or as root.
"""

from __future__ import annotations

import csv
import io
import json
import os
import re
import shutil
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SUBMISSIONS = "examples/submissions"
ASSIGNMENT = "invariants/gate/assignments/p01.toml"
SECRET_ENV = "INVARIANTS_GATE_EXAMPLES_SECRET"
SECRET = "examples/regenerate.py: published, so that anyone can regenerate these reports; a course's secret never is"


def normalise(folder):
    """Zero the volatile fields (timestamps, durations) of every report under folder, in place."""
    from invariants.gate.result import without_volatile

    for path in Path(folder).rglob("*"):
        if path.name == "report.json":
            path.write_text(json.dumps(without_volatile(json.loads(path.read_text())), indent=2, ensure_ascii=False) + "\n")
        elif path.name == "results.json":
            data = json.loads(path.read_text())
            data["execution_time"] = 0
            path.write_text(json.dumps(data, indent=2, ensure_ascii=False) + "\n")
        elif path.name == "junit.xml":
            text = re.sub(r'(time|timestamp)="[^"]*"', r'\1="0"', path.read_text())
            path.write_text(text)
        elif path.name == "class-summary.csv":
            rows = list(csv.reader(io.StringIO(path.read_text())))
            at = rows[0].index("seconds")
            buffer = io.StringIO()
            csv.writer(buffer, lineterminator="\n").writerows([rows[0]] + [[*r[:at], "0", *r[at + 1:]] for r in rows[1:]])
            path.write_text(buffer.getvalue())
        elif path.name == "class-summary.md":
            path.write_text(re.sub(r"Grading time: [^|\n]*?\)\.", "Grading time: zeroed in the examples (examples/regenerate.py).",
                                   path.read_text()))


def regenerate(out, jobs=2):
    """Grade every example into out (relative paths, from the project root); the CLI's exit code."""
    from invariants.gate.cli import main

    if Path(out).exists():
        shutil.rmtree(out)
    os.environ[SECRET_ENV] = SECRET  # each report is seeded as a course's would be, and the same on every machine
    try:
        code = main(["--batch", SUBMISSIONS, "-a", ASSIGNMENT, "-o", str(out), "--jobs", str(jobs), "--quiet", "--secret-env", SECRET_ENV])
    finally:
        del os.environ[SECRET_ENV]
    normalise(out)
    return code


if __name__ == "__main__":
    os.chdir(ROOT)
    sys.path.insert(0, str(ROOT))
    sys.exit(regenerate("examples/reports"))
