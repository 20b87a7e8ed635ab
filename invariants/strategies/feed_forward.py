"""Inputs for the position-wise feed-forward network: token states (B, T, d) and weights W1, b1, W2, b2.

Values are grid values (strategies/core.py) times powers of two: they shrink towards 0, 1, -1, 1/2.
"""

from __future__ import annotations

import math
from functools import cache
from typing import Any

import numpy as np
from hypothesis import strategies as st
from hypothesis.strategies import SearchStrategy

from invariants.strategies._validation import check_float, check_int, check_int_range, check_order
from invariants.strategies.core import cached_strategy, float_arrays, grid_values, integers, nearest_power_of_two, scales

__all__ = ["feed_forward_weights", "hidden_states"]


@cached_strategy
def hidden_states(*, min_batch: int = 1, max_batch: int = 3, min_seq: int = 1, max_seq: int = 8, min_d: int = 1, max_d: int = 16,
                  min_scale: float = 0.1, max_scale: float = 3.0) -> SearchStrategy[np.ndarray]:
    """float64 token states (B, T, d): grid values (normal-shaped) times a per-array scale, a power of two in [min_scale, max_scale].

    Shrinks towards the edge cases one batch item, one token, d = 1, and towards values 0, 1, -1.
    """
    check_int_range("batch", min_batch, max_batch, low=1)
    check_int_range("seq", min_seq, max_seq, low=1)
    check_int_range("d", min_d, max_d, low=1)
    check_float("min_scale", min_scale, positive=True)
    check_float("max_scale", max_scale, positive=True)
    check_order("min_scale", min_scale, "max_scale", max_scale)
    spreads = scales(float(min_scale), float(max_scale))

    @st.composite
    def states(draw):
        shape = (draw(integers(min_batch, max_batch)), draw(integers(min_seq, max_seq)), draw(integers(min_d, max_d)))
        return draw(grid_values(shape)) * draw(spreads)  # (B, T, d)

    return states()


@cached_strategy
def feed_forward_weights(d_model: int, *, min_hidden: int | None = None, max_hidden: int | None = None) -> SearchStrategy[dict[str, Any]]:
    """dicts {W1 (d, F), b1 (F,), W2 (F, d), b2 (d,)} for feed_forward(x, W1, b1, W2, b2).

    The hidden width F is drawn from [min_hidden, max_hidden]; both default to 4·d_model (GPT-2's
    width), and min_hidden = 1 reaches the narrowest network. Weights have std 1/√fan_in (to the
    nearest power of two) and biases std 1, so activations stay near unit size through the GELU.
    """
    check_int("d_model", d_model, low=1)
    min_hidden = 4 * d_model if min_hidden is None else min_hidden
    max_hidden = 4 * d_model if max_hidden is None else max_hidden
    check_int_range("hidden", min_hidden, max_hidden, low=1)

    return integers(min_hidden, max_hidden).flatmap(lambda F: _weights(d_model, F))


@cache
def _weights(d, F):
    return st.fixed_dictionaries({
        "W1": matrices(d, F),  # (d, F)
        "b1": grid_values((F,)),  # (F,)
        "W2": matrices(F, d),  # (F, d)
        "b2": grid_values((d,)),  # (d,)
    })


def matrices(fan_in, fan_out, *, gain=1.0):
    """(fan_in, fan_out) grid matrices of std gain/√fan_in, to the nearest power of two."""
    scale = nearest_power_of_two(gain / math.sqrt(fan_in))
    return float_arrays((fan_in, fan_out), min_scale=scale, max_scale=scale)
