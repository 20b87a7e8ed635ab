"""Regenerate the committed examples: examples/figures/*.png, examples/report-suite.html, examples/report-class.html and their screenshots.

    python -m invariants.htmlreport examples            # from a clone; a few minutes (four suite runs with the ci profile)

The suite report is four runs of the whole suite (`pytest --pyargs invariants --invariants-json`):
the numpy reference in float64 and float32, and two of the gate's example submissions, so that
the matrix has failures to show. The class report is examples/reports/, the gate's own example
batch (examples/regenerate.py writes it). The screenshots are taken in headless Chromium.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent.parent
RUNS = (  # (--impl, --impl-dtype)
    ("reference.numpy", "float64"),
    ("reference.numpy", "float32"),
    ("examples/submissions/mask_after_softmax.py", "float64"),
    ("examples/submissions/unbiased_variance.py", "float64"),
)
MAX_REPRO_BYTES = 8192  # the examples embed the smaller repro scripts only, to stay small
GENERATED = "python -m invariants.htmlreport examples"  # in place of a timestamp: the files change only when their content does


def suite_records(work, *, jobs=2, reuse=False, log=None):
    """Run the suite once per RUNS entry, in `work` (repro scripts under work/repro); the JSON records' paths.

    With reuse, a record already in `work` is kept rather than run again (to iterate on the rendering).
    """
    records = []
    for n, (target, dtype) in enumerate(RUNS):
        record = Path(work) / f"{n}-{Path(target).stem}-{dtype}.json"
        if reuse and record.exists():
            records.append(record)
            continue
        impl = target if not target.endswith(".py") else str(ROOT / target)
        command = [sys.executable, "-m", "pytest", "--pyargs", "invariants", "--impl", impl, "--impl-dtype", dtype,
                   "--invariants-profile", "ci", "--invariants-json", str(record), "--repro-dir", "repro", "-q", "-p", "no:cacheprovider",
                   *(["-n", str(jobs)] if jobs > 1 else [])]
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))
        done = subprocess.run(command, cwd=work, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        if not record.exists():
            raise RuntimeError(f"the suite on {target} ({dtype}) wrote no record (exit {done.returncode}):\n{done.stdout[-2000:]}")
        if log:
            log(f"{target} {dtype}: {done.stdout.strip().splitlines()[-1]}")
        records.append(record)
    return records


def regenerate(*, jobs=2, screenshots=True, keep=None, log=None):
    """Write every example; the paths written. keep: a folder to run the suite in and keep its records (reused next time);
    log(line), if given, hears how each suite run ended."""
    import invariants.htmlreport
    from invariants.htmlreport import figures

    examples = ROOT / "examples"
    if not (examples / "reports").is_dir():
        raise RuntimeError(f"{examples / 'reports'} is missing: run this from a clone of the repository")
    written = figures.write(examples / "figures")
    with tempfile.TemporaryDirectory(prefix="htmlreport-examples-") as temporary:
        work = Path(keep).resolve() if keep else Path(temporary)
        work.mkdir(parents=True, exist_ok=True)
        records = suite_records(work, jobs=jobs, reuse=keep is not None, log=log)
        suite = invariants.htmlreport.suite_html(records, generated=GENERATED, max_repro_bytes=MAX_REPRO_BYTES)
    for machine_specific in (str(Path(work)) + os.sep, str(ROOT) + os.sep):  # the example names no folder of this machine
        suite = suite.replace(machine_specific, "")
    (examples / "report-suite.html").write_text(suite, encoding="utf-8")
    cwd = os.getcwd()
    os.chdir(examples)  # the class report names its source folder relative to examples/
    try:
        batch = invariants.htmlreport.batch_html("reports", generated=GENERATED, max_repro_bytes=MAX_REPRO_BYTES)
    finally:
        os.chdir(cwd)
    (examples / "report-class.html").write_text(batch, encoding="utf-8")
    written += [examples / "report-suite.html", examples / "report-class.html"]
    if screenshots:
        from invariants.htmlreport.browser import screenshot

        for html, png, card in (("report-suite.html", "report.png", False), ("report-suite.html", "report-card.png", True),
                                ("report-class.html", "report-class.png", False)):
            problems, _ = screenshot(examples / html, examples / png, width=1280, height=900, open_first_card=card)
            if problems:
                raise RuntimeError(f"{html} has problems in the browser: {problems}")
            (examples / png).write_bytes(figures._palette((examples / png).read_bytes(), 256))  # a third of the bytes, for the repository
            written.append(examples / png)
    return written
