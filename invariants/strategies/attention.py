"""Inputs for multi-head self-attention: x and the four projections, valid by construction.

Three regions where shipped attention bugs live are reached on purpose: long sequences
(long_lengths, at small widths: a mask buffer built for 64 tokens, a kernel tiled by 32),
large scores (max_score_scale up to about 1e4: a mask of -1e4 instead of -inf, a softmax without
its max subtracted) and degenerate rows (zero tokens, one token repeated, all scores equal).
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import cache
from typing import Any

import numpy as np
from hypothesis import strategies as st
from hypothesis.strategies import SearchStrategy

from invariants.strategies._validation import InvalidArgument, check_float, check_order
from invariants.strategies.core import (
    array_dicts,
    attention_shapes,
    byte_arrays,
    cached_strategy,
    float_arrays,
    integers,
    just,
    sampled_from,
    weight_part,
)

__all__ = ["attention_args", "attention_inputs"]

PROJECTIONS = ("W_q", "W_k", "W_v", "W_o")
# x patterns: "general"; "zero tokens" (about a third of the tokens, at least one, exactly 0: their query, key and value are 0);
# "repeated token" (every token the same, so every score of a query is the same); "equal scores" (W_q = 0: every score 0).
PATTERNS = ("general", "zero tokens", "repeated token", "equal scores")
MAX_SCORE_SCALE = 4.0**7  # 16384: scores of about 1e4
# By default every partial sum of a score q·k (before the 1/√D) stays below this, whatever the score scale: 2**15 < 65504,
# so q, k and q·k are finite in float16 too. Wider dtypes hold far more: a caller that knows its dtype may allow more.
MAX_SCORE_SUM = 2.0**15


def _check_patterns(patterns):
    if isinstance(patterns, str) or not isinstance(patterns, (tuple, list)) or not patterns or any(p not in PATTERNS for p in patterns):
        raise InvalidArgument(f"patterns={patterns!r} must be a non-empty tuple of names from {PATTERNS!r}")
    return tuple(patterns)


def largest_score_sum(x, W_q, W_k, n_heads):
    """max over items, heads, queries and keys of Σ_i |q_i·k_i| (one head's features i): the largest partial sum of a score."""
    B, T, d = x.shape
    D = d // n_heads
    q = np.abs(x @ W_q).reshape(B, T, n_heads, D).transpose(0, 2, 1, 3)  # (B, H, T, D)
    k = np.abs(x @ W_k).reshape(B, T, n_heads, D).transpose(0, 2, 1, 3)  # (B, H, T, D)
    return float((q @ k.transpose(0, 1, 3, 2)).max(initial=0.0))  # (B, H, T, T)


@cache
def _projections(d, gain):
    """dicts {W_q, W_k, W_v, W_o}, each (d, d) as weights((d, d), gain=gain) draws it."""
    return array_dicts([weight_part(name, (d, d), gain=gain) for name in PROJECTIONS])


def score_scale_exponents(max_score_scale):
    """The exponents e of the score scales 4**e in [1, max_score_scale] (W_q and W_k are each scaled by 2**e)."""
    return int(np.floor(np.log(max_score_scale) / np.log(4.0) + 1e-9))


@cached_strategy
def attention_inputs(*, min_batch: int = 1, max_batch: int = 3, min_seq: int = 1, max_seq: int = 8, min_heads: int = 1, max_heads: int = 4,
                     min_d_head: int = 1, max_d_head: int = 8, causal: bool | None = None, min_scale: float = 1.0, max_scale: float = 1.0,
                     gain: float = 1.0, long_lengths: Sequence[int] = (), min_score_scale: float = 1.0, max_score_scale: float = 1.0,
                     max_score_sum: float = MAX_SCORE_SUM, patterns: Sequence[str] = PATTERNS) -> SearchStrategy[dict[str, Any]]:
    """dicts {x (B, T, d), W_q, W_k, W_v, W_o (d, d), n_heads, causal}, in the order attention takes them.

    The shape comes from attention_shapes (the min_/max_ pairs and long_lengths are passed to it), so
    d_model = n_heads·d_head and the edge cases seq 1, one head and d_head 1 (n_heads = d_model)
    are drawn on purpose; long_lengths adds long sequences at small widths. x is grid values times
    a scale in [min_scale, max_scale]; the projections have std gain/√d (to a power of two), so with
    the defaults the scores q·k/√d_head are of unit size and the softmax is neither saturated nor
    flat. causal=None draws it; True or False fixes it.

    max_score_scale > 1 multiplies W_q and W_k each by 2**e for a score scale 4**e drawn from
    [min_score_scale, max_score_scale] (the largest half the time; 16384 at most: scores of about
    1e4, where a mask of -1e4 leaks and exp overflows; shrinking towards the smallest), lowered
    where needed so that every partial sum of a score stays below max_score_sum (default 2**15:
    q, k and the scores are then finite in every dtype, float16 included; a run in a wider dtype
    may allow more, and so reach score gaps of 1e4 more often). Only laws that stay exact at such scores should ask
    for them: a rounding of 1e-7 in a score of 1e4 moves the softmax by 1e-3.

    Each draw takes one of `patterns` for x: general, zero tokens (about a third of the tokens
    exactly 0, at least one), repeated token (one token everywhere: every score of a query ties) or equal scores
    (W_q = 0: every score is 0 and each query's weights are uniform over what it sees).
    """
    shapes = attention_shapes(
        min_batch=min_batch, max_batch=max_batch, min_seq=min_seq, max_seq=max_seq,
        min_heads=min_heads, max_heads=max_heads, min_d_head=min_d_head, max_d_head=max_d_head, long_lengths=long_lengths,
    )  # validates the min_/max_ pairs and the lengths
    if causal is not None and not isinstance(causal, bool):
        raise InvalidArgument(f"causal={causal!r} must be True, False, or None to draw it")
    check_float("min_scale", min_scale, positive=True)
    check_float("max_scale", max_scale, positive=True)
    check_order("min_scale", min_scale, "max_scale", max_scale)
    check_float("gain", gain, positive=True)
    check_float("min_score_scale", min_score_scale, low=1.0)
    check_float("max_score_scale", max_score_scale, low=1.0)
    check_order("min_score_scale", min_score_scale, "max_score_scale", max_score_scale)
    check_float("max_score_sum", max_score_sum, positive=True)
    if max_score_scale > MAX_SCORE_SCALE:
        raise InvalidArgument(f"max_score_scale={max_score_scale!r} must be at most {MAX_SCORE_SCALE:g} (scores of about 1e4)")
    patterns = _check_patterns(patterns)
    causals = st.booleans() if causal is None else just(causal)
    top_exponent = score_scale_exponents(max_score_scale)
    low_exponent = min(top_exponent, int(np.ceil(np.log(min_score_scale) / np.log(4.0) - 1e-9)))

    @st.composite
    def inputs(draw):
        shape = draw(shapes)
        B, T, d = shape.batch, shape.seq, shape.d_model
        x = draw(float_arrays((B, T, d), min_scale=min_scale, max_scale=max_scale))  # (B, T, d)
        drawn = {"x": x, **draw(_projections(d, gain))}  # W_q, W_k, W_v, W_o (d, d)
        pattern = draw(sampled_from(patterns))
        if pattern == "zero tokens":
            b = draw(byte_arrays((B, T, 1)))
            zero = b < 86  # about a third; every token once the bytes shrink to 0
            zero.flat[np.argmin(b)] = True  # at least one
            drawn["x"] = np.where(zero, 0.0, x)
        elif pattern == "repeated token":
            drawn["x"] = np.broadcast_to(x[:, :1], x.shape).copy()
        elif pattern == "equal scores":
            drawn["W_q"] = np.zeros_like(drawn["W_q"])
        if top_exponent:
            largest, e = draw(st.booleans()), draw(integers(low_exponent, top_exponent))
            e = top_exponent if largest else e  # the largest half the time; both drawn, so shrinking keeps them aligned
            while e and largest_score_sum(drawn["x"], drawn["W_q"] * 2.0**e, drawn["W_k"] * 2.0**e, shape.n_heads) > max_score_sum:
                e -= 1  # deterministic, so the draw stays valid by construction
            drawn["W_q"], drawn["W_k"] = drawn["W_q"] * 2.0**e, drawn["W_k"] * 2.0**e  # powers of two: still exact
        drawn["n_heads"] = shape.n_heads
        drawn["causal"] = draw(causals)
        return drawn

    return inputs()


def attention_args(inputs):
    """The positional arguments of attention(x, W_q, W_k, W_v, W_o, n_heads, causal) from an attention_inputs dict."""
    return tuple(inputs[name] for name in ("x", *PROJECTIONS, "n_heads", "causal"))


def truncated(inputs, seq):
    """The attention_inputs dict with x cut to its first `seq` tokens (for a check that runs at several lengths)."""
    return {**inputs, "x": inputs["x"][:, :seq]}
