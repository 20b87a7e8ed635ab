"""attention_inputs: bad arguments are refused by name, draws are valid, and the edge cases are drawn."""

import math

import numpy as np
import pytest
from hypothesis import given, settings

from invariants.protocol import FUNCTIONS
from invariants.strategies._validation import InvalidArgument
from invariants.strategies.attention import MAX_SCORE_SCALE, MAX_SCORE_SUM, PROJECTIONS, attention_args, attention_inputs, largest_score_sum
from invariants.strategies.core import GRID, LONG_LENGTHS

DETERMINISTIC = settings(max_examples=60, derandomize=True, database=None, deadline=None)  # the ci profile's budget

BAD_ARGUMENTS = [
    ("min_batch", 0, {}),
    ("min_batch", True, {}),
    ("max_seq", 0, {}),
    ("min_seq", 5, {"max_seq": 3}),
    ("min_heads", 1.5, {}),
    ("max_heads", 2, {"min_heads": 3}),
    ("min_d_head", 0, {}),
    ("max_d_head", "8", {}),
    ("causal", "yes", {}),
    ("causal", 1, {}),
    ("min_scale", 0.0, {}),
    ("max_scale", math.inf, {}),
    ("min_scale", 2.0, {"max_scale": 1.0}),
    ("gain", -1.0, {}),
    ("gain", "1", {}),
    ("max_score_scale", 0.5, {}),
    ("max_score_scale", 1e5, {}),
    ("min_score_scale", 64.0, {"max_score_scale": 16.0}),
    ("max_score_sum", 0.0, {}),
    ("patterns", (), {}),
    ("patterns", ("general", "sorted"), {}),
    ("long_lengths", "17", {}),
    ("long_lengths", (0,), {}),
]


@pytest.mark.parametrize(("name", "value", "others"), BAD_ARGUMENTS, ids=lambda v: repr(v) if not isinstance(v, dict) else "")
def test_bad_argument_is_refused_with_its_name_and_value(name, value, others):
    with pytest.raises(InvalidArgument) as refused:
        attention_inputs(**{name: value, **others})
    assert f"{name}={value!r}" in str(refused.value)


def _draws(strategy):
    """Every example a deterministic 60-example run draws from strategy."""
    seen = []

    @DETERMINISTIC
    @given(strategy)
    def collect(example):
        seen.append(example)

    collect()
    return seen


def test_attention_args_follow_the_protocol_order():
    assert ("x", *PROJECTIONS, "n_heads", "causal") == FUNCTIONS["attention"].params


def test_draws_are_valid_by_construction():
    for inputs in _draws(attention_inputs(min_seq=2, max_seq=5, max_heads=3, causal=True)):
        x, W_q, W_k, W_v, W_o, n_heads, causal = attention_args(inputs)
        B, T, d = x.shape
        assert 2 <= T <= 5 and 1 <= n_heads <= 3 and d % n_heads == 0
        assert all(W.shape == (d, d) for W in (W_q, W_k, W_v, W_o))
        assert causal is True


@pytest.mark.parametrize(
    ("edge", "holds"),
    [
        ("seq 1", lambda B, T, H, D: T == 1),
        ("d_head 1", lambda B, T, H, D: D == 1),
        ("one head", lambda B, T, H, D: H == 1),
        ("n_heads = d_model > 1", lambda B, T, H, D: D == 1 and H > 1),
        ("batch 1", lambda B, T, H, D: B == 1),
        ("several heads of width > 1", lambda B, T, H, D: H > 1 and D > 1),
    ],
    ids=lambda v: v if isinstance(v, str) else "",
)
def test_edge_case_is_drawn(edge, holds):
    shapes = [(x.shape[0], x.shape[1], n, x.shape[2] // n) for x, n in ((i["x"], i["n_heads"]) for i in _draws(attention_inputs()))]
    assert any(holds(*shape) for shape in shapes), f"no {edge} in {shapes}"


def test_causal_is_drawn_both_ways_unless_fixed():
    assert {inputs["causal"] for inputs in _draws(attention_inputs())} == {True, False}
    assert {inputs["causal"] for inputs in _draws(attention_inputs(causal=False))} == {False}


def test_x_scale_stays_in_its_range():
    draws = _draws(attention_inputs(min_seq=8, max_seq=8, min_d_head=8, min_scale=2.0, max_scale=2.0, patterns=("general",)))
    assert all(np.isin(inputs["x"] / 2.0, GRID).all() for inputs in draws)  # grid values times the scale 2
    assert 1.0 < np.concatenate([inputs["x"].ravel() for inputs in draws]).std() < 3.0  # pooled: a single draw may have shrunk to zeros


def test_large_score_scales_reach_scores_of_1e4_and_stay_finite_in_float16():
    draws = _draws(attention_inputs(max_score_scale=MAX_SCORE_SCALE, patterns=("general",)))
    sums = [largest_score_sum(i["x"], i["W_q"], i["W_k"], i["n_heads"]) for i in draws]
    assert max(sums) <= MAX_SCORE_SUM < 65504  # every partial sum of every score: finite in float16
    assert sum(s >= 1e4 for s in sums) >= 10, sorted(sums)[-10:]


def test_long_lengths_are_drawn_half_the_time_at_small_widths():
    shapes = [(i["x"].shape, i["n_heads"]) for i in _draws(attention_inputs(long_lengths=LONG_LENGTHS))]
    long = [shape for shape, _ in shapes if shape[1] in LONG_LENGTHS]
    assert 15 <= len(long) <= 45, len(long)
    assert all(B <= 2 and d <= 8 for B, T, d in long)


@pytest.mark.parametrize("pattern, holds", [
    ("zero tokens", lambda i: (i["x"] == 0).all(axis=-1).any()),
    ("repeated token", lambda i: (i["x"] == i["x"][:, :1]).all()),
    ("equal scores", lambda i: not i["W_q"].any()),
])
def test_each_degenerate_pattern_gives_what_it_says(pattern, holds):
    assert all(holds(inputs) for inputs in _draws(attention_inputs(patterns=(pattern,))))
