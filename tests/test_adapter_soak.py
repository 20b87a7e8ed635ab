"""benchmarks/adapter_soak.py keeps each outcome as it ends, resumes from what its log holds, and reports a run that died."""

import importlib.util
import json
from pathlib import Path

import pytest

from invariants import all_invariants

_SPEC = importlib.util.spec_from_file_location("adapter_soak", Path(__file__).parent.parent / "benchmarks" / "adapter_soak.py")
adapter_soak = importlib.util.module_from_spec(_SPEC)
_SPEC.loader.exec_module(adapter_soak)

EVERY_INVARIANT = {inv.name for inv in all_invariants()}


def _logged_names(log):
    return [json.loads(line)["invariant"] for line in log.read_text().splitlines()]


def test_log_holds_every_invariant_once(tmp_path):
    log = tmp_path / "run.jsonl"
    outcomes = adapter_soak.soak("reference.numpy", "float64", 2, log)
    assert sorted(_logged_names(log)) == sorted(EVERY_INVARIANT)
    assert [o["invariant"] for o in outcomes] == _logged_names(log)
    assert {o["status"] for o in outcomes} <= {"passed", "skipped"}


def test_resume_runs_only_what_the_log_lacks(tmp_path):
    log = tmp_path / "run.jsonl"
    adapter_soak.soak("reference.numpy", "float64", 2, log)
    lines = log.read_text().splitlines(keepends=True)
    kept, lost = lines[:-3], [json.loads(line)["invariant"] for line in lines[-3:]]  # as if the run died three before the end
    log.write_text("".join(kept))
    outcomes = adapter_soak.soak("reference.numpy", "float64", 2, log, resume=True)
    assert _logged_names(log)[len(kept):] == lost  # only the three lost ones ran again
    assert sorted(o["invariant"] for o in outcomes) == sorted(EVERY_INVARIANT)


def test_a_run_that_dies_is_an_error_outcome_and_is_not_logged(tmp_path):
    log = tmp_path / "run.jsonl"
    outcomes = adapter_soak.soak("no_such_module_anywhere", "float64", 2, log)
    assert [o["status"] for o in outcomes] == ["error"]
    assert "no_such_module_anywhere" in outcomes[0]["report"]
    assert log.read_text() == ""


def test_resume_needs_a_log():
    with pytest.raises(SystemExit) as exit_:
        adapter_soak.main(["--resume"])
    assert exit_.value.code == 2
