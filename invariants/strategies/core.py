"""Strategies for the building blocks every component shares: grid values, float arrays, shapes, sequence lengths, dtypes.

Values shrink towards simple numbers. Every array is drawn as one hypothesis bytes choice (one
byte per value: cheap to draw at any size) and each byte is read through GRID, a table of 256
multiples of 1/64 shaped like a standard normal and sorted from the simplest number to the most
detailed: 0, 1, -1, 1/2, -1/2, 1/4, ... Hypothesis shrinks bytes towards 0 value by value, so a
failing example ends as zeros, ones and halves, `x = [[1.], [0.]], W_q = [[1.]]`, not as seed
noise. Every grid value has at most 8 significant bits, so times a power of two it is exact in
every dtype down to bfloat16: the implementation sees exactly the drawn numbers, and the laws
that are exact stay exact. An array of more than MIN_DRAWN values draws 32 to 256 bytes (64 on
average) and repeats them beyond, each position picking one by a hash, so that a long sequence
costs no more to draw than a short one and one example stays within hypothesis's budget. Every
array is one bytes choice whatever its shape, so shapes shrink too: the recorded bytes still fit
a smaller array. Hypothesis's cost per example grows with the strategies drawn (each draw opens a
span and validates), so a params dict draws its arrays' bytes directly (array_dicts): one draw
per array.

Sequences reach where length bugs live: `attention_shapes(long_lengths=LONG_LENGTHS)` draws,
half the time, a length on either side of 16, 32, 64 and 128 (the block sizes of mask buffers
and the tiles of fused kernels) at small widths, where 129 tokens cost little.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import cache
from statistics import NormalDist
from typing import Any, TypeVar, cast

import numpy as np
from hypothesis import strategies as st
from hypothesis.strategies import SearchStrategy

from invariants import hypothesis_internals
from invariants.strategies._validation import InvalidArgument, check_choice, check_float, check_int, check_int_range, check_order
from invariants.tolerance import DTYPES

__all__ = [
    "AttentionShape", "EITHER_SIDE", "GRID", "LONG_LENGTHS", "TILE_LENGTHS", "attention_shapes", "byte_arrays", "devices", "dtypes",
    "float_arrays", "grid_values", "seeds", "swept_lengths", "weights",
]

GRID_STEP = 1 / 64  # every GRID value is a multiple of this
MIN_DRAWN, MAX_DRAWN = 32, 256  # bytes drawn per array (its size, if smaller than MIN_DRAWN); values beyond repeat them

# Tiles and block sizes of real kernels and mask buffers, and the lengths either side of each.
TILE_LENGTHS = (16, 32, 64, 128)
LONG_LENGTHS = tuple(t + side for t in TILE_LENGTHS for side in (-1, 0, 1))  # 15, 16, 17, 31, ..., 127, 128, 129
EITHER_SIDE = tuple(t + side for t in TILE_LENGTHS for side in (-1, 1))  # 15, 17, 31, 33, 63, 65, 127, 129
SWEPT_LENGTHS = (65, 129)  # a causal check drawn at one of these runs at every EITHER_SIDE length up to it (swept_lengths)
MAX_LONG_BATCH = 2  # long sequences are drawn at small sizes, where 129 tokens cost little
MAX_LONG_WIDTH = 8
F = TypeVar("F", bound=Callable[..., Any])  # cached_strategy keeps the signature it wraps, for type checkers


def _simplicity(k):
    """Sort key of the grid value k/64: fewer binary digits first (0; ±1, ±2; ±1/2; ±1/4, ±3/4; ...), then smaller, then positive."""
    if k == 0:
        return (0, 0, 0)
    trailing = (abs(k) & -abs(k)).bit_length() - 1  # k = odd · 2**trailing
    return (6 - min(trailing, 6), abs(k), k < 0)


def _grid():
    """(256,) float64: the 256 quantiles of a standard normal rounded to multiples of 1/64, sorted by _simplicity."""
    steps = [round(NormalDist().inv_cdf((i + 0.5) / 256) / GRID_STEP) for i in range(256)]  # within ±185 steps (±2.89)
    return np.array(sorted(steps, key=_simplicity), dtype=np.float64) * GRID_STEP


GRID = _grid()  # GRID[0] = GRID[1] = 0, GRID[2] = 1, GRID[3] = -1, GRID[4] = 1/2, ...; std 0.997, |values| <= 2.89
GRID_MAX = float(np.abs(GRID).max())


def cached_strategy(build: F) -> F:
    """Build each strategy once per set of arguments: building one (validating it on first draw) costs more than a draw.

    Arguments that cannot be hashed (a list of patterns) build afresh. The argument types are part of
    the key, so 1, 1.0 and True, which hash alike, are told apart and validated separately; floats are keyed by
    their bits, so 0.0 and -0.0 (equal) are told apart and a NaN finds its own entry (it equals nothing).
    """
    built: dict[tuple, Any] = {}

    @functools.wraps(build)
    def strategy(*args, **kwargs):
        key = tuple(map(_key_part, args)) + tuple((name, _key_part(v)) for name, v in sorted(kwargs.items()))
        try:
            return built[key]
        except TypeError:  # an unhashable argument
            return build(*args, **kwargs)
        except KeyError:
            built[key] = build(*args, **kwargs)  # InvalidArgument propagates and caches nothing
            return built[key]

    return cast(F, strategy)


def _key_part(value):
    return (type(value), value.hex()) if isinstance(value, float) else (type(value), value)  # hex: -0.0 apart from 0.0, NaN equal to NaN


# Hypothesis caches integers, floats, booleans, lists, tuples and builds by their arguments, but builds
# these afresh on every call: built in a composite or an invariant's body, each cost 60 to 110 µs an
# example (a new lazy strategy, validated and labelled on its first draw). Built once per set of
# arguments here, they are the same strategies with the same labels, so they draw the same examples.
# Their arguments must be hashable (tuples, not lists) to be cached. one_of draws a strategy given twice as one
# branch, so build a one_of whose branches may coincide (just(a), just(b), a = b) from hypothesis's own just().
just = cached_strategy(st.just)
sampled_from = cached_strategy(st.sampled_from)
one_of = cached_strategy(st.one_of)
none = cached_strategy(st.none)
permutations = cached_strategy(st.permutations)
# Hypothesis does cache integers, through an LRU whose look-up costs about 4 µs (1 µs here); the suite
# asks for about six per example, so this cache, the first strategy hypothesis built for the arguments, is kept.
integers = cached_strategy(st.integers)


def seeds() -> SearchStrategy[int]:
    """Seeds for numpy's default_rng: 0 first when shrinking."""
    return integers(min_value=0, max_value=2**32 - 1)


def mapped(strategy, fn):
    """strategy.map(fn) for a map built per example (fn closing over a drawn value): the same strategy, built cheaply.

    Mapping a lazy strategy (hypothesis's integers, tuples, ...) makes a new lazy one that rebuilds and
    revalidates the strategy it stands for on first draw (about 150 µs); mapping that strategy itself, once
    validated, costs about 30 µs, and hypothesis draws and labels the two alike.
    """
    return hypothesis_internals.unwrapped(strategy).map(fn)


def _check_shape(shape):
    shape = tuple(shape)
    for i, size in enumerate(shape):
        check_int(f"shape[{i}]", size, low=0)
    return shape


def _filled(head, shape):
    """uint8 (shape) from the drawn bytes `head`: its bytes first, then (beyond len(head)) the same bytes again, picked by a hash of the position."""
    size = math.prod(shape)
    b = np.frombuffer(head, dtype=np.uint8)
    if len(b) >= size:
        return b[:size].reshape(shape)
    if len(b) == 0:
        return np.zeros(shape, dtype=np.uint8)
    rest = np.arange(len(b), size, dtype=np.uint64)
    picks = ((rest * np.uint64(2654435761)) % np.uint64(2**32)) >> np.uint64(8)  # Knuth's multiplicative hash: no period
    return np.concatenate([b, b[(picks % np.uint64(len(b))).astype(np.intp)]]).reshape(shape)


def _bytes_for(shape):
    # Every array is one bytes choice of MIN_DRAWN to MAX_DRAWN bytes (fewer only for a smaller array), whatever its shape:
    # when the shrinker makes a shape smaller the recorded bytes still fit (the first ones are read), so the example
    # keeps failing while its shapes shrink instead of every later array falling back to zeros.
    return st.binary(min_size=min(math.prod(shape), MIN_DRAWN), max_size=MAX_DRAWN)


@cache
def _byte_arrays(shape):
    return _bytes_for(shape).map(lambda b: _filled(b, shape))


def byte_arrays(shape: tuple[int, ...]) -> SearchStrategy[np.ndarray]:
    """uint8 arrays of `shape` that shrink towards 0 value by value (from one hypothesis bytes choice).

    An array of up to MIN_DRAWN values has a drawn byte each; a larger one draws MIN_DRAWN to
    MAX_DRAWN bytes (64 on average) and repeats them beyond, each position picking one by a hash
    (no period), so it shrinks with them. Every other strategy here reads its values from these
    bytes (GRID[b], b % n, ...).
    """
    return _byte_arrays(_check_shape(shape))


@cache
def _grid_values(shape):
    return _bytes_for(shape).map(lambda b: GRID[_filled(b, shape)])


def grid_values(shape: tuple[int, ...]) -> SearchStrategy[np.ndarray]:
    """float64 arrays of `shape` whose values are GRID values: normal-shaped (std 1), multiples of 1/64, shrinking towards 0, 1, -1, 1/2, ..."""
    return _grid_values(_check_shape(shape))


def array_dicts(parts):
    """dicts {name: read(uint8 array of shape)} from parts ((name, shape, read), ...): one bytes choice per array, drawn in order.

    The choices of fixed_dictionaries over byte_arrays(shape).map(read), without the two strategy
    wrappers per array: hypothesis's cost per example grows with the strategies drawn, and a
    block's twelve arrays are then twelve draws. `read` turns the bytes into values (GRID[b] * scale, gains, ...).
    """
    parts = tuple((name, _check_shape(shape), read) for name, shape, read in parts)
    return _array_dicts(tuple((name, shape, _bytes_for(shape), read) for name, shape, read in parts))


@st.composite  # decorated once: a composite defined per call costs hypothesis a look at its source each time
def _array_dicts(draw, parts):
    return {name: read(_filled(draw(choice), shape)) for name, shape, choice, read in parts}


def grid_reader(scale):
    """The reader of array_dicts for grid values times `scale`: b -> GRID[b] * scale."""
    return functools.partial(_scaled_grid, scale=scale)


def _scaled_grid(b, scale):
    return GRID[b] * scale


def small_ints(b, top):
    """Integers in [-top, top] from bytes b, about uniform: 0, 1, -1, 2, -2, ... for b = 0, 1, 2, 3, 4, ... (so they shrink towards 0)."""
    i = np.asarray(b, dtype=np.int64) % (2 * top + 1)
    return np.where(i % 2 == 1, (i + 1) // 2, -(i // 2))


def permutation_of(b):
    """The permutation that sorts bytes b (stably): uniform for random bytes, the identity once they shrink to 0."""
    return np.argsort(np.asarray(b), kind="stable")


def powers_of_two(low, high):
    """Exponents k with 2**k in [low, high] (low > 0), as (min_k, max_k), or None where the interval holds no power of two."""
    lo, hi = math.ceil(math.log2(low) - 1e-12), math.floor(math.log2(high) + 1e-12)
    return (lo, hi) if lo <= hi else None


def nearest_power_of_two(x):
    """2**round(log2(x)) for x > 0: the scale a grid array takes where a strategy asks for x."""
    return 2.0 ** round(math.log2(x))


def scales(min_scale, max_scale):
    """Scale factors in [min_scale, max_scale]: powers of two (shrinking towards 1) wherever the interval holds one, else floats."""
    exponents = powers_of_two(min_scale, max_scale)
    if exponents is not None and exponents[0] == exponents[1]:
        return just(2.0 ** exponents[0])  # no choice: a choice whose bounds change with a shape would misalign shrinking
    if exponents is not None:
        return integers(*exponents).map(lambda k: 2.0**k)
    return just(min_scale) if min_scale == max_scale else st.floats(min_scale, max_scale)


def float_arrays(shape: tuple[int, ...], *, min_scale: float = 1.0, max_scale: float = 1.0) -> SearchStrategy[np.ndarray]:
    """float64 arrays of `shape`: grid_values (normal-shaped, std 1) times a scale drawn from [min_scale, max_scale].

    The scale is a power of two wherever [min_scale, max_scale] holds one (shrinking towards 1), so
    the values are multiples of a power of two, exact in every dtype; else it is drawn from the interval.
    """
    shape = _check_shape(shape)
    check_float("min_scale", min_scale, positive=True)
    check_float("max_scale", max_scale, positive=True)
    check_order("min_scale", min_scale, "max_scale", max_scale)
    return _float_arrays(shape, float(min_scale), float(max_scale))


@cache
def _float_arrays(shape, min_scale, max_scale):
    # Cached: invariants draw arrays of data-dependent shapes on every example, and building
    # a strategy costs more than drawing from it.
    if min_scale == max_scale and powers_of_two(min_scale, max_scale) is not None:  # one draw, no wrapper
        return _bytes_for(shape).map(lambda b: _scaled_grid(_filled(b, shape), min_scale))
    return st.builds(lambda values, scale: values * scale, _grid_values(shape), scales(min_scale, max_scale))


def weights(shape: tuple[int, ...], *, gain: float = 1.0) -> SearchStrategy[np.ndarray]:
    """float64 weight matrices of `shape`: grid_values times gain/√fan_in (fan_in = shape[0]) rounded to the nearest power of two.

    Activations stay near unit size; the power of two keeps every weight exact in every dtype.
    """
    check_float("gain", gain, positive=True)
    shape = _check_shape(shape)
    scale = _weight_scale(shape, gain)
    return _float_arrays(shape, scale, scale)


def _weight_scale(shape, gain):
    return nearest_power_of_two(gain / math.sqrt(max(shape[0], 1)) if shape else gain)


def weight_part(name, shape, *, gain=1.0):
    """The array_dicts part (name, shape, read) of a weight matrix drawn as weights(shape, gain=gain) draws it."""
    return name, shape, grid_reader(_weight_scale(tuple(shape), gain))


@dataclass(frozen=True)
class AttentionShape:
    """batch B, sequence T, heads H and head width D; d_model = H·D."""

    batch: int
    seq: int
    n_heads: int
    d_head: int

    @property
    def d_model(self):
        return self.n_heads * self.d_head


def _check_lengths(long_lengths, min_seq):
    if isinstance(long_lengths, (str, bytes)) or not isinstance(long_lengths, (tuple, list)):
        raise InvalidArgument(f"long_lengths={long_lengths!r} must be a tuple of sequence lengths (LONG_LENGTHS, SWEPT_LENGTHS) or ()")
    for n in long_lengths:
        if isinstance(n, bool) or not isinstance(n, int) or n < max(min_seq, 1):
            raise InvalidArgument(f"long_lengths={long_lengths!r} holds {n!r}, which is not an int of at least min_seq={min_seq}")
    return tuple(long_lengths)


@cached_strategy
def attention_shapes(*, min_batch: int = 1, max_batch: int = 3, min_seq: int = 1, max_seq: int = 8, min_heads: int = 1, max_heads: int = 4,
                     min_d_head: int = 1, max_d_head: int = 8, long_lengths: Sequence[int] = ()) -> SearchStrategy[AttentionShape]:
    """AttentionShape(batch, seq, n_heads, d_head) with d_model = n_heads·d_head, valid by construction.

    Shrinks towards the edge cases: seq 1, one head, d_head 1 (n_heads = d_model). With long_lengths
    (e.g. LONG_LENGTHS), half the shapes are long, on purpose: seq drawn from long_lengths, batch at
    most 2 and d_model at most 8 (where the other bounds allow), so that 129 tokens cost no more
    than a few short ones; they shrink to the short shapes (a long shape clamps the same draws).
    """
    check_int_range("batch", min_batch, max_batch, low=1)
    check_int_range("seq", min_seq, max_seq, low=1)
    check_int_range("heads", min_heads, max_heads, low=1)
    check_int_range("d_head", min_d_head, max_d_head, low=1)
    lengths = _check_lengths(long_lengths, min_seq)
    if not lengths:
        return st.builds(
            AttentionShape,
            batch=integers(min_batch, max_batch),
            seq=integers(min_seq, max_seq),
            n_heads=integers(min_heads, max_heads),
            d_head=integers(min_d_head, max_d_head),
        )
    top_heads = max(min_heads, min(max_heads, MAX_LONG_WIDTH // min_d_head))

    @st.composite
    def shapes(draw):
        # The same choices for a short and a long shape (a long one clamps them), so shrinking from long to short keeps them.
        batch, seq = draw(integers(min_batch, max_batch)), draw(integers(min_seq, max_seq))
        heads, d_head = draw(integers(min_heads, max_heads)), draw(integers(min_d_head, max_d_head))
        long, length = draw(st.booleans()), draw(sampled_from(lengths))
        if not long:
            return AttentionShape(batch, seq, heads, d_head)
        heads = min(heads, top_heads)
        d_head = min(d_head, max(min_d_head, MAX_LONG_WIDTH // heads))
        return AttentionShape(min(batch, max(min_batch, MAX_LONG_BATCH)), length, heads, d_head)

    return shapes()


def swept_lengths(seq: int) -> tuple[int, ...]:
    """The lengths a causal check drawn at `seq` runs at: for seq in SWEPT_LENGTHS (65, 129), every length of
    EITHER_SIDE up to seq (15, 17, 31, 33, 63, 65 and, for 129, 127, 129); else seq alone.

    A mask that is right up to a length and wrong beyond it shows on one side of that length only, so a
    check drawn long runs on either side of every tile up to its length, whatever the draws; the cost is
    about that of the longest. Half the long draws reach 129, so each ci run meets every length.
    """
    return tuple(n for n in EITHER_SIDE if n <= seq) if seq in SWEPT_LENGTHS else (seq,)


def dtypes(*, backend: str = "torch") -> SearchStrategy[str]:
    """Floating dtype names an implementation of `backend` can be run in (numpy has no bfloat16)."""
    check_choice("backend", backend, ("numpy", "torch"))
    return st.sampled_from([d for d in DTYPES if backend == "torch" or d != "bfloat16"])


def devices() -> SearchStrategy[str]:
    """'cpu', plus 'cuda' where torch sees a GPU."""
    try:
        import torch

        has_cuda = torch.cuda.is_available()
    except ImportError:
        has_cuda = False
    return st.sampled_from(["cpu", "cuda"] if has_cuda else ["cpu"])
