"""Inputs for the position-wise feed-forward network: token states (B, T, d) and weights W1, b1, W2, b2."""

from __future__ import annotations

import numpy as np
from hypothesis import strategies as st

from strategies._validation import check_float, check_int, check_int_range, check_order
from strategies.core import seeds


def hidden_states(*, min_batch=1, max_batch=3, min_seq=1, max_seq=8, min_d=1, max_d=16, min_scale=0.1, max_scale=3.0):
    """float64 token states (B, T, d): standard normal times a per-array scale drawn from [min_scale, max_scale].

    Shrinks towards the edge cases one batch item, one token, d = 1.
    """
    check_int_range("batch", min_batch, max_batch, low=1)
    check_int_range("seq", min_seq, max_seq, low=1)
    check_int_range("d", min_d, max_d, low=1)
    check_float("min_scale", min_scale, positive=True)
    check_float("max_scale", max_scale, positive=True)
    check_order("min_scale", min_scale, "max_scale", max_scale)

    def build(B, T, d, scale, seed):
        return np.random.default_rng(seed).standard_normal((B, T, d)) * scale  # (B, T, d)

    return st.builds(
        build,
        st.integers(min_batch, max_batch),
        st.integers(min_seq, max_seq),
        st.integers(min_d, max_d),
        st.floats(min_scale, max_scale),
        seeds(),
    )


def feed_forward_weights(d_model, *, min_hidden=None, max_hidden=None):
    """dicts {W1 (d, F), b1 (F,), W2 (F, d), b2 (d,)} for feed_forward(x, W1, b1, W2, b2).

    The hidden width F is drawn from [min_hidden, max_hidden]; both default to 4·d_model (GPT-2's
    width), and min_hidden = 1 reaches the narrowest network. Weights have std 1/√fan_in and
    biases std 1, so activations stay near unit size through the GELU.
    """
    check_int("d_model", d_model, low=1)
    min_hidden = 4 * d_model if min_hidden is None else min_hidden
    max_hidden = 4 * d_model if max_hidden is None else max_hidden
    check_int_range("hidden", min_hidden, max_hidden, low=1)

    def build(F, seed):
        rng = np.random.default_rng(seed)
        return {
            "W1": rng.standard_normal((d_model, F)) / np.sqrt(d_model),  # (d, F)
            "b1": rng.standard_normal(F),  # (F,)
            "W2": rng.standard_normal((F, d_model)) / np.sqrt(F),  # (F, d)
            "b2": rng.standard_normal(d_model),  # (d,)
        }

    return st.builds(build, st.integers(min_hidden, max_hidden), seeds())
