"""The mixture-of-experts strategies: argument checks, exact grids, and the edge cases they must generate."""

import math

import numpy as np
import pytest
from hypothesis import HealthCheck, find, given, settings
from hypothesis import strategies as st

import invariants.reference.numpy as ref
from invariants import REGISTRY, Implementation, all_invariants, run_invariant
from invariants.profiles import profile_settings
from invariants.strategies._validation import InvalidArgument
from invariants.strategies.moe import LOGIT_STEP, moe_params, moe_shapes, moe_tokens, router_logits, uniform_mean_router_logits

all_invariants()
SEARCH = settings(max_examples=2000, database=None, deadline=None, suppress_health_check=list(HealthCheck))
PROPERTY = settings(max_examples=100, database=None, deadline=None, suppress_health_check=list(HealthCheck))

BAD_ARGUMENTS = [  # (strategy, positional, keyword, text the message must contain)
    (moe_shapes, (), dict(min_tokens=0), "min_tokens=0"),
    (moe_shapes, (), dict(min_tokens=3, max_tokens=2), "min_tokens=3 is larger than max_tokens=2"),
    (moe_shapes, (), dict(max_experts=0), "max_experts=0"),
    (moe_shapes, (), dict(min_k=0), "min_k=0"),
    (moe_shapes, (), dict(min_k=1.5), "min_k=1.5"),
    (moe_shapes, (), dict(min_k=3, max_k=2), "min_k=3 is larger than max_k=2"),
    (moe_shapes, (), dict(min_k=9, max_experts=8), "min_k=9 is larger than max_experts=8"),
    (moe_shapes, (), dict(max_d=17), "max_d=17"),
    (router_logits, (0, 4), {}, "n_tokens=0"),
    (router_logits, (2, 0), {}, "n_experts=0"),
    (router_logits, (2, 4), dict(max_logit=0), "max_logit=0"),
    (router_logits, (2, 4), dict(max_logit=9.0), "max_logit=9.0"),
    (router_logits, (2, 4), dict(max_logit=math.nan), "max_logit=nan"),
    (router_logits, (2, 8), dict(max_logit=0.25, ties=False), "max_logit=0.25 leaves 5 values"),
    (router_logits, (2, 4), dict(ties="yes"), "ties='yes'"),
    (router_logits, (2, 4), dict(patterns="zero"), "patterns='zero'"),
    (router_logits, (2, 4), dict(patterns=()), "patterns=()"),
    (router_logits, (2, 4), dict(patterns=("zero",), ties=False), "patterns=('zero',)"),
    (uniform_mean_router_logits, (0,), {}, "n_experts=0"),
    (uniform_mean_router_logits, (4,), dict(min_orbits=2, max_orbits=1), "min_orbits=2 is larger than max_orbits=1"),
    (uniform_mean_router_logits, (4,), dict(max_logit=-1.0), "max_logit=-1.0"),
    (moe_tokens, (0, 4), {}, "n_tokens=0"),
    (moe_tokens, (2, 17), {}, "d_model=17"),
    (moe_params, (32, 2), {}, "d_model=32"),
    (moe_params, (4, 0), {}, "n_experts=0"),
    (moe_params, (4, 2), dict(d_ff=0), "d_ff=0"),
    (moe_params, (4, 2), dict(min_scale=-1.0), "min_scale=-1.0"),
    (moe_params, (4, 2), dict(min_scale=2.0, max_scale=1.0), "min_scale=2.0 is larger than max_scale=1.0"),
    (moe_params, (4, 2), dict(expert_ffn="relu"), "expert_ffn='relu' is not one of 'gelu', 'swiglu'"),
]


@pytest.mark.parametrize("strategy, args, kwargs, text", BAD_ARGUMENTS, ids=lambda v: v if isinstance(v, str) else None)
def test_bad_arguments_are_refused_with_a_message_naming_them(strategy, args, kwargs, text):
    with pytest.raises(InvalidArgument) as error:
        strategy(*args, **kwargs)
    assert text in str(error.value)


def _boundary_tie(logits, k):
    ordered = -np.sort(-logits, axis=-1)
    return k < logits.shape[-1] and bool(np.any(ordered[:, k - 1] == ordered[:, k]))


@st.composite
def routings(draw, **logit_options):
    shape = draw(moe_shapes())
    return draw(router_logits(shape.tokens, shape.experts, **logit_options)), shape.k


def test_edge_shapes_are_generated():
    find(moe_shapes(), lambda s: s.experts == 1, settings=SEARCH)
    find(moe_shapes(), lambda s: s.k == s.experts > 1, settings=SEARCH)
    find(moe_shapes(), lambda s: s.k == 1 < s.experts, settings=SEARCH)
    find(moe_shapes(), lambda s: 1 < s.k < s.experts, settings=SEARCH)


def test_all_zero_rows_and_ties_at_the_top_k_boundary_are_generated():
    find(router_logits(4, 4), lambda r: bool(np.all(r == 0, axis=-1).any()), settings=SEARCH)
    find(routings(), lambda rk: _boundary_tie(*rk), settings=SEARCH)
    find(router_logits(3, 8), lambda r: _boundary_tie(r, 2) and not np.all(r == 0), settings=SEARCH)


@PROPERTY
@given(st.data())
def test_router_logits_are_bounded_and_on_the_grid(data):
    shape = data.draw(moe_shapes())
    max_logit = data.draw(st.sampled_from([0.125, 0.3, 4.0, 8.0]))
    r = data.draw(router_logits(shape.tokens, shape.experts, max_logit=max_logit))
    assert r.shape == (shape.tokens, shape.experts)
    assert np.all(np.abs(r) <= max_logit)
    assert np.array_equal(r / LOGIT_STEP, np.round(r / LOGIT_STEP))


@PROPERTY
@given(routings(ties=False))
def test_tie_free_rows_have_distinct_values_at_least_a_step_apart(routing):
    logits, _ = routing
    assert np.all(np.diff(np.sort(logits, axis=-1), axis=-1) >= LOGIT_STEP)


@PROPERTY
@given(st.data())
def test_grids_are_exact_in_bfloat16_and_float16(data):
    torch = pytest.importorskip("torch")
    shape = data.draw(moe_shapes(max_d=16))
    logits = data.draw(router_logits(shape.tokens, shape.experts, max_logit=8.0))
    shifted = logits + 8.0 * data.draw(st.sampled_from([-1.0, 1.0]))  # the largest shift the invariants use
    x = data.draw(moe_tokens(shape.tokens, shape.d_model))
    router = data.draw(moe_params(shape.d_model, shape.experts))["router"]
    for dtype in (torch.bfloat16, torch.float16):
        for values in (logits, shifted, x, router):
            assert np.array_equal(torch.tensor(values).to(dtype).double().numpy(), values)
        scores = torch.tensor(x).to(dtype) @ torch.tensor(router).to(dtype)  # (N, E), rounded to the dtype
        assert np.array_equal(scores.double().numpy(), x @ router)


@PROPERTY
@given(st.data())
def test_uniform_mean_logits_have_a_uniform_mean_probability(data):
    n = data.draw(st.integers(1, 8))
    logits = data.draw(uniform_mean_router_logits(n))
    assert logits.shape[0] % n == 0
    np.testing.assert_allclose(ref.softmax(logits).mean(axis=0), np.full(n, 1 / n), rtol=1e-12)


@PROPERTY
@given(st.data())
def test_moe_params_have_the_protocol_shapes(data):
    shape = data.draw(moe_shapes())
    params = data.draw(moe_params(shape.d_model, shape.experts, d_ff=3))
    router, experts = params["router"], params["experts"]
    d = shape.d_model
    assert router.shape == (d, shape.experts) and len(experts) == shape.experts
    assert all(e["W1"].shape == (d, 3) and e["b1"].shape == (3,) and e["W2"].shape == (3, d) and e["b2"].shape == (d,) for e in experts)
    swiglu = data.draw(moe_params(d, shape.experts, d_ff=3, expert_ffn="swiglu"))["experts"]
    assert all(list(e) == ["W_gate", "W_up", "W_down"] and e["W_gate"].shape == e["W_up"].shape == (d, 3) and e["W_down"].shape == (3, d)
               for e in swiglu)


def test_balance_loss_below_one_occurs_in_the_generated_data():
    find(routings(), lambda rk: ref.load_balancing_loss(*rk) < 0.95, settings=SEARCH)
    find(routings(patterns=("leaning", "confident")), lambda rk: ref.load_balancing_loss(*rk) < 0.9, settings=SEARCH)


def test_the_bounds_invariant_itself_sees_a_balance_loss_below_one():
    seen = []

    def recording_loss(router_logits, k):
        seen.append(ref.load_balancing_loss(router_logits, k))
        return seen[-1]

    impl = Implementation.from_functions(backend="numpy", load_balancing_loss=recording_loss)
    assert run_invariant(REGISTRY["moe.load_balancing_loss_bounds"], impl, settings=profile_settings("ci")).passed
    assert min(seen) < 1, f"the ci profile's {len(seen)} examples never drop below 1 (lowest {min(seen):.4f})"
