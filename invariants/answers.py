"""The forms an answer may take, as each protocol entry's `answer_form` states them from the call's arguments.

    FUNCTIONS["layer_norm"].answer_form(x, gain, bias, eps)   # Array((2, 4), "f"): floats of x's broadcast shape

An Array is an array of a shape (None: at most one element, a scalar; a None axis: any length) whose dtype kind is
one of `kinds`; a tuple is the parts of a tuple answer in order; Either allows any of its forms; TEXT is a str.
The gate holds a worker's declared answer to it (invariants.gate.frames), the shape law an answer itself (invariants.laws.shapes).
This module imports nothing of the suite, so that invariants.protocol can.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

FLOATS, NUMBERS = "f", "iuf"  # floats; counts and ids (an integral float is the invariants' to judge)
TEXT = "text"


@dataclass(frozen=True)
class Array:
    """An array of exactly `shape` (None: at most one element; a None axis: any length), of a dtype whose kind is in `kinds`."""

    shape: tuple | None
    kinds: str

    def shape_text(self):
        return "(" + ", ".join("*" if n is None else str(n) for n in self.shape) + (",)" if len(self.shape) == 1 else ")")

    def fits_shape(self, shape):
        """Whether an array of `shape` has this form's shape."""
        if self.shape is None:
            return int(np.prod(shape)) <= 1
        return len(shape) == len(self.shape) and all(w is None or n == w for n, w in zip(shape, self.shape, strict=True))


@dataclass(frozen=True)
class Either:
    """An answer that may take any of several forms (llama_decode's cache_positions or cache_sizes)."""

    forms: tuple


NUMBER = Array(None, NUMBERS + "b")  # a count, a flag or a scalar: a Python number or an array of at most one element


def floats(shape):
    return Array(tuple(shape), FLOATS)


def ints(shape):
    return Array(tuple(None if n is None else int(n) for n in shape), NUMBERS)


def shape_of(value):
    return tuple(value.shape)


def broadcast(*arrays):
    return np.broadcast_shapes(*(shape_of(a) for a in arrays))


def heads(x, n_heads, keys):
    """(B, H, T, S): attention weights of queries x (B, T, d) over `keys` positions."""
    return shape_of(x)[:-2] + (int(n_heads), shape_of(x)[-2], keys)


def chunk_count(chunks):
    """How many forwards llama_decode makes for `chunks` (None: one)."""
    return 1 if chunks is None else np.asarray(chunks).size
