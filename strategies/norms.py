"""Inputs for the norms: rows whose spread is bounded away from 0, and the scale factors of the scale law."""

from __future__ import annotations

import numpy as np
from hypothesis import strategies as st

from strategies._validation import check_float, check_int, check_int_range, check_order
from strategies.core import seeds


def norm_rows(*, min_rows=1, max_rows=6, min_d=2, max_d=16, min_row_std=0.1, max_row_std=10.0, max_offset=5.0):
    """float64 arrays (rows, d) whose rows have population std in [min_row_std, max_row_std] and mean in ±max_offset·std.

    Well-posed for the scale and shift laws: a row's variance is bounded away from 0, so eps
    never dominates it and LN(c·x) is not a 0/0. Valid by construction (each row is a standard
    normal row, standardised, then scaled and shifted), so nothing is filtered. min_d >= 2: a
    row of one value has no spread.
    """
    check_int_range("rows", min_rows, max_rows, low=1)
    check_int_range("d", min_d, max_d, low=2)
    check_float("min_row_std", min_row_std, positive=True)
    check_float("max_row_std", max_row_std, positive=True)
    check_order("min_row_std", min_row_std, "max_row_std", max_row_std)
    check_float("max_offset", max_offset, low=0)

    @st.composite
    def rows(draw):
        n, d = draw(st.integers(min_rows, max_rows)), draw(st.integers(min_d, max_d))
        rng = np.random.default_rng(draw(seeds()))
        z = rng.standard_normal((n, d))
        while np.any(z.std(axis=-1) < 1e-3):  # measure-zero in practice; keeps the construction exact
            z = rng.standard_normal((n, d))
        unit = (z - z.mean(axis=-1, keepdims=True)) / z.std(axis=-1, keepdims=True)  # (n, d): mean 0, std 1
        std = np.exp(rng.uniform(np.log(min_row_std), np.log(max_row_std), size=(n, 1)))  # (n, 1)
        offset = rng.uniform(-max_offset, max_offset, size=(n, 1)) * std  # (n, 1)
        return unit * std + offset

    return rows()


def scale_factors(*, min_exponent=-4, max_exponent=4, powers_of_two=False):
    """Non-zero scale factors c for LN(c·x) = sign(c)·LN_{eps/c²}(x).

    powers_of_two=True gives ±2**k, k in [min_exponent, max_exponent]: scaling by them is exact
    in binary floating point, so the law then holds bitwise. Otherwise ±10**u, u uniform in
    [min_exponent/2, max_exponent/2]: the law holds to rounding.
    """
    check_int("min_exponent", min_exponent)
    check_int("max_exponent", max_exponent)
    check_order("min_exponent", min_exponent, "max_exponent", max_exponent)
    sign = st.sampled_from([1.0, -1.0])
    if powers_of_two:
        magnitude = st.integers(min_exponent, max_exponent).map(lambda k: 2.0**k)
    else:
        magnitude = st.floats(min_exponent / 2, max_exponent / 2).map(lambda u: 10.0**u)
    return st.builds(lambda s, m: s * m, sign, magnitude)


def gains_and_biases(d):
    """(gain, bias) pairs of shape (d,): gains away from 0, biases of either sign."""
    check_int("d", d, low=1)

    def build(seed):
        rng = np.random.default_rng(seed)
        return rng.uniform(0.5, 2.0, d) * rng.choice([-1.0, 1.0], d), rng.standard_normal(d)

    return st.builds(build, seeds())
