"""Inputs for the activation: arrays whose magnitudes span several decades, with zeros and repeats on purpose.

Each value is one byte read through a table of magnitudes log-spread over [min_abs, max_abs], each
with 4 significant bits (exact in every dtype down to bfloat16), with a sign, sorted from the
simplest (the power of two nearest 1) to the most detailed: an example shrinks towards x = [1.].
"""

from __future__ import annotations

from functools import cache

import numpy as np
from hypothesis import strategies as st
from hypothesis.strategies import SearchStrategy

from invariants.strategies._validation import InvalidArgument, check_float, check_int, check_int_range, check_order
from invariants.strategies.core import byte_arrays, cached_strategy, float_arrays, integers, sampled_from

__all__ = ["activation_inputs", "paddings"]

ACTIVATION_PATTERNS = ("spread", "with zeros", "one value repeated")
FLOAT16_SAFE = 40.0  # 40³ = 64000 < 65504: x³ in the tanh form stays finite in float16


def _significant_bits(m):
    """How many significant binary digits the positive float m has (1 for a power of two)."""
    mantissa, _ = np.frexp(m)  # m = mantissa·2**e, mantissa in [1/2, 1)
    bits = 1
    while mantissa * 2**bits != np.round(mantissa * 2**bits):
        bits += 1
    return bits


@cache
def magnitude_table(min_abs, max_abs):
    """(256,) signed values: 128 magnitudes log-spread over [min_abs, max_abs] (4 significant bits each, kept inside the
    range), each with both signs, sorted simplest first: fewer significant bits, then nearer 1, then positive."""
    spots = np.exp(np.linspace(np.log(min_abs), np.log(max_abs), 128))  # (128,)
    mantissa, exponent = np.frexp(spots)
    rounded = np.ldexp(np.round(mantissa * 16) / 16, exponent)  # 4 significant bits
    inside = np.where((rounded >= min_abs) & (rounded <= max_abs), rounded, spots)  # rounding must not leave the range
    values = [sign * m for m in inside for sign in (1.0, -1.0)]
    return np.array(sorted(values, key=lambda v: (_significant_bits(abs(v)), abs(np.log2(abs(v))), v < 0)))


@cached_strategy
def activation_inputs(*, min_ndim: int = 1, max_ndim: int = 3, min_side: int = 1, max_side: int = 6, min_abs: float = 1e-3,
                      max_abs: float = 20.0) -> SearchStrategy[np.ndarray]:
    """float64 arrays, ndim in [min_ndim, max_ndim], sides in [min_side, max_side], for elementwise functions.

    |x| is log-spread over [min_abs, max_abs] with random signs (see magnitude_table), so tiny, unit
    and large values all occur. Each array draws one of ACTIVATION_PATTERNS: spread (as above), with
    zeros (about a third of the entries exactly 0) or one value repeated (every entry the same: an
    elementwise function must give the same answer at every position). max_abs <= 40 keeps x³
    finite in float16.
    """
    check_int_range("ndim", min_ndim, max_ndim, low=1)
    check_int_range("side", min_side, max_side, low=1)
    check_float("min_abs", min_abs, positive=True)
    check_float("max_abs", max_abs, positive=True)
    check_order("min_abs", min_abs, "max_abs", max_abs)
    if max_abs > FLOAT16_SAFE:
        raise InvalidArgument(f"max_abs={max_abs!r} must be at most {FLOAT16_SAFE:g}, or x³ overflows float16 in the tanh form")
    table = magnitude_table(float(min_abs), float(max_abs))

    @st.composite
    def build(draw):
        ndim = draw(integers(min_ndim, max_ndim))
        shape = tuple(draw(st.lists(integers(min_side, max_side), min_size=ndim, max_size=ndim)))
        pattern = draw(sampled_from(ACTIVATION_PATTERNS))
        x = table[draw(byte_arrays(shape))]
        if pattern == "with zeros":
            x[draw(byte_arrays(shape)) >= 171] = 0.0  # about a third; none once the bytes shrink
        elif pattern == "one value repeated":
            x[...] = x.flat[0]
        return x

    return build()


@cached_strategy
def paddings(*, max_length: int = 9) -> SearchStrategy[np.ndarray]:
    """float64 vectors of length 0..max_length (grid values, normal-shaped) to surround an array with, moving its elements to other positions."""
    check_int("max_length", max_length, low=0)
    return integers(0, max_length).flatmap(lambda n: float_arrays((n,)))
