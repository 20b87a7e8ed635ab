"""A failure is data from the assert to every report (issue 35 §1): fields carried unchanged, words rendered only at the edge.

Text a student controls (an exception's message, here one that imitates the suite's grammar, spans lines and carries
Markdown, HTML and CI commands) reaches the Outcome, the plugin's record, the HTML report and every gate report without
being parsed, and rewording every message the suite writes changes no figure and no diagnosis.
"""

from __future__ import annotations

import dataclasses
import html
import json

import numpy as np
import pytest
from hypothesis import settings

import invariants.asserts as asserts
import invariants.runner as runner
from invariants.diagnosis import likely_bug, likely_bugs
from invariants.gate import reports
from invariants.gate.result import FAILED, GradeResult, InvariantResult
from invariants.htmlreport import load_suite, render
from invariants.mutants import Mutant, all_mutants
from invariants.plugin import JSON_FORMAT, JSON_VERSION, _JsonRecord, outcome_properties
from invariants.protocol import ImplementationError
from invariants.registry import REGISTRY, all_invariants
from invariants.tolerance import Tolerance

all_invariants()
SETTINGS = settings(max_examples=10, derandomize=True, database=None, deadline=None, print_blob=True)
EVIL = ("y=1, but should be 2 [softmax(x)] llama_decode refused chunks=[6] at window=2 atol=1 + rtol=1 float32 rounding size "
        "## <script>alert(1)</script> | a | `tick` [link](http://x) ::error::x\n  worst at index (0,): got 1, expected 2\nhint: x")
SHOWN = EVIL.partition("\n")[0]  # the boundary quotes the first line of an implementation's exception (invariants.protocol)


def _raising(message):
    """The numpy reference whose softmax raises ValueError(message): a student's exception, in the student's words."""

    def softmax(x, axis=-1):
        raise ValueError(message)

    return Mutant("student.raises", "raises", "softmax.softmax_rows_sum_to_one", "numpy", "softmax", softmax).implementation()


def _run(impl, names, settings=SETTINGS):
    return [runner.run_invariant(REGISTRY[name], impl, settings=settings) for name in names]


SOFTMAX = ("softmax.softmax_rows_sum_to_one", "softmax.softmax_shift_invariance", "attention.causal_non_leakage")


@pytest.fixture(scope="module")
def evil_and_plain():
    return _run(_raising(EVIL), SOFTMAX), _run(_raising("plain"), SOFTMAX)


def _quads(outcomes):
    return [(o.invariant, o.status, o.reason, o.measured) for o in outcomes]


def test_a_students_words_change_no_figure_and_no_diagnosis(evil_and_plain):
    evil, plain = evil_and_plain
    assert [o.status for o in evil] == [o.status for o in plain] and evil[0].status == "error"
    assert SHOWN in evil[0].reason and SHOWN in evil[0].problem  # quoted where it is shown
    assert [o.measured for o in evil] == [o.measured for o in plain]  # "refused chunks=", "atol=", "float32 rounding size" read nowhere
    assert not evil[0].measured.get("refused") and "check" not in evil[0].measured
    bug, plain_bug = likely_bug(_quads(evil))[0], likely_bug(_quads(plain))[0]
    assert (bug.invariant, bug.measured) == (plain_bug.invariant, plain_bug.measured) and "refused an input" not in bug.cause


def _suite_record(outcomes, tmp_path):
    """The plugin's --invariants-json record of these outcomes, as _JsonRecord writes it from the tests' user properties."""
    registry = {inv.name: inv for inv in all_invariants()}
    entries = [_JsonRecord(None, None).entry(o.invariant, {"call": ("failed", dict(outcome_properties(o)), o.report)}, registry)
               for o in outcomes]
    path = tmp_path / "record.json"
    path.write_text(json.dumps({"format": JSON_FORMAT, "version": JSON_VERSION, "implementation": "student.py", "target": "student.py",
                                "dtype": "float64", "invariants": entries}), encoding="utf-8")
    return entries, path


def test_the_plugin_record_and_the_html_report_carry_the_parts_unchanged(evil_and_plain, tmp_path):
    evil, _ = evil_and_plain
    entries, path = _suite_record(evil, tmp_path)
    for entry, outcome in zip(entries, evil, strict=True):
        assert (entry["problem"], entry["measured"], entry["notes"]) == (outcome.problem, outcome.measured, list(outcome.notes))
        assert entry["example"] == [list(pair) for pair in outcome.example] and entry["reason"] == outcome.reason
    report = load_suite([path])
    card = report.cards[0]
    assert card.text.problem == evil[0].problem and card.text.example == evil[0].example and card.text.notes == evil[0].notes
    assert card.text.hint == REGISTRY[SOFTMAX[0]].hint and card.text.headline == f"{SOFTMAX[0]}: {REGISTRY[SOFTMAX[0]].statement}"
    assert report.diagnoses[0] == [line.strip() for line in likely_bugs(_quads(evil))]
    page = render(report)
    assert "<script>alert(1)</script>" not in page and html.escape(SHOWN) in page


def _graded(outcomes):
    rows = [InvariantResult(o.invariant, REGISTRY[o.invariant].component, REGISTRY[o.invariant].statement, REGISTRY[o.invariant].hint,
                            "visible", 1.0, status=o.status, reason=o.reason, details=o.report, measured=o.measured) for o in outcomes]
    return GradeResult({"name": "a", "path": "a.toml", "sha256": "0" * 64, "backend": "numpy", "dtype": "float64", "device": "cpu",
                        "profile": "ci", "max_examples": 30}, {"source": "student.py", "sha256": "0" * 64, "backend": "numpy"},
                       verdict=FAILED, reason="1 invariant failed", max_score=len(rows), invariants=rows)


def test_every_gate_report_quotes_the_words_and_diagnoses_from_the_figures(evil_and_plain):
    evil, plain = evil_and_plain
    result, same = _graded(evil), _graded(plain)
    assert reports.diagnosis(result) == [line.replace(plain[0].reason, evil[0].reason) for line in reports.diagnosis(same)]
    data = json.loads(reports.to_json(result))
    assert [inv["measured"] for inv in data["invariants"]] == [o.measured for o in evil]
    for text in (reports.to_markdown(result), reports.to_junit(result), reports.to_gradescope(result), reports.to_terminal(result)):
        assert "alert(1)" in text  # quoted, escaped for its format (tests/test_report_safety.py), never read


def _reworded(measured):
    """Every field, worded otherwise: a different grammar, no phrase of the suite's."""
    return " / ".join(f"{key.upper()}: {value}" for key, value in sorted(measured.items()))


CASES = {"decoder.window_one_too_wide": ("masking.window_key_count", "gqa.agrees_with_reference"),
         "attention.softmax_over_queries": ("attention.weights_are_distributions", "attention.causal_weights_pattern"),
         "attention.mask_transposed": ("attention.causal_weights_pattern", "attention.causal_non_leakage")}


def test_rewording_every_message_changes_no_diagnosis(monkeypatch):
    """The assertions' grammar, the implementation's errors and the failure report all reworded: the same figures, the same likely bug."""
    zoo = {m.name: m for m in all_mutants()}

    def run_all():
        return {name: _run(zoo[name].implementation(), laws, SETTINGS) for name, laws in CASES.items()}

    before = run_all()
    monkeypatch.setattr(asserts, "render_violation", _reworded)
    monkeypatch.setattr(ImplementationError, "__str__", lambda self: "THE CODE SAID NO: " + " ".join(reversed(self.args[0].split())))
    monkeypatch.setattr(runner, "format_failure", lambda inv, impl, problem, example, notes=(): f"REPORT {problem} EXAMPLE {example}")
    after = run_all()
    for name in CASES:
        assert [o.reason for o in before[name]] != [o.reason for o in after[name]], name  # reworded indeed
        assert [o.measured for o in before[name]] == [o.measured for o in after[name]], name
        lines_before, lines_after = likely_bug(_quads(before[name]))[0], likely_bug(_quads(after[name]))[0]
        assert dataclasses.astuple(lines_before) == dataclasses.astuple(lines_after), name


def test_a_violation_is_its_fields_and_its_message_their_rendering():
    with pytest.raises(asserts.InvariantViolation) as failure:
        asserts.assert_close(np.array([1.0, 2.0]), np.array([1.0, 2.5]), "y", Tolerance(1e-7, 1e-7, "float64"), "f(x)", law_figure=3)
    m = failure.value.measured
    assert (m["check"], m["what"], m["call"], m["worst_index"], m["worst_got"], m["worst_expected"], m["law_figure"]) == (
        "close", "y", "f(x)", [1], 2.0, 2.5, 3)
    assert str(failure.value) == asserts.render_violation(m)
