"""Direct draws (the soak past hypothesis's engine): hypothesis replays every example to the same values, and a failure found there is shrunk."""

from __future__ import annotations

import hashlib
import random

import numpy as np
import pytest
from hypothesis import settings as hypothesis_settings
from hypothesis import strategies as st

import invariants.reference.numpy as ref
from invariants import Implementation, all_invariants, load_implementation, run_invariant, runner
from invariants import hypothesis_internals as internals
from invariants.asserts import InvariantViolation
from invariants.profiles import profile_settings
from invariants.registry import Invariant
from invariants.runner import Case, InvariantSkipped

pytestmark = pytest.mark.skipif(not internals.AVAILABLE, reason=f"this hypothesis lacks the internals direct draws use: {internals.MISSING}")
REFERENCE = load_implementation("reference.numpy")
THOROUGH = profile_settings("thorough")


def _digest(value, into):
    if isinstance(value, np.ndarray):
        into.update(f"{value.dtype}{value.shape}".encode() + np.ascontiguousarray(value).tobytes())
    elif isinstance(value, dict):
        for key in value:
            into.update(repr(key).encode())
            _digest(value[key], into)
    elif isinstance(value, (list, tuple)):
        into.update(f"{type(value).__name__}{len(value)}".encode())
        for item in value:
            _digest(item, into)
    else:
        into.update(repr(value).encode())


def _run(inv, data):
    """The values one example of `inv` draws from `data`, as a digest of the Case."""
    case = Case(lambda strategy, label: data.draw(strategy))
    REFERENCE.calls = case.calls
    try:
        with internals.build_context(data):
            inv(REFERENCE, case)
    finally:
        REFERENCE.calls = None
    digest = hashlib.sha256()
    _digest(case.drawn, digest)
    return digest.hexdigest()


@pytest.mark.parametrize("inv", [inv for inv in all_invariants() if not inv.skip_reason(REFERENCE)], ids=lambda inv: inv.name)
def test_hypothesis_replays_every_direct_draw_to_the_same_values(inv):
    rng = random.Random(inv.name)
    for _ in range(15):
        data = internals.DirectData(rng)
        drawn = _run(inv, data)
        replayed = internals.ConjectureData.for_choices(data.recorded)  # hypothesis's own, replaying the recorded choices
        assert _run(inv, replayed) == drawn
        assert replayed.choices == tuple(data.recorded)


def test_a_bytes_choice_has_hypothesis_s_length_law():
    """Lengths drawn directly (one uniform, inverted) follow the law of hypothesis's own ConjectureData (its average 64 for 32 to 256)."""
    ours = np.array([len(internals.DirectData(random.Random(i)).draw_bytes(32, 256)) for i in range(10_000)])
    theirs = np.array([len(internals.ConjectureData(random=random.Random(10**6 + i)).draw_bytes(32, 256)) for i in range(10_000)])
    assert ours.min() == theirs.min() == 32 and ours.max() <= 256
    assert abs(ours.mean() - theirs.mean()) < 2.0, (ours.mean(), theirs.mean())  # about 4 standard errors of the difference (std 32, 10,000 each)
    assert np.abs(np.percentile(ours, [25, 50, 75, 95]) - np.percentile(theirs, [25, 50, 75, 95])).max() <= 3
    assert abs((ours == 32).mean() - (theirs == 32).mean()) < 0.01  # the first stop: 1 - p_continue, about 3%
    assert len(internals.DirectData(random.Random(0)).draw_bytes(5, 5)) == 5


@pytest.mark.parametrize(("low", "high"), [(0, 1), (1, 128), (-5, 5), (3, 3), (0, 2**32 - 1), (-(2**70), 2**70), (10**20, 10**20 + 5)])
def test_an_integer_choice_is_what_hypothesis_s_law_draws_from_the_same_random_state(low, high):
    """The CDF ends cached per range change nothing: the same random() calls give the same integers as hypothesis's own provider."""
    ours, theirs = internals.DirectData(random.Random(7)).provider, internals.DirectData(random.Random(7)).provider
    drawn = [ours._draw_integer_from_distribution(low, high) for _ in range(500)]
    assert drawn == [internals.HypothesisProvider._draw_integer_from_distribution(theirs, low, high) for _ in range(500)]
    assert all(low <= n <= high for n in drawn)


def test_a_mapped_strategy_drawn_directly_retries_a_rejected_value_as_hypothesis_does():
    """Three tries, then the draw is rejected, as in MappedStrategy.do_draw."""
    tries = []

    def reject(n):
        tries.append(n)
        raise internals.UnsatisfiedAssumption()

    with pytest.raises(internals.UnsatisfiedAssumption):
        internals.DirectData(random.Random(0)).draw(st.integers(0, 9).map(reject))
    assert len(tries) == 3


def _impl():
    return Implementation.from_functions(backend="numpy", label="test functions", softmax=ref.softmax)


def _invariant(check):
    return Invariant("test.direct", "test", "a made-up property.", "a made-up hint", ("softmax",), ("numpy", "torch"), False, check, None)


def _above_500(impl, case):
    n = case.draw(st.integers(0, 1000), "n")
    if n >= 500:
        raise InvariantViolation(f"n={n}, but should be below 500")


def test_a_failure_found_by_a_direct_draw_is_replayed_and_shrunk_by_hypothesis():
    # the engine runs one example (the simplest, n=0); direct draws find the rest, hypothesis shrinks to the boundary
    outcome = run_invariant(_invariant(_above_500), _impl(), settings=hypothesis_settings(THOROUGH, max_examples=2000), seed=3,
                            engine_examples=1)
    assert outcome.status == "failed" and outcome.reason == "n=500, but should be below 500"
    assert outcome.examples_to_failure > 1 and outcome.example == (("n", "500"),)
    assert "reproduce_failure" in outcome.report


def test_the_examples_asked_for_are_run_engine_and_direct_together():
    outcome = run_invariant(_invariant(lambda impl, case: case.draw(st.integers(0, 10**6), "n")), _impl(),
                            settings=hypothesis_settings(THOROUGH, max_examples=1500), seed=1, engine_examples=300)
    assert outcome.status == "passed" and outcome.examples == 1500


def test_a_search_that_runs_out_of_inputs_draws_nothing_more():
    outcome = run_invariant(_invariant(lambda impl, case: case.draw(st.integers(0, 3), "n")), _impl(),
                            settings=hypothesis_settings(THOROUGH, max_examples=2000), seed=1, engine_examples=100)
    assert outcome.status == "passed" and outcome.examples == 4


def test_direct_draws_stop_once_they_only_repeat_earlier_examples():
    # 300 inputs: more than the engine's 100 examples, far fewer than the 20,000 asked for
    drawn = set()
    outcome = run_invariant(_invariant(lambda impl, case: drawn.add(case.draw(st.integers(0, 299), "n"))), _impl(),
                            settings=hypothesis_settings(THOROUGH, max_examples=20_000), seed=1, engine_examples=100)
    assert outcome.status == "passed" and len(drawn) == 300
    assert 300 + runner.DIRECT_REPEATS_TO_STOP <= outcome.examples < 20_000


def test_a_failure_that_does_not_come_back_on_replay_is_called_nondeterministic():
    calls = []

    def flaky(impl, case):
        case.draw(st.integers(0, 10**6), "n")
        calls.append(1)
        if len(calls) == 20:  # a direct draw fails once; hypothesis's replay of it passes
            raise InvariantViolation("x=1, but should be 2")

    outcome = run_invariant(_invariant(flaky), _impl(), settings=hypothesis_settings(THOROUGH, max_examples=200), seed=1,
                            engine_examples=10)
    assert outcome.status == "error" and "nondeterministic" in outcome.reason
    assert "found by a direct draw" in outcome.report and "x=1, but should be 2" in outcome.problem


def test_a_skip_raised_during_direct_draws_is_a_skip():
    def skips_late(impl, case):
        if case.draw(st.integers(0, 10**6), "n") > 900_000:
            raise InvariantSkipped("not for this one")

    outcome = run_invariant(_invariant(skips_late), _impl(), settings=hypothesis_settings(THOROUGH, max_examples=3000), seed=2,
                            engine_examples=1)
    assert outcome.status == "skipped" and outcome.reason == "not for this one"


def test_a_derandomized_search_draws_the_same_directly_every_time():
    seen = []

    def record(impl, case):
        seen.append(case.draw(st.integers(0, 10**6), "n"))

    derandomized = hypothesis_settings(profile_settings("ci"), max_examples=400)
    run_invariant(_invariant(record), _impl(), settings=derandomized, engine_examples=100)
    first, seen[:] = list(seen), []
    run_invariant(_invariant(record), _impl(), settings=derandomized, engine_examples=100)
    assert seen == first and len(first) == 400


def test_a_lost_transport_during_direct_draws_stops_the_search_without_a_replay():
    from invariants.protocol import TransportLost

    calls = []

    def dies_late(impl, case):
        calls.append(case.draw(st.integers(0, 10**6), "n"))
        if len(calls) == 30:
            raise TransportLost("died", "the worker process crashed with a segmentation fault (SIGSEGV)")

    outcome = run_invariant(_invariant(dies_late), _impl(), settings=hypothesis_settings(THOROUGH, max_examples=200), seed=1,
                            engine_examples=10)
    assert outcome.status == "error" and outcome.lost == "died" and len(calls) == 30


def test_engine_examples_must_be_a_count_or_none():
    with pytest.raises(ValueError, match="engine_examples=0 must be a whole number of at least 1"):
        run_invariant(_invariant(_above_500), _impl(), settings=THOROUGH, engine_examples=0)


def test_a_check_that_draws_nothing_runs_once():
    calls = []
    outcome = run_invariant(_invariant(lambda impl, case: calls.append(1)), _impl(), settings=hypothesis_settings(THOROUGH, max_examples=300),
                            seed=1, engine_examples=1)
    assert outcome.status == "passed" and len(calls) == outcome.examples <= 3


def test_the_shrink_limit_holds_for_a_failure_found_by_a_direct_draw():
    outcome = run_invariant(_invariant(_above_500), _impl(), settings=hypothesis_settings(THOROUGH, max_examples=2000), seed=3,
                            engine_examples=1, shrink_limit=0)
    assert outcome.status == "failed" and "shrinking stopped after 0 more examples" in outcome.report
    assert int(outcome.reason.split(",")[0].removeprefix("n=")) >= 500


def test_settings_without_a_shrink_phase_replay_the_direct_failure_unshrunk():
    from hypothesis import Phase

    detection = hypothesis_settings(THOROUGH, max_examples=2000, phases=(Phase.explicit, Phase.reuse, Phase.generate))
    outcome = run_invariant(_invariant(_above_500), _impl(), settings=detection, seed=3, engine_examples=1)
    assert outcome.status == "failed" and outcome.reason != "n=500, but should be below 500"
    assert outcome.examples <= outcome.examples_to_failure + 2  # hypothesis replays it, and once more to report it: no shrinking
