"""An in-process run and a gate run agree by construction: the same invariants, the same implementation, the same outcomes."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from invariants import load_implementation, run_invariant
from invariants.gate.config import load_assignment
from invariants.gate.grade import grade
from invariants.gate.stages import examples_settings

ROOT = Path(__file__).resolve().parent.parent
SUBMISSIONS = ["good_student", "mask_after_softmax.py", "unbiased_variance.py"]


def _in_process_target(name, monkeypatch):
    """The --impl target for the same code the gate loads (a folder's adapter.py imports its siblings)."""
    path = ROOT / "examples" / "submissions" / name
    if not path.is_dir():
        return str(path)
    monkeypatch.syspath_prepend(str(path))
    return f"{path / 'adapter.py'}:ADAPTER"


@pytest.mark.parametrize("submission", SUBMISSIONS)
def test_the_gate_and_an_in_process_run_give_the_same_outcomes(submission, monkeypatch):
    assignment = load_assignment(ROOT / "invariants" / "gate" / "assignments" / "p01.toml")
    assignment = dataclasses.replace(assignment, selected=[s for s in assignment.selected if not s.invariant.in_process])
    graded = grade(ROOT / "examples" / "submissions" / submission, assignment)
    impl = load_implementation(_in_process_target(submission, monkeypatch), backend=graded.submission["backend"] or "numpy", dtype=assignment.dtype)
    impl.declarations = assignment.graded_under(impl.declarations)  # the assignment's rounding, as the gate grades it
    settings = examples_settings(assignment)
    not_computing = set(graded.submission.get("degenerate") or {})
    assert submission != "good_student" or not not_computing, not_computing
    compared = 0
    for result in graded.invariants:
        if result.status in ("missing", "not_run"):
            continue
        inv = next(s.invariant for s in assignment.selected if s.name == result.name)
        outcome = run_invariant(inv, impl, settings=settings, seed=graded.seed["value"], shrink_limit=assignment.limits.shrink_examples)
        in_process_examples = outcome.examples if outcome.passed else outcome.examples_to_failure or 0
        if result.status == "vacuous":  # a pass the gate voids: one of the law's functions was not shown to compute
            assert set(inv.requires) & not_computing, result.name
        status = "passed" if result.status == "vacuous" else result.status
        assert (status, result.examples) == (outcome.status, in_process_examples), result.name
        if not outcome.passed:
            assert result.reason == outcome.reason, result.name
            same_label = result.details.replace(f"submission {Path(submission).name}", impl.label)
            assert same_label == outcome.report, result.name
        compared += 1
    assert compared >= 10
