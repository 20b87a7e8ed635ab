"""Dtype leaks: code whose answers are right in value but not in dtype, as numpy 2 and torch's defaults make them.

A numpy float64 scalar (np.sqrt of an int, np.float64(eps)) or a float64 array promotes float32
to float64 under numpy 2 (NEP 50): invisible in float64, where every other invariant runs
the zoo, so these mutants run in float32 (their `dtype`). A torch buffer made in the
default dtype is float32 whatever x is: visible in float64, where the ordinary mutants run.
"""

from __future__ import annotations

import numpy as np

import invariants.reference.numpy as ref
from invariants.mutants import mutant


@mutant(dtype="float32", replaces="layer_norm", killed_by="dtypes.layer_norm_keeps_dtype",
              bug="eps made a numpy float64 scalar (np.float64(eps)): float32 inputs give float64 answers")
def float64_eps_layer_norm(x, gain, bias, eps=1e-5):
    eps = np.float64(eps)  # "make sure eps is a float": a numpy float64, which numpy 2 does not demote to x's dtype
    mean = x.mean(axis=-1, keepdims=True)
    centred = x - mean
    var = (centred * centred).mean(axis=-1, keepdims=True)
    return centred / np.sqrt(var + eps) * gain + bias


@mutant(dtype="float32", replaces="gelu", killed_by="dtypes.gelu_keeps_dtype", also_named_by=("dtypes.feed_forward_keeps_dtype",),
              bug="GELU's constant written np.sqrt(2 / np.pi), a numpy float64 scalar: float32 inputs give float64 answers")
def np_sqrt_gelu(x):
    return 0.5 * x * (1.0 + np.tanh(np.sqrt(2.0 / np.pi) * (x + 0.044715 * x**3)))


@mutant(dtype="float32", replaces="attention", killed_by="dtypes.attention_keeps_dtype",
              bug="scores scaled by 1 / np.sqrt(D), a numpy float64 scalar: float32 inputs give float64 out and weights")
def np_sqrt_scaled_attention(x, W_q, W_k, W_v, W_o, n_heads, causal=True, *, b_q=None, b_k=None, b_v=None, b_o=None):
    B, T, d = x.shape
    D = d // n_heads

    def split_heads(W, b):
        y = x @ W if b is None else x @ W + b  # (B, T, d)
        return y.reshape(B, T, n_heads, D).transpose(0, 2, 1, 3)  # (B, H, T, D)

    q, k, v = split_heads(W_q, b_q), split_heads(W_k, b_k), split_heads(W_v, b_v)
    scores = q @ k.transpose(0, 1, 3, 2) / np.sqrt(D)  # the bug: np.sqrt of an int is a numpy float64
    if causal:
        scores = np.where(np.triu(np.ones((T, T), dtype=bool), k=1), -np.inf, scores)
    weights = ref.softmax(scores)
    merged = (weights @ v).transpose(0, 2, 1, 3).reshape(B, T, d)
    return (merged @ W_o if b_o is None else merged @ W_o + b_o), weights


@mutant(dtype="float32", replaces="load_balancing_loss", killed_by="dtypes.load_balancing_loss_keeps_dtype",
              bug="routing shares f = counts / (N·k) left float64 (np.bincount's counts divide to float64): a float64 loss")
def float64_shares_balance_loss(router_logits, k):
    N, E = router_logits.shape
    f = ref.tokens_per_expert(router_logits, k) / (N * k)  # the bug: int64 counts / int is float64, never cast back
    P = ref.softmax(router_logits).mean(axis=0)
    return E * np.sum(f * P)


@mutant(backend="torch", replaces="moe", killed_by="dtypes.moe_keeps_dtype",
        bug="output buffer torch.zeros(N, d) in torch's default dtype (float32), not zeros_like(x): float64 answers come back float32")
def default_dtype_buffer_moe(x, router, experts, k):
    import torch

    import invariants.reference.torch as tref

    gates = tref.top_k_gates(x @ router, k)  # (N, E)
    out = torch.zeros(x.shape, device=x.device)  # the bug: float32 whatever x is
    for e, expert in enumerate(experts):
        chosen = gates[:, e] > 0
        if chosen.any():
            out[chosen] += gates[chosen, e : e + 1] * tref.feed_forward(x[chosen], **expert)
    return out
