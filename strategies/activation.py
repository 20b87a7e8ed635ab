"""Inputs for the activation: arrays whose magnitudes span several decades, with zeros and repeats on purpose."""

from __future__ import annotations

import numpy as np
from hypothesis import strategies as st

from strategies._validation import InvalidArgument, check_float, check_int, check_int_range, check_order
from strategies.core import seeds

ACTIVATION_PATTERNS = ("spread", "with zeros", "one value repeated")
FLOAT16_SAFE = 40.0  # 40³ = 64000 < 65504: x³ in the tanh form stays finite in float16


def activation_inputs(*, min_ndim=1, max_ndim=3, min_side=1, max_side=6, min_abs=1e-3, max_abs=20.0):
    """float64 arrays, ndim in [min_ndim, max_ndim], sides in [min_side, max_side], for elementwise functions.

    |x| is log-uniform in [min_abs, max_abs] with random signs, so tiny, unit and large values
    all occur. Each array draws one of ACTIVATION_PATTERNS: spread (as above), with zeros (about
    a third of the entries exactly 0) or one value repeated (every entry the same: an
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

    @st.composite
    def build(draw):
        ndim = draw(st.integers(min_ndim, max_ndim))
        shape = tuple(draw(st.lists(st.integers(min_side, max_side), min_size=ndim, max_size=ndim)))
        pattern = draw(st.sampled_from(ACTIVATION_PATTERNS))
        rng = np.random.default_rng(draw(seeds()))
        x = rng.choice([-1.0, 1.0], size=shape) * np.exp(rng.uniform(np.log(min_abs), np.log(max_abs), size=shape))
        if pattern == "with zeros":
            x[rng.random(shape) < 1 / 3] = 0.0
        elif pattern == "one value repeated":
            x[...] = x.flat[0]
        return x

    return build()


def paddings(*, max_length=9):
    """float64 vectors of length 0..max_length (unit normal values) to surround an array with, moving its elements to other positions."""
    check_int("max_length", max_length, low=0)
    return st.builds(lambda n, seed: np.random.default_rng(seed).standard_normal(n), st.integers(0, max_length), seeds())
