"""Strategies for the building blocks every component shares: seeds, float arrays, shapes, dtypes.

Array values come from numpy's generator seeded by a drawn integer, so a 3×5×8 input costs
one choice instead of 120: generation stays fast, the shape and the seed shrink, and the
failure report (the seed, the shape) reproduces the array exactly.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache

import numpy as np
from hypothesis import strategies as st

from strategies._validation import check_choice, check_float, check_int, check_int_range, check_order

DTYPES = ("float64", "float32", "float16", "bfloat16")


def seeds():
    """Seeds for numpy's default_rng: 0 first when shrinking."""
    return st.integers(min_value=0, max_value=2**32 - 1)


def float_arrays(shape, *, min_scale=1.0, max_scale=1.0):
    """float64 arrays of `shape`, standard normal times a scale drawn from [min_scale, max_scale]."""
    shape = tuple(shape)
    for i, size in enumerate(shape):
        check_int(f"shape[{i}]", size, low=0)
    check_float("min_scale", min_scale, positive=True)
    check_float("max_scale", max_scale, positive=True)
    check_order("min_scale", min_scale, "max_scale", max_scale)
    return _float_arrays(shape, float(min_scale), float(max_scale))


@cache
def _float_arrays(shape, min_scale, max_scale):
    # Cached: invariants draw arrays of data-dependent shapes on every example, and building
    # a strategy costs more than drawing from it.
    scales = st.just(min_scale) if min_scale == max_scale else st.floats(min_scale, max_scale)
    return st.builds(lambda seed, scale: np.random.default_rng(seed).standard_normal(shape) * scale, seeds(), scales)


def weights(shape, *, gain=1.0):
    """float64 weight matrices of `shape` with std gain/√fan_in (fan_in = shape[0]): activations stay near unit size."""
    check_float("gain", gain, positive=True)
    scale = gain / np.sqrt(max(shape[0], 1))
    return float_arrays(shape, min_scale=scale, max_scale=scale)


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


def attention_shapes(*, min_batch=1, max_batch=3, min_seq=1, max_seq=8, min_heads=1, max_heads=4, min_d_head=1, max_d_head=8):
    """AttentionShape(batch, seq, n_heads, d_head) with d_model = n_heads·d_head, valid by construction.

    Shrinks towards the edge cases: seq 1, one head, d_head 1 (n_heads = d_model).
    """
    check_int_range("batch", min_batch, max_batch, low=1)
    check_int_range("seq", min_seq, max_seq, low=1)
    check_int_range("heads", min_heads, max_heads, low=1)
    check_int_range("d_head", min_d_head, max_d_head, low=1)
    return st.builds(
        AttentionShape,
        batch=st.integers(min_batch, max_batch),
        seq=st.integers(min_seq, max_seq),
        n_heads=st.integers(min_heads, max_heads),
        d_head=st.integers(min_d_head, max_d_head),
    )


def dtypes(*, backend="torch"):
    """Floating dtype names an implementation of `backend` can be run in (numpy has no bfloat16)."""
    check_choice("backend", backend, ("numpy", "torch"))
    return st.sampled_from([d for d in DTYPES if backend == "torch" or d != "bfloat16"])


def devices():
    """'cpu', plus 'cuda' where torch sees a GPU."""
    try:
        import torch

        has_cuda = torch.cuda.is_available()
    except ImportError:
        has_cuda = False
    return st.sampled_from(["cpu", "cuda"] if has_cuda else ["cpu"])
