"""Inputs for Gemma's details: the RMSNorm with the gain 1 + w, and the scaled embedding (GeGLU takes swiglu_inputs' shapes).

Gemma's norm weights are deviations from 1 (zeros at initialisation): drawn as multiples of 1/256 in [-1/2, 1/2], which bfloat16
holds exactly while most 1 + w need a ninth bit, so a gain 1 + w rounded to bfloat16 is seen. Embedding widths include the
published ones, where √d rounds to another value in 16 bits (√3072 = 55.43 is 55.5 in bfloat16). Values are read from drawn
bytes or a drawn seed (strategies/core.py) and shrink towards w = 0, a small table and the first rows.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from hypothesis import strategies as st
from hypothesis.strategies import SearchStrategy

from invariants.strategies._validation import check_int, check_int_range
from invariants.strategies.core import GRID, byte_arrays, cached_strategy, integers, sampled_from, seeds, small_ints
from invariants.strategies.norms import norm_rows

__all__ = ["GEMMA_WIDTHS", "embedding_widths", "gemma_norm_inputs", "gemma_norm_weights", "scaled_embedding_inputs"]

GEMMA_EPS = (1e-6, 1e-5)  # rms_norm_eps: 1e-6 in every published Gemma config, 1e-5 as the suite's other norms
WEIGHT_STEP = 1 / 256  # norm weights w: multiples of 1/256 in [-1/2, 1/2], exact in bfloat16; 1 + w often is not
WEIGHT_PATTERNS = ("zero", "spread")  # w = 0 (the plain RMS normalisation, Gemma's initialisation) or any
# d_model of the published Gemmas: Gemma 3 1B 1152, Gemma 2B 2048, Gemma 2 2B 2304, Gemma 3 4B 2560, Gemma 7B 3072, Gemma 2 9B
# 3584, Gemma 3 12B 3840, Gemma 2 27B 4608, Gemma 3 27B 5376
GEMMA_WIDTHS = (1152, 2048, 2304, 2560, 3072, 3584, 3840, 4608, 5376)


@cached_strategy
def gemma_norm_weights(d: int) -> SearchStrategy[np.ndarray]:
    """float64 norm weights w (d,): all zero, or multiples of 1/256 in [-1/2, 1/2] (a pattern each); shrinking to zeros."""
    check_int("d", d, low=1)

    def build(pattern, b):
        return np.zeros(d) if pattern == "zero" else small_ints(b, 255) * WEIGHT_STEP  # bytes 0..255: -127..128

    return st.builds(build, sampled_from(WEIGHT_PATTERNS), byte_arrays((d,)))


@cached_strategy
def gemma_norm_inputs(*, max_rows: int = 4, max_d: int = 16) -> SearchStrategy[dict[str, Any]]:
    """{x (N, d), w (d,), eps}: one call of gemma_rms_norm; rows of spread bounded away from 0 (strategies.norms.norm_rows)."""
    check_int("max_rows", max_rows, low=1)
    check_int("max_d", max_d, low=2)

    @st.composite
    def inputs(draw):
        x = draw(norm_rows(max_rows=max_rows, max_d=max_d))
        return {"x": x, "w": draw(gemma_norm_weights(x.shape[-1])), "eps": draw(sampled_from(GEMMA_EPS))}

    return inputs()


@cached_strategy
def embedding_widths(*, max_small: int = 16) -> SearchStrategy[int]:
    """d_model: a small width from 1 to max_small, or a published Gemma's (GEMMA_WIDTHS), about half each."""
    check_int("max_small", max_small, low=1)
    return st.one_of(integers(1, max_small), sampled_from(GEMMA_WIDTHS))


@cached_strategy
def scaled_embedding_inputs(*, max_vocab: int = 4, max_batch: int = 2, max_seq: int = 4) -> SearchStrategy[dict[str, Any]]:
    """{ids (B, T) int in [0, V), table (V, d)}: one call of scaled_embedding; table values are grid values (multiples of 1/64,
    exact in every dtype), so the only rounding is the product's, and the width d is one of embedding_widths()."""
    check_int("max_vocab", max_vocab, low=1)
    check_int_range("batch", 1, max_batch, low=1)
    check_int_range("seq", 1, max_seq, low=1)

    @st.composite
    def inputs(draw):
        V, d = draw(integers(1, max_vocab)), draw(embedding_widths())
        B, T = draw(integers(1, max_batch)), draw(integers(1, max_seq))
        rng = np.random.default_rng(draw(seeds()))  # a published width's table is too large to draw byte by byte
        table = GRID[rng.integers(0, len(GRID), size=(V, d))]
        return {"ids": draw(byte_arrays((B, T))).astype(np.int64) % V, "table": table}

    return inputs()
