"""Answers that round like the reference (invariants.gate.bitwise): evidence of a copy that does not rest on its source.

An obfuscated copy of the reference (compressed, encoded, executed at import) shows no similarity
in its code; its answers are the reference's to the bit wherever equally correct code rounds
otherwise, and that is flagged for staff. Independent solutions are not flagged.
"""

from __future__ import annotations

import csv
import dataclasses
import importlib.util
import io
import json
from pathlib import Path

import numpy as np
import pytest

import invariants.reference.numpy as reference
from invariants.gate import bitwise
from invariants.gate.batch import row_from_report, write_summary
from invariants.gate.config import load_assignment
from invariants.gate.grade import grade
from invariants.gate.reports import write_reports

ROOT = Path(__file__).resolve().parents[1]
FIXTURES = Path(__file__).parent / "fixtures"
HONEST = [FIXTURES / "honest" / "second_student.py", FIXTURES / "honest" / "numpy_package"]


def _builder():
    spec = importlib.util.spec_from_file_location("obfuscated_reference_build", FIXTURES / "hostile" / "obfuscated_reference" / "build.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def p01():
    """P01 as shipped, minus the sandbox requirement, at 20 examples per invariant (the figures in docs/gate.md are at 60)."""
    return dataclasses.replace(load_assignment(ROOT / "invariants" / "gate" / "assignments" / "p01.toml"), require=(), max_examples=20)


def test_a_call_is_discriminating_only_where_extended_precision_rounds_otherwise():
    versions = [lambda args: reference.softmax(*args)]
    exact = (np.zeros((2, 4)),)  # every answer 0.25, exactly: no order of operations rounds it otherwise
    assert bitwise.judge_call(versions, exact, reference.softmax(*exact)) == (False, False)
    x = (np.random.default_rng(0).standard_normal((3, 7)) * 3,)
    assert bitwise.judge_call(versions, x, reference.softmax(*x)) == (True, True)
    one_ulp = np.nextafter(reference.softmax(*x), 1.0)  # as correct, and not the reference's bits
    assert bitwise.judge_call(versions, x, one_ulp) == (True, False)
    assert bitwise.judge_call(versions, x, reference.softmax(*x).astype(np.float32)) == (True, False)


def test_an_obfuscated_copy_of_the_reference_is_flagged_by_its_answers(p01, tmp_path):
    copy = _builder().write(tmp_path / "obfuscated")
    result = grade(copy, p01)
    assert result.similarity["reference"]["score"] < 0.05  # its source shows nothing
    evidence = result.bitwise
    assert evidence["flag"] and evidence["share"] == 1.0 and evidence["discriminating"] >= bitwise.MIN_CALLS, evidence
    assert all(f["bitwise_equal"] == f["discriminating"] for f in evidence["functions"].values())
    write_reports(result, tmp_path / "reports")
    assert json.loads((tmp_path / "reports" / "report.json").read_text())["bitwise"] == evidence
    write_summary([row_from_report(tmp_path / "reports")], tmp_path / "class", p01.name)
    row = next(csv.DictReader(io.StringIO((tmp_path / "class" / "class-summary.csv").read_text())))
    assert row["bitwise_share"] == "1.000" and row["bitwise_flag"] == "yes" and int(row["bitwise_calls"]) == evidence["discriminating"]
    assert f"100% of {evidence['discriminating']} calls, flagged" in (tmp_path / "class" / "class-summary.md").read_text()


@pytest.mark.parametrize("submission", HONEST, ids=lambda p: p.stem)
def test_independent_honest_solutions_are_not_flagged(submission, p01):
    if not submission.exists():
        pytest.skip(f"{submission.name} is not in this checkout")
    evidence = grade(submission, p01).bitwise
    assert evidence["discriminating"] >= bitwise.MIN_CALLS and not evidence["flag"], evidence
    assert evidence["share"] < 0.8, evidence
