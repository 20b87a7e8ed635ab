"""Benchmark: the trusted parent's peak memory and wall time on honest and hostile submissions.

    python benchmarks/gate_memory.py                  # every case below, once each
    python benchmarks/gate_memory.py --only huge_bool_answer --repeat 3

Each case grades one submission in a fresh interpreter (invariants.gate.grade.grade, no reports written) and
prints the parent's peak resident memory (getrusage's ru_maxrss of that interpreter alone; the
worker is a child and not counted), its wall clock, the verdict and the reason. The hostile cases
answer with megabytes of the wrong dtype or shape on every call, or (output_flood) flood stdout and stderr
until the file size limit kills the worker, five worker generations over. Prints figures; asserts nothing.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
HOSTILE = ROOT / "tests" / "fixtures" / "hostile"
HOSTILE_TOML = ROOT / "tests" / "fixtures" / "assignments" / "hostile.toml"
CASES = {  # name: (submission, assignment)
    "good_student_p01": (ROOT / "examples" / "submissions" / "good_student", ROOT / "invariants" / "gate" / "assignments" / "p01.toml"),
    "control_good": (HOSTILE / "good.py", HOSTILE_TOML),
    "huge_bool_answer": (HOSTILE / "huge_bool_answer.py", HOSTILE_TOML),
    "huge_wrong_shape": (HOSTILE / "huge_wrong_shape.py", HOSTILE_TOML),
    "output_flood": (HOSTILE / "flood_output.py", ROOT / "tests" / "fixtures" / "assignments" / "flood.toml"),
}
_CHILD = """
import json, resource, sys, time
from invariants.gate.config import load_assignment
from invariants.gate.grade import grade
started = time.monotonic()
result = grade(sys.argv[1], load_assignment(sys.argv[2]))
print(json.dumps({"seconds": time.monotonic() - started, "peak_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
                  "verdict": result.verdict, "reason": result.reason}))
"""


def measure(submission, assignment):
    """{seconds, peak_mib, verdict, reason} of one grade() in a fresh interpreter."""
    done = subprocess.run([sys.executable, "-c", _CHILD, str(submission), str(assignment)], cwd=ROOT, capture_output=True, text=True,
                          check=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", nargs="*", choices=sorted(CASES), help="the cases to run (default all)")
    parser.add_argument("--repeat", type=int, default=1, help="runs per case; the figures are each run's")
    args = parser.parse_args()
    print(f"{'case':<20} {'peak MiB':>9} {'seconds':>8}  verdict: reason")
    for name in args.only or CASES:
        for _ in range(args.repeat):
            got = measure(*CASES[name])
            print(f"{name:<20} {got['peak_mib']:>9.0f} {got['seconds']:>8.1f}  {got['verdict']}: {got['reason'][:110]}", flush=True)


if __name__ == "__main__":
    main()
