"""Inputs for the attention scores as shipped: ALiBi's head counts and slopes, softcaps and capped logits, attention sinks.

q, k, v, the causal flag, the key mask and the window are gqa_inputs' (strategies/decoder.py); what is drawn here joins
them. ALiBi's key masks pad on the left or the right (or hide one item), never in the middle: there the distance counted in
slots (the protocol's) and the one BLOOM counts in real tokens (the cumulative sum of the mask) differ by more than a constant
per row, and which is right is the model's training. Sinks are multiples of 1/8 in [-4, 4], or far beyond every score
(±4096, ±8192: exp's float64 range ends at 709, so only a softmax that subtracts a max stays finite). Values are read
from drawn bytes (strategies/core.py) and shrink towards zero sinks, one head and the smallest cap.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from hypothesis import strategies as st
from hypothesis.strategies import SearchStrategy

import invariants.reference.numpy as ref
from invariants.strategies._validation import check_int, check_int_range
from invariants.strategies.core import byte_arrays, cached_strategy, integers, sampled_from, small_ints
from invariants.strategies.decoder import gqa_inputs

__all__ = ["alibi_inputs", "alibi_slope_arrays", "capped_logits", "head_counts", "sink_inputs", "sink_logits", "softcapped_inputs"]

POWERS_OF_TWO = (1, 2, 4, 8, 16, 32, 64)  # BLOOM-560m has 16 heads, MPT-7B 32
OTHER_HEAD_COUNTS = (3, 5, 6, 7, 12, 40)  # Baichuan2-13B has 40 heads, BLOOM-1b7 16, MPT-30B 56
ALIBI_PATTERNS = ("left padding", "right padding", "one item fully padded")
SLOPE_STEP = 1 / 16  # drawn slopes: multiples of 1/16 in [0, 1], zero (no bias) included
CAPS = (1.0, 2.0, 5.0, 30.0, 50.0)  # small caps, where a leak past the mask is large; Gemma 2's final (30) and attention (50)
SMALL_CAPS = CAPS[:2]  # the ratio of two weights of a row is at most e^(2·cap): e^4 at most, far from underflow in every dtype
SINK_STEP, MAX_SINK = 1 / 8, 4.0
LARGE_SINKS = (4096.0, 8192.0)  # exact in every dtype; e^4096 overflows float64
LOGIT_MAGNITUDES = (1.0, 16.0, 1024.0, 60000.0)  # 60000 < float16's largest 65504: the cap must hold there too


@cached_strategy
def head_counts(*, max_heads: int = 64) -> SearchStrategy[int]:
    """Head counts in [1, max_heads]: a power of two, one of the published others (3, 5, 6, 7, 12, 40), or any (a third each)."""
    check_int("max_heads", max_heads, low=1)
    listed = tuple(h for h in POWERS_OF_TWO + OTHER_HEAD_COUNTS if h <= max_heads)
    return st.one_of(sampled_from(tuple(h for h in POWERS_OF_TWO if h <= max_heads)), sampled_from(listed), integers(1, max_heads))


@cached_strategy
def alibi_slope_arrays(n_heads: int) -> SearchStrategy[np.ndarray]:
    """float64 slopes (H,): the model's alibi_slopes(H), or multiples of 1/16 in [0, 1] (half each)."""
    check_int("n_heads", n_heads, low=1)
    drawn = byte_arrays((n_heads,)).map(lambda b: np.abs(small_ints(b, round(1 / SLOPE_STEP))) * SLOPE_STEP)
    return st.one_of(st.just(ref.alibi_slopes(n_heads)), drawn)


@cached_strategy
def sink_logits(n_heads: int, *, large: bool = False) -> SearchStrategy[np.ndarray]:
    """float64 sinks (H,): multiples of 1/8 in [-4, 4]; large=True: each ±4096 or ±8192."""
    check_int("n_heads", n_heads, low=1)
    if large:
        return byte_arrays((n_heads,)).map(lambda b: np.array(LARGE_SINKS)[b % 2] * np.where(b & 2, -1.0, 1.0))
    return byte_arrays((n_heads,)).map(lambda b: small_ints(b, round(MAX_SINK / SINK_STEP)) * SINK_STEP)


def _with(strategy, name, extra):
    """dicts of `strategy` with `name` drawn from extra(n_heads) added."""

    @st.composite
    def inputs(draw):
        drawn = draw(strategy)
        return {**drawn, name: draw(extra(drawn["q"].shape[1]))}

    return inputs()


@cached_strategy
def alibi_inputs(*, shapes=None, masked: bool | None = None) -> SearchStrategy[dict[str, Any]]:
    """{q, k, v, slopes, key_mask}: one causal call of alibi_attention, its key mask padding on the left or the right."""
    drawn = gqa_inputs(shapes=shapes, causal=True, masked=masked, windowed=False, patterns=ALIBI_PATTERNS)
    return _with(drawn, "slopes", alibi_slope_arrays)


@cached_strategy
def softcapped_inputs(*, shapes=None, caps: tuple[float, ...] = CAPS, min_scale: float = 1.0, max_scale: float = 4.0,
                      **options) -> SearchStrategy[dict[str, Any]]:
    """{q, k, v, causal, key_mask, window, cap}: one call of softcapped_attention, scores up to max_scale² in size (gqa_inputs'
    options pass through)."""
    drawn = gqa_inputs(shapes=shapes, min_scale=min_scale, max_scale=max_scale, **options)
    return _with(drawn, "cap", lambda n_heads: sampled_from(tuple(caps)))


@cached_strategy
def sink_inputs(*, shapes=None, large: bool = False, **options) -> SearchStrategy[dict[str, Any]]:
    """{q, k, v, causal, key_mask, window, sinks}: one call of sink_attention (gqa_inputs' options pass through)."""
    return _with(gqa_inputs(shapes=shapes, **options), "sinks", lambda n_heads: sink_logits(n_heads, large=large))


@cached_strategy
def capped_logits(*, max_rows: int = 3, max_cols: int = 6, magnitudes: tuple[float, ...] = LOGIT_MAGNITUDES,
                  caps: tuple[float, ...] = CAPS) -> SearchStrategy[dict[str, Any]]:
    """{x (N, V), cap}: logits for softcap, multiples of 1/127 of a magnitude drawn from `magnitudes` (up to 60000), and a cap."""
    check_int_range("rows", 1, max_rows, low=1)
    check_int_range("cols", 1, max_cols, low=1)

    @st.composite
    def inputs(draw):
        shape = (draw(integers(1, max_rows)), draw(integers(1, max_cols)))
        magnitude = draw(sampled_from(tuple(magnitudes)))
        return {"x": small_ints(draw(byte_arrays(shape)), 127) / 127 * magnitude, "cap": draw(sampled_from(tuple(caps)))}

    return inputs()
