"""The package as a user gets it: build the sdist and the wheel, install the wheel into a fresh virtualenv, use it.

    python .ci/wheel.py WORKDIR          (tox -e wheel; .ci/run)

Checks, in order: the wheel installs exactly the project's top-level packages and carries its data
(py.typed, the zoo's signatures, the models' configs, the shipped assignments); installed with the
pins of constraints.txt into a virtualenv of its own, it runs one invariant through the pytest
plugin (`pytest --pyargs invariants`) and grades one submission with a shipped assignment
(`invariants-gate ... -a p01`), from a folder outside the clone so that nothing is imported from it.
Exits non-zero, saying what failed, at the first check that fails.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TOP_LEVEL = {"invariants", "reference", "strategies"}  # what the wheel installs
DATA = ("invariants/py.typed", "strategies/py.typed", "reference/py.typed",  # the markers and the data the package reads
        "invariants/signatures.json", "invariants/accounting/configs/gpt2.json", "invariants/gate/assignments/p01.toml")
INVARIANT = "layer_norm_known_values"  # one invariant, a second or two on reference.numpy
SUBMISSION = ROOT / "examples" / "submissions" / "good_student"  # passes P01 (examples/reports/good_student)


def fail(message):
    sys.exit(f"wheel check FAILED: {message}")


def run(argv, *, cwd, timeout=600):
    print("$", " ".join(map(str, argv)), flush=True)
    done = subprocess.run([str(a) for a in argv], cwd=cwd, capture_output=True, text=True, timeout=timeout)
    print(done.stdout[-3000:], done.stderr[-3000:], sep="", flush=True)
    return done


def build(dist):
    done = run([sys.executable, "-m", "build", "--outdir", dist, ROOT], cwd=ROOT)  # the sdist, then the wheel built from it
    if done.returncode:
        fail(f"python -m build exited {done.returncode}")
    wheels, sdists = sorted(dist.glob("*.whl")), sorted(dist.glob("*.tar.gz"))
    if len(wheels) != 1 or len(sdists) != 1:
        fail(f"expected one wheel and one sdist in {dist}, found {[p.name for p in dist.iterdir()]}")
    return wheels[0], sdists[0]


def check_contents(wheel):
    with zipfile.ZipFile(wheel) as z:
        names = z.namelist()
    top = {n.split("/")[0] for n in names if not n.split("/")[0].endswith(".dist-info")}
    if top != TOP_LEVEL:
        fail(f"the wheel installs {sorted(top)}, expected {sorted(TOP_LEVEL)}")
    missing = [d for d in DATA if d not in names]
    if missing:
        fail(f"the wheel lacks {missing}")
    modules = sum(n.endswith(".py") for n in names)
    print(f"wheel {wheel.name}: {wheel.stat().st_size:,} bytes, {len(names)} files ({modules} modules), top level {sorted(top)}")


def install(wheel, venv):
    subprocess.run([sys.executable, "-m", "venv", "--clear", venv], check=True)
    python = venv / "bin" / "python"
    done = run([python, "-m", "pip", "install", "--quiet", "-c", ROOT / "constraints.txt", wheel], cwd=venv)
    if done.returncode:
        fail(f"pip install of the wheel exited {done.returncode}")
    return python


def use(python, work):
    """One invariant and one grading from the installed package, in `work` (outside the clone)."""
    done = run([python, "-c", "import invariants; print(invariants.__file__, invariants.__version__)"], cwd=work)
    if done.returncode or not done.stdout.startswith(str(python.parent.parent)):
        fail(f"invariants was not imported from the virtualenv: {done.stdout.strip() or done.stderr.strip()}")
    done = run([python, "-m", "pytest", "--pyargs", "invariants", "-k", INVARIANT, "--impl", "reference.numpy", "-p", "no:cacheprovider", "-q"],
               cwd=work)
    if done.returncode or " passed" not in done.stdout or " failed" in done.stdout:
        fail(f"pytest --pyargs invariants -k {INVARIANT} exited {done.returncode}")
    gate = python.parent / "invariants-gate"
    out = work / "reports"
    done = run([gate, SUBMISSION, "-a", "p01", "-o", out, "--max-examples", "5", "--formats", "json", "-q"], cwd=work)
    report = out / "report.json"
    if done.returncode or not report.is_file():
        fail(f"invariants-gate {SUBMISSION.name} -a p01 exited {done.returncode}")
    graded = json.loads(report.read_text())
    shipped = Path(graded["assignment"]["path"])
    if graded["verdict"] != "passed" or not shipped.is_relative_to(python.parent.parent):
        fail(f"the grading said {graded['verdict']!r} with the assignment {shipped} (expected passed, with the virtualenv's p01)")
    print(f"graded {SUBMISSION.name} with the installed p01 ({shipped}): {graded['verdict']}, {graded['score']} of {graded['max_score']}")


def main(argv):
    base = Path(argv[0] if argv else tempfile.mkdtemp(prefix="wheel-check-")).resolve()
    base.mkdir(parents=True, exist_ok=True)
    wheel, sdist = build(base / "dist")
    print(f"sdist {sdist.name}: {sdist.stat().st_size:,} bytes")
    check_contents(wheel)
    python = install(wheel, base / "venv")
    work = base / "work"
    work.mkdir(exist_ok=True)
    use(python, work)
    print("wheel: 3 passed, 0 failed")  # contents, the invariant, the grading


if __name__ == "__main__":
    os.environ.pop("PYTHONPATH", None)
    os.environ.setdefault("GATE_SECRET", ".ci/wheel.py")  # p01's secret variable: the check grades without making one in ~/.config
    main(sys.argv[1:])
