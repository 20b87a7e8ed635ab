"""Hidden-reach mutants: bugs on one shape only, which the ci profile's examples miss and a longer search finds.

A shape-keyed kernel table (what a JIT, an autotuner or a hand-written dispatch builds) sends one
input shape down its own code path; a bug in that path shows on that shape alone. These are the
bugs that more examples buy (docs/power.md, "The soak beyond one machine"): every ci run of the
whole suite passes them, and a few hundred random examples of the right component find them.
Kept apart from the zoo (not in ZOO_MODULES, not in invariants.mutants.MUTANTS), as invariants.mutants.documented is, so
the kill matrix's figures stay the zoo's. Each is also an --impl target:

    pytest --pyargs invariants --impl invariants.mutants.reach:layer_norm_tile_1x11 --invariants-profile ci   # passes
"""

from __future__ import annotations

import numpy as np

import invariants.reference.numpy as ref
from invariants.mutants import Mutant


def _layer_norm_tile_1x11(x, gain, bias, eps=ref.EPS):
    if x.shape[-2:] == (1, 11):  # the (1 row, 11 features) kernel: the sample variance, d - 1
        centred = x - x.mean(axis=-1, keepdims=True)  # (1, 11)
        var = (centred * centred).sum(axis=-1, keepdims=True) / (x.shape[-1] - 1)  # BUG: unbiased
        return centred / np.sqrt(var + eps) * gain + bias
    return ref.layer_norm(x, gain, bias, eps)


def _attention_tile_2x7x3(x, W_q, W_k, W_v, W_o, n_heads, causal=True, **biases):
    B, T, d = x.shape
    if not (causal and B == 2 and T == 7 and n_heads == 3):
        return ref.attention(x, W_q, W_k, W_v, W_o, n_heads, causal, **biases)
    weights = ref.attention(x, W_q, W_k, W_v, W_o, n_heads, False, **biases)[1]  # (B, H, T, T), unmasked
    weights = np.where(np.triu(np.ones((T, T), dtype=bool), k=1), 0.0, weights)  # BUG: the mask after the softmax (2 × 7 tokens, 3 heads)
    v = (x @ W_v if biases.get("b_v") is None else x @ W_v + biases["b_v"]).reshape(B, T, n_heads, d // n_heads).transpose(0, 2, 1, 3)
    merged = (weights @ v).transpose(0, 2, 1, 3).reshape(B, T, d)  # (B, H, T, D) -> (B, T, d)
    return (merged @ W_o if biases.get("b_o") is None else merged @ W_o + biases["b_o"]), weights


REACH = {
    m.name: m
    for m in (
        Mutant("reach.layer_norm_tile_1x11", "LayerNorm of a (1, 11) input divides the variance by d - 1 (one shape's kernel)",
               "norms.layer_norm_row_statistics", "numpy", "layer_norm", _layer_norm_tile_1x11),
        Mutant("reach.attention_tile_2x7x3", "causal attention of 2 sequences of 7 tokens over 3 heads masks after the softmax (one shape's kernel)",
               "attention.causal_weights_pattern", "numpy", "attention", _attention_tile_2x7x3),
    )
}
layer_norm_tile_1x11 = REACH["reach.layer_norm_tile_1x11"].namespace()  # --impl invariants.mutants.reach:layer_norm_tile_1x11
attention_tile_2x7x3 = REACH["reach.attention_tile_2x7x3"].namespace()
