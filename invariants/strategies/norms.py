"""Inputs for the norms: rows whose spread is bounded away from 0, the scale factors of the scale law, gains and biases.

Rows are grid values (strategies/core.py), centred, then scaled by a power of two: they shrink
towards rows like [1, -1] and [0.5, -0.5], and their spread never reaches 0 (a row that would be
flat gets a +1 and a -1 added). Large rows (max_row_std up to 2**12) reach where x² overflows
float16 (|x| >= 256), and zero_rows=True adds rows of exact zeros where a law is well-posed there.
loud_rows takes such rows into every function with a norm inside (blocks, models, decoders) in float16 runs.
"""

from __future__ import annotations

import numpy as np
from hypothesis import strategies as st
from hypothesis.strategies import SearchStrategy

from invariants.strategies._validation import InvalidArgument, check_float, check_int, check_int_range, check_order
from invariants.strategies.core import GRID, GRID_MAX, byte_arrays, cached_strategy, grid_values, integers, powers_of_two, sampled_from

__all__ = ["gains_and_biases", "loud_rows", "norm_rows", "scale_factors"]

MIN_UNIT_STD = 0.25  # a grid row is repaired until its population std is at least this
LARGEST_ROW_STD = 2.0**12  # 4096: rows up to about ±12,000, still finite in float16 (65504)


def _spread_rows(z):
    """z (n, d) with every row's population std >= MIN_UNIT_STD: a flat row gets (+1, -1, 0, ...) added until it spreads."""
    z = z.copy()
    pattern = np.zeros(z.shape[-1])
    pattern[:2] = (1.0, -1.0)
    for row in z:  # each row is a view into z
        while row.std() < MIN_UNIT_STD:
            row += pattern
    return z


@cached_strategy
def norm_rows(*, min_rows: int = 1, max_rows: int = 6, min_d: int = 2, max_d: int = 16, min_row_std: float = 0.1, max_row_std: float = 10.0,
              max_offset: float = 5.0, zero_rows: bool = False) -> SearchStrategy[np.ndarray]:
    """float64 arrays (rows, d) whose rows have population std in [min_row_std, max_row_std] and mean in ±max_offset·std.

    Well-posed for the scale and shift laws: a row's variance is bounded away from 0, so eps
    never dominates it and LN(c·x) is not a 0/0. Valid by construction, nothing is filtered: each
    row is grid values (repaired to a std of at least 1/4), centred, shifted by a grid fraction of
    ±max_offset·std and scaled by a power of two drawn so that its std lands in the range (so
    max_row_std >= 2·min_row_std). min_d >= 2: a row of one value has no spread. Rows of size up to
    max_row_std = 4096 stay finite in float16. zero_rows=True also sets about a quarter of the rows to
    exact zeros (std 0, outside the range: only for laws that hold at 0, such as LN(0) = bias).
    """
    check_int_range("rows", min_rows, max_rows, low=1)
    check_int_range("d", min_d, max_d, low=2)
    check_float("min_row_std", min_row_std, positive=True)
    check_float("max_row_std", max_row_std, positive=True)
    check_order("min_row_std", min_row_std, "max_row_std", max_row_std)
    if max_row_std < 2 * min_row_std:
        raise InvalidArgument(f"max_row_std={max_row_std!r} must be at least 2·min_row_std={2 * min_row_std!r}: rows are scaled by powers of two")
    if max_row_std > LARGEST_ROW_STD:
        raise InvalidArgument(f"max_row_std={max_row_std!r} must be at most {LARGEST_ROW_STD:g}, or a row's values overflow float16")
    check_float("max_offset", max_offset, low=0)
    if not isinstance(zero_rows, bool):
        raise InvalidArgument(f"zero_rows={zero_rows!r} must be True or False")

    @st.composite
    def rows(draw):
        n, d = draw(integers(min_rows, max_rows)), draw(integers(min_d, max_d))
        z = _spread_rows(draw(grid_values((n, d))))
        unit = z - z.mean(axis=-1, keepdims=True)  # (n, d): mean 0
        std = unit.std(axis=-1)  # (n,), in [1/4, 2.9]
        offsets = GRID[draw(byte_arrays((n,)))] / GRID_MAX * max_offset  # (n,), in ±max_offset, 0 when shrunk
        out = np.empty_like(unit)
        for i in range(n):
            low, high = powers_of_two(min_row_std / std[i], max_row_std / std[i])  # non-empty: max/min >= 2
            scale = 2.0 ** draw(integers(low, high))
            out[i] = (unit[i] + offsets[i] * std[i]) * scale
        if zero_rows:
            out[draw(byte_arrays((n,))) >= 192] = 0.0
        return out

    return rows()


@cached_strategy
def scale_factors(*, min_exponent: int = -4, max_exponent: int = 4, powers_of_two: bool = False) -> SearchStrategy[float]:
    """Non-zero scale factors c for LN(c·x) = sign(c)·LN_{eps/c²}(x).

    powers_of_two=True gives ±2**k, k in [min_exponent, max_exponent]: scaling by them is exact
    in binary floating point, so the law then holds bitwise. Otherwise ±10**u, u uniform in
    [min_exponent/2, max_exponent/2]: the law holds to rounding.
    """
    check_int("min_exponent", min_exponent)
    check_int("max_exponent", max_exponent)
    check_order("min_exponent", min_exponent, "max_exponent", max_exponent)
    sign = sampled_from((1.0, -1.0))
    if powers_of_two:
        magnitude = integers(min_exponent, max_exponent).map(lambda k: 2.0**k)
    else:
        magnitude = st.floats(min_exponent / 2, max_exponent / 2).map(lambda u: 10.0**u)
    return st.builds(lambda s, m: s * m, sign, magnitude)


def gain_values(b):
    """Gains from bytes b: 1 + GRID[b]/2 clipped to [1/2, 2] (multiples of 1/128: exact in bfloat16), 1 when shrunk."""
    return np.clip(1.0 + GRID[b] / 2, 0.5, 2.0)


@cached_strategy
def gains_and_biases(d: int) -> SearchStrategy[tuple[np.ndarray, np.ndarray]]:
    """(gain, bias) pairs of shape (d,): gains of size 1/2 to 2 and either sign, biases grid values; shrinking to (1, 0)."""
    check_int("d", d, low=1)

    def build(magnitudes, signs, biases):
        return gain_values(magnitudes) * np.where(signs % 2 == 1, -1.0, 1.0), biases

    return st.builds(build, byte_arrays((d,)), byte_arrays((d,)), grid_values((d,)))



LOUD_EXPONENTS = (8, 9, 10)  # a loud row's largest |x| lands in [2^e, 2^(e+1)): 256 to 2047, whose square overflows float16


@cached_strategy
def loud_rows(arrays: SearchStrategy, dtype: str, *, part: str | None = None) -> SearchStrategy:
    """arrays' draws (or the array at `part` of the dicts it draws) with, in a float16 run and about half the draws, some rows
    (the last axis: a token's features, an embedding's entry) scaled by a power of two to a largest |x| of 256 to 2047.

    Trained models' residual streams hold such values, and every norm in the protocol takes its statistics in float32
    (norms.rms_norm_large_rows): one that squares in float16 overflows there (x² > 65504) and divides by inf. Every other
    dtype gets arrays' own draws: bfloat16 holds float32's range, and float64 and float32 runs keep their laws at unit scale.
    Powers of two keep the values exact; rows of zeros stay 0.
    """
    if not isinstance(dtype, str):
        raise InvalidArgument(f"dtype={dtype!r} must be a dtype's name, such as 'float16'")
    if dtype != "float16":
        return arrays

    @st.composite
    def louder(draw):
        value = draw(arrays)
        if not draw(st.booleans()):
            return value
        x = value if part is None else value[part]
        rows = x.reshape(-1, x.shape[-1])  # (n, d)
        chosen = draw(byte_arrays((len(rows),)))  # (n,): a row is loud at >= 128, and the highest always
        loud = (chosen >= 128) | (np.arange(len(rows)) == np.argmax(chosen))
        top = np.abs(rows).max(axis=-1)  # (n,)
        exponent = draw(sampled_from(LOUD_EXPONENTS)) - np.floor(np.log2(np.where(top > 0, top, 1.0)))  # (n,)
        scaled = (rows * 2.0 ** np.where(loud, np.maximum(exponent, 0.0), 0.0)[:, None]).reshape(x.shape)
        return scaled if part is None else {**value, part: scaled}

    return louder()


def quiet_rows(x):
    """(...) bool: the rows of x (..., d) at unit size, which loud_rows left alone (largest |x| below 256). A 16-bit check is
    norm-wise, at the whole answer's largest value: beside loud rows, these are held again at their own scale."""
    return np.abs(np.asarray(x)).max(axis=-1) < 2.0 ** LOUD_EXPONENTS[0]
