"""P01 block 8: the tiny GPT (learned positions, tied output) and its parameter count."""

import numpy as np
from layers import Block, LayerNorm


class TinyGPT:
    def __init__(self, P, n_heads):
        self.wte, self.wpe = P["wte"], P["wpe"]
        self.blocks = [Block(bp, n_heads) for bp in P["blocks"]]
        self.ln_f = LayerNorm(P["lnf_g"], P["lnf_b"])

    def __call__(self, idx):
        idx = np.asarray(idx)
        V, max_len = self.wte.shape[0], self.wpe.shape[0]
        if idx.shape[1] > max_len:
            raise ValueError(f"sequence of {idx.shape[1]} tokens is longer than max_len={max_len}")
        if idx.size and (idx.min() < 0 or idx.max() >= V):
            raise ValueError(f"token ids must be in [0, {V})")
        x = self.wte[idx] + self.wpe[: idx.shape[1]]
        for block in self.blocks:
            x = block(x)
        return self.ln_f(x) @ self.wte.T  # weight tying: the output layer is the embedding


def count_params(V, d, L, max_len, attn_bias=True):
    embeddings = V * d + max_len * d
    attention = 4 * d * d + (4 * d if attn_bias else 0)
    mlp = d * 4 * d + 4 * d + 4 * d * d + d
    norms = 4 * d
    return embeddings + L * (attention + mlp + norms) + 2 * d
