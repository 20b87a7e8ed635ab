"""The balance loss L = n·Σ f_i·P_i: L >= 1 is false, and the true bounds 1/(k·n) <= L <= n/k hold.

Proved with the reference on DESIGN's lopsided batches (near-uniform tokens leaning to some
experts, and tokens sure of others), then searched with hypothesis for anything below 1/(k·n).
Why the bounds hold: f_i <= 1/k and Σ P_i = 1 give L <= n/k. Each token's first choice a has
p_a >= 1/n, and an expert that is the first choice of m_a tokens fills at least m_a slots, so
L = n/(k·N²)·Σ_t Σ_i count_i·p_ti >= Σ_a m_a²/(k·N²) >= 1/(k·n) (Cauchy-Schwarz, Σ m_a = N).
"""

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import invariants.reference.numpy as ref_numpy
from invariants.strategies.moe import moe_shapes, router_logits

LEAN = 1e-9  # near-uniform tokens lean to their expert by this much
SURE = 40.0  # a token is sure of an expert: exp(-40) ≈ 4e-18 is below float64's rounding of 1
SEARCH = settings(max_examples=1000, database=None, deadline=None, suppress_health_check=list(HealthCheck))


def _references():
    """The references to check, as a list (pytest deprecates generators in parametrize): torch where installed."""
    try:
        import invariants.reference.torch as ref_torch
    except ImportError:
        return [pytest.param(ref_numpy, id="numpy")]
    return [pytest.param(ref_numpy, id="numpy"), pytest.param(ref_torch, id="torch")]


def _loss(ref, logits, k):
    """L from the reference `ref` (numpy or torch), in float64."""
    if ref.BACKEND == "torch":
        import torch

        return float(ref.load_balancing_loss(torch.tensor(logits, dtype=torch.float64), k))
    return float(ref.load_balancing_loss(logits, k))


def two_experts():
    """n = 2: three tokens near-uniform leaning to expert 0, one sure of expert 1 -> L = 7/8."""
    leaning = [[LEAN, 0.0]] * 3  # p ≈ (1/2, 1/2), routed to 0
    sure = [[-SURE, 0.0]]  # p ≈ (0, 1), routed to 1
    return np.array(leaning + sure)  # f = (3/4, 1/4), P = (3/8, 5/8): L = 2·(9/32 + 5/32) = 7/8


def spread_onto_idle_experts(n, idle):
    """n experts: one token per busy expert j, near-uniform over {j} and the `idle` last experts, which no token picks.

    f = 1/(n - idle) on each busy expert, whose P is 1/((idle + 1)(n - idle)): L = n/((idle + 1)(n - idle)).
    """
    busy = n - idle
    logits = np.full((busy, n), -SURE)  # (busy, n)
    logits[:, busy:] = 0.0  # the idle experts share each token's probability ...
    logits[np.arange(busy), np.arange(busy)] = LEAN  # ... and the busy one is just ahead
    return logits


LOPSIDED = [  # (logits, k, the exact value L approaches)
    pytest.param(two_experts(), 1, 7 / 8, id="n=2,k=1->7/8"),
    pytest.param(spread_onto_idle_experts(4, idle=1), 1, 2 / 3, id="n=4,k=1->2/3"),
    pytest.param(spread_onto_idle_experts(8, idle=3), 1, 0.4, id="n=8,k=1->0.4"),
]


@pytest.mark.parametrize("ref", _references())
@pytest.mark.parametrize("logits, k, value", LOPSIDED)
def test_balance_loss_below_one_on_lopsided_batches(ref, logits, k, value):
    L = _loss(ref, logits, k)
    assert L == pytest.approx(value, abs=1e-8)
    assert L < 1, "L >= 1 is false: an invariant asserting it fails correct code"


@pytest.mark.parametrize("ref", _references())
@pytest.mark.parametrize("logits, k, value", LOPSIDED)
@pytest.mark.parametrize("repeats", [2, 5])
def test_repeating_the_pattern_keeps_the_value(ref, logits, k, value, repeats):
    batch = np.random.default_rng(repeats).permutation(np.tile(logits, (repeats, 1)))  # (repeats·N, n), shuffled
    assert _loss(ref, batch, k) == pytest.approx(_loss(ref, logits, k), abs=1e-12)


@pytest.mark.parametrize("logits, k, value", LOPSIDED)
def test_the_true_bounds_hold_on_the_lopsided_batches(logits, k, value):
    n = logits.shape[-1]
    assert 1 / (k * n) <= ref_numpy.load_balancing_loss(logits, k) <= n / k


@pytest.mark.parametrize("n, k", [(2, 1), (4, 1), (4, 2), (8, 2), (8, 8)])
def test_the_upper_bound_is_reached_when_every_token_picks_the_same_k_experts_with_all_its_probability(n, k):
    logits = np.full((5, n), -SURE)
    logits[:, :k] = 0.0  # every token: the same k experts, probability 1/k each
    assert ref_numpy.load_balancing_loss(logits, k) == pytest.approx(n / k, rel=1e-12)


@pytest.mark.parametrize("n", [1, 2, 4, 8])
def test_all_equal_logits_give_exactly_one_for_every_k(n):
    for k in range(1, n + 1):
        assert ref_numpy.load_balancing_loss(np.zeros((3, n)), k) == pytest.approx(1.0, abs=1e-15)


@SEARCH
@given(st.data())
def test_no_generated_batch_goes_below_the_lower_bound(data):
    shape = data.draw(moe_shapes(max_tokens=12))
    patterns = data.draw(st.sampled_from([None, ("leaning", "confident")]))
    logits = data.draw(router_logits(shape.tokens, shape.experts, max_logit=8.0, patterns=patterns))
    n, k = shape.experts, shape.k
    L = ref_numpy.load_balancing_loss(logits, k)
    first_choices = np.bincount(ref_numpy.top_k_indices(logits, 1).ravel(), minlength=n)  # m_a, summing to N
    assert np.sum(first_choices**2) / (k * shape.tokens**2) - 1e-12 <= L  # the proof's middle step
    assert 1 / (k * n) - 1e-12 <= L <= n / k + 1e-12
