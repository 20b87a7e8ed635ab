"""The example submissions' reports in examples/reports/ are what the gate produces today."""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
EXPECTED_VERDICTS = {  # report folder: verdict
    "good_student": "passed",
    "mask_after_softmax": "failed",
    "unbiased_variance": "failed",
    "missing_functions": "not_gradable",
}


def _regenerate_module():
    spec = importlib.util.spec_from_file_location("examples_regenerate", ROOT / "examples" / "regenerate.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.slow
def test_example_reports_are_in_sync(tmp_path, monkeypatch):
    monkeypatch.chdir(ROOT)
    out = tmp_path / "reports"
    assert _regenerate_module().regenerate(out) == 0
    expected_dir = ROOT / "examples" / "reports"
    produced = sorted(p.relative_to(out).as_posix() for p in out.rglob("*") if p.is_file())
    kept = sorted(p.relative_to(expected_dir).as_posix() for p in expected_dir.rglob("*") if p.is_file())
    assert produced == kept, "run `python examples/regenerate.py` and commit examples/reports/"
    stale = [name for name in produced if (out / name).read_text() != (expected_dir / name).read_text()]
    assert not stale, f"out of date: {stale}; run `python examples/regenerate.py` and commit examples/reports/"


def test_example_verdicts():
    import json

    for folder, verdict in EXPECTED_VERDICTS.items():
        report = json.loads((ROOT / "examples" / "reports" / folder / "report.json").read_text())
        assert report["verdict"] == verdict, (folder, report["reason"])
    assert os.path.exists(ROOT / "examples" / "reports" / "class-summary.md")
