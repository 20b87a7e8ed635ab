"""The example submissions' reports in examples/reports/ are what the gate produces today."""

from __future__ import annotations

import importlib.util
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import hypothesis
import pytest

from invariants.repro import repro_stem

ROOT = Path(__file__).resolve().parent.parent
EXPECTED_VERDICTS = {  # report folder: verdict
    "good_student": "passed",
    "mask_after_softmax": "failed",
    "unbiased_variance": "failed",
    "missing_functions": "not_gradable",
}
EXPECTED_PAIRS = {("mask_after_softmax", "unbiased_variance")}  # two bugs planted in one solution: alike code, for review


def _regenerate_module():
    spec = importlib.util.spec_from_file_location("examples_regenerate", ROOT / "examples" / "regenerate.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


REPLAY = re.compile(r"@reproduce_failure\('([^']*)', b'[^']*'\)")


def _recorded_hypothesis():
    """The hypothesis release the committed reports were made with (their @reproduce_failure lines name it)."""
    texts = (p.read_text() for p in (ROOT / "examples" / "reports").rglob("*") if p.is_file() and p.suffix != ".npz")
    found = {m.group(1) for text in texts for m in REPLAY.finditer(text)}
    assert len(found) == 1, f"the committed reports name {sorted(found)}: regenerate them with one hypothesis release"
    return found.pop()


def _what_the_project_controls(report_json):
    """What a report says that does not depend on hypothesis's release: verdict, score and each invariant's status and points.

    Another release draws and shrinks other examples, so the counterexamples, example counts
    and replay lines differ; which invariants fail, and the score, must not.
    """
    report = json.loads(report_json)
    return (report["verdict"], report["score"], report["max_score"],
            [(inv["name"], inv["status"], inv["score"], inv["max_score"]) for inv in report["invariants"]])


FLOAT = re.compile(r"-?\d+\.\d+(?:e[-+]?\d+)?")


def _at_twelve_digits(text):
    """text with every float literal written to 12 significant digits.

    The values an implementation returned depend in their last bits on the CPU numpy runs on
    (its SIMD exp differs between machines), so the committed reports are compared past them;
    the drawn inputs sit on a grid of short binary fractions and keep every digit.
    """
    return FLOAT.sub(lambda m: f"{float(m.group()):.12g}", text)


def _sandbox_of(report_dir):
    report = json.loads((report_dir / "good_student" / "report.json").read_text())
    return report.get("sandbox", {}).get("tool"), report.get("protections")


@pytest.mark.slow
def test_example_reports_are_in_sync(tmp_path, monkeypatch):
    from invariants.gate import confine

    tool = confine.choose("auto")
    if not tool.confined:
        pytest.skip(f"P01 requires the sandbox, which this host cannot give ({tool.detail}): the examples cannot be regenerated here")
    monkeypatch.chdir(ROOT)
    out = tmp_path / "reports"
    assert _regenerate_module().regenerate(out) == 0
    expected_dir = ROOT / "examples" / "reports"
    produced = sorted(p.relative_to(out).as_posix() for p in out.rglob("*") if p.is_file())
    kept = sorted(p.relative_to(expected_dir).as_posix() for p in expected_dir.rglob("*") if p.is_file())
    assert produced == kept, "run `python examples/regenerate.py` and commit examples/reports/"
    if hypothesis.__version__ == _recorded_hypothesis() and _sandbox_of(out) == _sandbox_of(expected_dir):
        stale = [name for name in produced
                 if _at_twelve_digits((out / name).read_text()) != _at_twelve_digits((expected_dir / name).read_text())]
    else:  # under another release (or another host's sandbox: bubblewrap's version, root or not), compare what the project controls
        stale = [name for name in produced if name.endswith("report.json")
                 and _what_the_project_controls((out / name).read_text()) != _what_the_project_controls((expected_dir / name).read_text())]
    assert not stale, f"out of date: {stale}; run `python examples/regenerate.py` and commit examples/reports/"


def test_example_verdicts():
    import json

    for folder, verdict in EXPECTED_VERDICTS.items():
        report = json.loads((ROOT / "examples" / "reports" / folder / "report.json").read_text())
        assert report["verdict"] == verdict, (folder, report["reason"])
        assert report["similarity"]["reference"]["score"] < report["similarity"]["flag_above"], folder
    assert os.path.exists(ROOT / "examples" / "reports" / "class-summary.md")
    import csv

    pairs = {(row["a"], row["b"]) for row in csv.DictReader((ROOT / "examples" / "reports" / "similar-pairs.csv").open())}
    assert pairs == EXPECTED_PAIRS


@pytest.mark.parametrize("folder", ["mask_after_softmax", "unbiased_variance"])
def test_each_visible_failure_comes_with_a_repro_script_and_no_hidden_one_does(folder):
    report_dir = ROOT / "examples" / "reports" / folder
    report = json.loads((report_dir / "report.json").read_text())
    failed = [inv for inv in report["invariants"] if inv["status"] in ("failed", "error")]
    visible = {repro_stem(inv["name"]) for inv in failed if inv["visibility"] == "visible"}
    assert visible and all(inv["repro"] for inv in failed) and not any("repro_arrays" in inv for inv in report["invariants"])
    assert any(inv["visibility"] != "visible" for inv in failed)  # so that the next line means something
    assert {script.stem for script in report_dir.glob("repro_*.py")} == visible
    assert all(f"`python {stem}.py {folder}.py`" in (report_dir / "summary.md").read_text() for stem in visible)


SCRIPTS = sorted((ROOT / "examples" / "reports").glob("*/repro_*.py"))


@pytest.mark.parametrize("script", SCRIPTS, ids=[f"{s.parent.name}/{s.name}" for s in SCRIPTS])
def test_every_gate_repro_script_replays_its_failure_on_the_submission(script):
    submission = ROOT / "examples" / "submissions" / f"{script.parent.name}.py"
    done = subprocess.run([sys.executable, script.name, str(submission)], cwd=script.parent, capture_output=True, text=True, timeout=120)
    assert done.returncode == 1, done.stderr  # the failure reproduces
    assert "call 1: " in done.stdout and "violated: " in done.stdout and "hint: " in done.stdout and "REPRODUCES: " in done.stdout
