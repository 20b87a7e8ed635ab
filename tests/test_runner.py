"""run_invariant's Outcome: every way a run can end is a value with the fields the plugin, the gate and the matrix render."""

from __future__ import annotations

import sys

import numpy as np
import pytest
from hypothesis import strategies as st

import invariants.reference.numpy as ref
from invariants import REGISTRY, Implementation, all_invariants, run_invariant, runner
from invariants import hypothesis_internals as internals
from invariants.conventions import Declared
from invariants.profiles import profile_settings
from invariants.protocol import TransportLost
from invariants.registry import Invariant
from invariants.runner import STATUSES, Outcome

all_invariants()
CI = profile_settings("ci")
KNOWN_VALUES = REGISTRY["norms.layer_norm_known_values"]


def _impl(**functions):
    return Implementation.from_functions(backend="numpy", label="test functions", **functions)


def _unbiased_layer_norm(x, gain, bias, eps):
    mean = x.mean(axis=-1, keepdims=True)
    return gain * (x - mean) / np.sqrt(x.var(axis=-1, ddof=1, keepdims=True) + eps) + bias


def _invariant(check, *, requires=("softmax",), applies=None, name="test.made_up"):
    return Invariant(name, "test", "a made-up property.", "a made-up hint", requires, ("numpy", "torch"), False, check, applies)


def test_a_correct_implementation_passes_with_its_example_count():
    outcome = run_invariant(KNOWN_VALUES, _impl(layer_norm=ref.layer_norm), settings=CI)
    assert isinstance(outcome, Outcome) and outcome.status == "passed" and outcome.passed
    assert outcome.examples >= 1 and outcome.reason == f"held on {outcome.examples} examples"
    assert outcome.report == "" and outcome.examples_to_failure is None and outcome.hint == ""


def test_a_wrong_answer_is_failed_with_the_shrunk_example_the_numbers_and_the_hint():
    outcome = run_invariant(KNOWN_VALUES, _impl(layer_norm=_unbiased_layer_norm), settings=CI)
    assert outcome.status == "failed" and not outcome.passed
    assert outcome.examples_to_failure >= 1 and outcome.seconds_to_failure >= 0
    assert outcome.problem.startswith(outcome.reason) and "but should be" in outcome.reason
    assert outcome.hint == KNOWN_VALUES.hint
    assert outcome.report.startswith(f"{KNOWN_VALUES.name}: {KNOWN_VALUES.statement}\nimplementation: test functions (numpy, cpu, float64)")
    assert f"hint: {KNOWN_VALUES.hint}" in outcome.report and outcome.problem in outcome.report


def test_an_implementation_that_raises_is_an_error_that_names_the_exception_and_where():
    def broken(x, gain, bias, eps):
        return {}["missing"]

    outcome = run_invariant(KNOWN_VALUES, _impl(layer_norm=broken), settings=CI)
    assert outcome.status == "error" and not outcome.check_crashed
    assert outcome.reason.startswith("layer_norm raised KeyError: 'missing' (at test_runner.py:")


def test_a_missing_function_is_skipped_with_the_reason_and_not_declared():
    outcome = run_invariant(KNOWN_VALUES, _impl(softmax=ref.softmax), settings=CI)
    assert outcome.status == "skipped" and "does not provide layer_norm" in outcome.reason and not outcome.declared
    assert outcome.examples == 0


def test_a_skip_because_of_a_declaration_is_marked_declared():
    inv = _invariant(lambda impl, case: None, applies=lambda impl: Declared("the implementation declares X = 1"))
    outcome = run_invariant(inv, _impl(softmax=ref.softmax), settings=CI)
    assert outcome.status == "skipped" and outcome.declared and outcome.reason == "the implementation declares X = 1"


def test_a_check_that_crashes_is_an_error_marked_as_the_checks_own():
    def check(impl, case):
        case.draw(st.integers(0, 3), "n")
        raise IndexError("index 7 is out of bounds")

    outcome = run_invariant(_invariant(check), _impl(softmax=ref.softmax), settings=CI)
    assert outcome.status == "error" and outcome.check_crashed
    assert outcome.reason.startswith("the check itself raised IndexError: index 7 is out of bounds (at test_runner.py:")
    assert "  n: 0" in outcome.report  # the example it choked on, shrunk


def test_a_lost_transport_is_an_error_with_its_cause_and_stops_the_search():
    calls = []

    def check(impl, case):
        calls.append(case.draw(st.integers(0, 9), "n"))
        raise TransportLost("died", "the worker process crashed with a segmentation fault (SIGSEGV)")

    outcome = run_invariant(_invariant(check), _impl(softmax=ref.softmax), settings=CI)
    assert outcome.status == "error" and outcome.lost == "died" and len(calls) == 1
    assert outcome.reason == "the worker process crashed with a segmentation fault (SIGSEGV)"


def test_time_running_out_while_shrinking_keeps_the_counterexample_found():
    from invariants.asserts import InvariantViolation

    failures = []

    def check(impl, case):
        n = case.draw(st.integers(0, 10**6), "n")
        if failures:
            raise TransportLost("invariant_timeout", "the invariant's time limit (1 s) ran out", out_of_time=True)
        if n > 10:
            failures.append(n)
            raise InvariantViolation(f"n={n}, but should be at most 10")

    outcome = run_invariant(_invariant(check), _impl(softmax=ref.softmax), settings=CI)
    assert outcome.status == "failed" and outcome.lost is None
    assert "time ran out while shrinking" in outcome.report and outcome.reason == f"n={failures[0]}, but should be at most 10"


def test_the_shrink_limit_stops_shrinking_and_reports_the_smallest_example_so_far():
    from invariants.asserts import InvariantViolation

    def check(impl, case):
        n = case.draw(st.integers(0, 10**6), "n")
        if n > 10:
            raise InvariantViolation(f"n={n}, but should be at most 10")

    unlimited = run_invariant(_invariant(check), _impl(softmax=ref.softmax), settings=CI)
    limited = run_invariant(_invariant(check), _impl(softmax=ref.softmax), settings=CI, shrink_limit=2)
    assert unlimited.status == limited.status == "failed"
    assert unlimited.reason == "n=11, but should be at most 10"
    assert "shrinking stopped after 2 more examples" in limited.report
    assert limited.examples <= limited.examples_to_failure + 3


def test_a_nondeterministic_implementation_is_an_error_that_says_so():
    from invariants.asserts import InvariantViolation

    calls = []

    def check(impl, case):
        case.draw(st.integers(0, 3), "n")
        calls.append(1)
        if len(calls) == 1:  # wrong the first time only: the replay passes
            raise InvariantViolation("x=1, but should be 2")

    outcome = run_invariant(_invariant(check), _impl(softmax=ref.softmax), settings=CI)
    assert outcome.status == "error" and "nondeterministic" in outcome.reason


def test_the_statuses_are_the_four_documented_ones():
    assert STATUSES == ("passed", "skipped", "failed", "error")


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_a_numpy_scalar_argument_reaches_the_implementation_as_a_python_number(dtype):
    seen = []

    def layer_norm(x, gain, bias, eps):
        seen.append((type(eps), x.dtype))
        return ref.layer_norm(x, gain, bias, eps)

    impl = Implementation.from_functions(backend="numpy", dtype=dtype, layer_norm=layer_norm)
    impl.layer_norm(np.ones((1, 4)), np.ones(4), np.zeros(4), np.float64(1e-5))
    assert seen == [(float, np.dtype(dtype))]


def test_a_derandomized_run_draws_the_same_whatever_the_process_imported_before(tmp_path, monkeypatch):
    drawn = []

    def record(impl, case):
        drawn.append((case.draw(st.integers(0, 10**6), "n"), case.draw(st.floats(-1e6, 1e6), "x")))

    inv = _invariant(record)
    impl = _impl(softmax=ref.softmax)
    run_invariant(inv, impl, settings=CI)
    before, drawn[:] = list(drawn), []
    # hypothesis mixes the literals of local modules into its draws: a host's module full of them must change nothing
    literals = ", ".join(f"{n}, {n}.5" for n in range(1000, 10**6, 4999))  # under hypothesis's 1024 per module
    (tmp_path / "host_constants.py").write_text(f"VALUES = ({literals})\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    import host_constants  # noqa: F401

    try:
        run_invariant(inv, impl, settings=CI)
    finally:
        del sys.modules["host_constants"]  # so that this worker's later hypothesis runs never see its literals
    assert drawn == before and len(before) == CI.max_examples


def test_drawing_through_conjecture_data_draws_and_reports_what_data_draw_would(monkeypatch):
    # the runner's direct draw skips st.data()'s per-draw bookkeeping only: the same examples, the same shrunk counterexample
    layer_norm = REGISTRY["norms.layer_norm_agrees_with_reference"]
    direct = run_invariant(layer_norm, _impl(layer_norm=_unbiased_layer_norm), settings=CI)
    monkeypatch.setattr(internals, "draw_of", lambda data: data.draw)
    through_data = run_invariant(layer_norm, _impl(layer_norm=_unbiased_layer_norm), settings=CI)
    assert direct.status == through_data.status == "failed"
    assert (direct.examples, direct.example, direct.problem) == (through_data.examples, through_data.example, through_data.problem)


def test_without_conjecture_data_the_draw_is_st_datas_own():
    class Data:
        def draw(self, strategy, label=None):
            return (strategy, label)

    data = Data()
    assert internals.draw_of(data) == data.draw


def test_ti_direct_draws_turns_direct_draws_off_or_on_and_names_its_values():
    assert runner._engine_examples("1") == 20 and runner._engine_examples("0") is None
    with pytest.raises(ValueError, match=r"TI_DIRECT_DRAWS='yes' must be 1 \(draw directly past the engine's examples\) or 0"):
        runner._engine_examples("yes")


@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_a_failure_shows_its_example_as_the_implementation_received_it(dtype):
    """Drawn in float64, handed over rounded to the run's dtype: the report names that dtype, not float64, with the rounded values."""
    def leaky_attention(x, W_q, W_k, W_v, W_o, n_heads, causal):
        return ref.attention(x, W_q, W_k, W_v, W_o, n_heads, False)  # ignores the mask

    leaky = Implementation.from_functions(backend="numpy", dtype=dtype, label="leaky", attention=leaky_attention)
    outcome = run_invariant(REGISTRY["attention.causal_non_leakage"], leaky, settings=CI)
    shown = dict(outcome.example)
    assert outcome.status == "failed" and shown["inputs"].startswith(f"{{x: {dtype} ("), shown
    assert "float64" not in outcome.report.split("example (shrunk):")[1].split("\n" + outcome.problem.splitlines()[0])[0], outcome.report
