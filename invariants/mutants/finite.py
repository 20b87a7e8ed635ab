"""Non-finite answers: NaN or ±inf from moderate inputs, through an overflow or an inf that meets 0 or another inf."""

from __future__ import annotations

import numpy as np

import invariants.reference.numpy as ref
from invariants.mutants import mutant


@mutant(dtype="float16", replaces="softmax", killed_by="finite.softmax_answer_finite",
        bug="no max subtraction in float16: exp(x) overflows for x > 11.1, and inf/inf is NaN")
def float16_unshifted_softmax(x, axis=-1):
    e = np.exp(x)  # the bug: float16 exp overflows at moderate logits
    return e / e.sum(axis=axis, keepdims=True)


@mutant(replaces="attention", killed_by="finite.attention_answer_finite",
        bug="causal mask built as -inf · triu(ones): -inf · 0 is NaN on every allowed score")
def nan_mask_attention(x, W_q, W_k, W_v, W_o, n_heads, causal=True):
    B, T, d = x.shape
    D = d // n_heads

    def split_heads(W):
        return (x @ W).reshape(B, T, n_heads, D).transpose(0, 2, 1, 3)  # (B, H, T, D)

    q, k, v = split_heads(W_q), split_heads(W_k), split_heads(W_v)
    scores = q @ k.transpose(0, 1, 3, 2) / np.sqrt(x.dtype.type(D))  # (B, H, T, T)
    if causal:
        scores = scores + -np.inf * np.triu(np.ones((T, T), dtype=x.dtype), k=1)  # the bug: -inf · 0 = NaN below the diagonal
    weights = ref.softmax(scores)
    return (weights @ v).transpose(0, 2, 1, 3).reshape(B, T, d) @ W_o, weights
