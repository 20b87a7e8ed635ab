"""Inputs for softmax and cross-entropy: logit arrays with the rows that break naive code, shifts, targets.

Rows come in four patterns, drawn on purpose rather than hoped for: general (normal values),
uniform (every logit in the row equal: softmax is 1/V, the loss is ln V), tied max (the largest
logit appears twice) and dominant (one logit far above the rest: softmax is nearly one-hot).
Values are grid values (strategies/core.py) times a power of two, so they shrink towards rows
like [1, 0] and [0, 0]; masked logits and logits of size 1e4 are drawn on purpose too.
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import cache, partial

import numpy as np
from hypothesis import strategies as st
from hypothesis.strategies import SearchStrategy

from invariants.strategies._validation import InvalidArgument, check_float, check_int_range, check_order
from invariants.strategies.core import GRID_MAX, byte_arrays, cached_strategy, grid_values, integers, mapped, sampled_from, scales

__all__ = ["large_logits", "logits", "shifts", "targets"]

ROW_PATTERNS = ("general", "uniform", "tied max", "dominant")
DYADIC_STEP = 1 / 16  # dyadic logits are multiples of this ...
DYADIC_LIMIT = 8.0  # ... in [-8, 8]: 8 significant bits at most, so exact in bfloat16
FLOAT16_MAX = 65504.0


def _check_patterns(patterns):
    if isinstance(patterns, str) or not isinstance(patterns, (tuple, list)) or not patterns:
        raise InvalidArgument(f"patterns={patterns!r} must be a non-empty tuple drawn from {ROW_PATTERNS}")
    unknown = [p for p in patterns if p not in ROW_PATTERNS]
    if unknown:
        raise InvalidArgument(f"patterns={patterns!r} holds {unknown[0]!r}, which is not one of {', '.join(map(repr, ROW_PATTERNS))}")


def _patterned_rows(x, picks, pattern, scale):
    """Grid rows x (..., V) times scale, reshaped to the row pattern along the last axis; picks (..., 1) are bytes choosing positions."""
    x = x * scale  # (..., V)
    V = x.shape[-1]
    if pattern == "uniform":
        x = np.broadcast_to(x[..., :1], x.shape).copy()  # every logit equals the row's first
    elif pattern == "tied max" and V >= 2:
        top = x.argmax(axis=-1)[..., None]  # (..., 1)
        other = (top + 1 + picks % (V - 1)) % V  # (..., 1), never the max itself
        np.put_along_axis(x, other, np.take_along_axis(x, top, axis=-1), axis=-1)
    elif pattern == "dominant":
        pick = picks % V  # (..., 1)
        np.put_along_axis(x, pick, np.take_along_axis(x, pick, axis=-1) + 10 * scale, axis=-1)
    return x


def _mask(x, where):
    """Set the entries where `where` (bytes, x's shape) is odd to -inf, never a whole row: a fully masked row keeps its first entry."""
    masked = where % 2 == 1  # about half; none once the bytes shrink to 0
    masked[..., 0] &= ~masked.all(axis=-1)
    return np.where(masked, -np.inf, x)


@cached_strategy
def logits(*, min_ndim: int = 1, max_ndim: int = 3, min_side: int = 1, max_side: int = 5, min_vocab: int = 1, max_vocab: int = 24,
           min_scale: float = 0.1, max_scale: float = 10.0, patterns: Sequence[str] = ROW_PATTERNS, dyadic: bool = False,
           masked: bool = False) -> SearchStrategy[np.ndarray]:
    """float64 logit arrays (..., V): ndim in [min_ndim, max_ndim], leading sides in [min_side, max_side].

    Each array draws one of `patterns` for its rows (see the module docstring) and a spread
    (the grid values' std) of a power of two in [min_scale, max_scale], shrinking towards 1. dyadic=True rounds every
    logit to a multiple of 1/16 and clips it to [-8, 8]: such values, and their sums with
    shifts(dyadic=True), are exact in every dtype down to bfloat16, so a shift law then tests
    the implementation, not the rounding of x + c. masked=True sets a random number of entries
    per row to -inf (about half), never all of them (a fully masked row has no softmax).
    """
    check_int_range("ndim", min_ndim, max_ndim, low=1)
    check_int_range("side", min_side, max_side, low=1)
    check_int_range("vocab", min_vocab, max_vocab, low=1)
    check_float("min_scale", min_scale, positive=True)
    check_float("max_scale", max_scale, positive=True)
    check_order("min_scale", min_scale, "max_scale", max_scale)
    _check_patterns(patterns)

    spreads = scales(float(min_scale), float(max_scale))  # powers of two where the range holds one

    @st.composite
    def build(draw):
        ndim = draw(integers(min_ndim, max_ndim))
        lead = tuple(draw(st.lists(integers(min_side, max_side), min_size=ndim - 1, max_size=ndim - 1)))
        shape = lead + (draw(integers(min_vocab, max_vocab)),)
        pattern = draw(sampled_from(tuple(patterns)))
        x = _patterned_rows(draw(grid_values(shape)), draw(byte_arrays(lead + (1,))), pattern, draw(spreads))
        if dyadic:
            x = np.clip(np.round(x / DYADIC_STEP) * DYADIC_STEP, -DYADIC_LIMIT, DYADIC_LIMIT)
        return _mask(x, draw(byte_arrays(shape))) if masked else x

    return build()


@cached_strategy
def large_logits(*, magnitude: float = 1e4, min_ndim: int = 1, max_ndim: int = 3, min_side: int = 1, max_side: int = 5, min_vocab: int = 1,
                 max_vocab: int = 24) -> SearchStrategy[np.ndarray]:
    """float64 logit arrays of size about `magnitude` (default the course's 1e4), where unguarded exp fails.

    Each array is either shifted (every row moved by +magnitude or -magnitude: exp overflows to
    inf, or every exp underflows to 0) or spread (rescaled so that its largest |logit| is
    magnitude: the softmax is nearly one-hot and the log of a computed softmax underflows to
    -inf; a uniform row spread this way, or an all-zero array, is the course's all-1e4 example). magnitude <= 6e4
    keeps every logit finite in float16 (largest value 65504).
    """
    check_float("magnitude", magnitude, positive=True)
    if magnitude > 6e4:
        raise InvalidArgument(f"magnitude={magnitude!r} must be at most 6e4, or the logits overflow float16 (largest {FLOAT16_MAX:g})")
    base = logits(min_ndim=min_ndim, max_ndim=max_ndim, min_side=min_side, max_side=max_side, min_vocab=min_vocab, max_vocab=max_vocab, max_scale=3.0)

    @st.composite
    def build(draw):
        x = draw(base)
        if draw(sampled_from(("shifted", "spread"))) == "spread":
            peak = np.abs(x).max()
            return x / peak * magnitude if peak > 0 else x + magnitude  # an all-zero array spreads to all-magnitude
        signs = np.where(draw(byte_arrays(x.shape[:-1] + (1,))) % 2 == 1, -1.0, 1.0)  # (..., 1)
        return x + signs * magnitude  # (..., V) + (..., 1)

    return build()


@cached_strategy
def shifts(shape: tuple[int, ...], *, max_abs: float = 8.0, dyadic: bool = False) -> SearchStrategy[np.ndarray]:
    """float64 constants of `shape` (one per row: pass x.shape[:-1] + (1,)) in [-max_abs, max_abs], normal-shaped, shrinking to 0.

    dyadic=True draws multiples of 1/16 and needs max_abs <= 8: added to logits(dyadic=True)
    the sum stays a multiple of 1/16 within [-16, 16], exact in every dtype.
    """
    shape = tuple(shape)
    for i, size in enumerate(shape):
        if isinstance(size, bool) or not isinstance(size, int) or size < 0:
            raise InvalidArgument(f"shape[{i}]={size!r} must be a non-negative int")
    check_float("max_abs", max_abs, low=0)
    if dyadic and max_abs > DYADIC_LIMIT:
        raise InvalidArgument(f"max_abs={max_abs!r} must be at most {DYADIC_LIMIT:g} with dyadic=True, or x + c leaves the range exact in bfloat16")

    def build(values):
        c = values / GRID_MAX * max_abs  # within ±max_abs; 0 once shrunk
        return np.trunc(c / DYADIC_STEP) * DYADIC_STEP if dyadic else c  # trunc keeps |c| <= max_abs

    return st.builds(build, grid_values(shape))


def targets(logits_array: np.ndarray) -> SearchStrategy[np.ndarray]:
    """int64 class targets for logits (..., V): shape (...), values in [0, V).

    Each draw puts the targets at random classes, at each row's largest logit (the smallest
    loss) or at its smallest logit (the largest loss).
    """
    if not isinstance(logits_array, np.ndarray) or logits_array.ndim < 1 or logits_array.shape[-1] < 1:
        shape = getattr(logits_array, "shape", None)
        raise InvalidArgument(f"logits_array with shape {shape!r} must be a numpy array (..., V) with V >= 1")
    # Drawn per example for that example's logits: a map over strategies built once per shape (a builds over a
    # closure would be validated afresh each time, a quarter of a millisecond).
    return mapped(_target_choices(logits_array.shape[:-1]), partial(_picked_targets, logits_array))


@cache
def _target_choices(lead):
    return st.tuples(sampled_from(("random", "argmax", "argmin")), byte_arrays(lead))


def _picked_targets(logits_array, drawn):
    """Targets (...) for logits (..., V) from the drawn (where, bytes): random classes, or each row's argmax or argmin."""
    where, picks = drawn
    V = logits_array.shape[-1]
    if where == "argmax":
        picked = logits_array.argmax(axis=-1)
    elif where == "argmin":
        picked = logits_array.argmin(axis=-1)
    else:
        picked = picks.astype(np.int64) % V if V <= 256 else (picks.astype(np.int64) * V) // 256
    return np.asarray(picked, dtype=np.int64)  # (...); a 0-d array, not a numpy scalar, for 1-d logits
