"""P01 blocks 3-7: softmax and the loss, LayerNorm, GELU, multi-head attention, the MLP, the pre-norm block."""

import numpy as np


def softmax(z, axis=-1):
    z = z - z.max(axis=axis, keepdims=True)  # stable: exp never sees a large positive number
    e = np.exp(z)
    return e / e.sum(axis=axis, keepdims=True)


def cross_entropy(logits, targets):
    """Mean negative log-likelihood of the targets, computed with logsumexp."""
    z = logits - logits.max(axis=-1, keepdims=True)
    log_probs = z - np.log(np.exp(z).sum(axis=-1, keepdims=True))
    return -np.take_along_axis(log_probs, targets[..., None], axis=-1).mean()


class LayerNorm:
    def __init__(self, gain, bias, eps=1e-5):
        self.gain, self.bias, self.eps = gain, bias, eps

    def __call__(self, x):
        mu = x.mean(axis=-1, keepdims=True)
        var = ((x - mu) ** 2).mean(axis=-1, keepdims=True)  # population variance, like torch
        return (x - mu) / np.sqrt(var + self.eps) * self.gain + self.bias


class RMSNorm:
    def __init__(self, gain, eps=1e-5):
        self.gain, self.eps = gain, eps

    def __call__(self, x):
        return x / np.sqrt((x**2).mean(axis=-1, keepdims=True) + self.eps) * self.gain


def gelu(x):
    """The tanh approximation, as in GPT-2."""
    return 0.5 * x * (1 + np.tanh(np.sqrt(2 / np.pi) * (x + 0.044715 * x**3)))


class MultiHeadAttention:
    def __init__(self, Wq, Wk, Wv, Wo, n_heads, causal=True, biases=None):
        self.Wq, self.Wk, self.Wv, self.Wo = Wq, Wk, Wv, Wo
        self.H = n_heads
        self.causal = causal
        self.biases = biases or {}

    def project(self, x, W, name):
        b = self.biases.get(name)
        return x @ W if b is None else x @ W + b

    def __call__(self, x):
        B, T, d = x.shape
        dh = d // self.H

        def split(M):  # (B, T, d) -> (B, H, T, dh)
            return M.reshape(B, T, self.H, dh).transpose(0, 2, 1, 3)

        q = split(self.project(x, self.Wq, "b_q"))
        k = split(self.project(x, self.Wk, "b_k"))
        v = split(self.project(x, self.Wv, "b_v"))
        scores = q @ k.transpose(0, 1, 3, 2) / np.sqrt(dh)
        if self.causal:
            mask = np.triu(np.ones((T, T), dtype=bool), k=1)
            scores = np.where(mask, -np.inf, scores)  # mask first, then softmax
        self.weights = softmax(scores, axis=-1)
        out = (self.weights @ v).transpose(0, 2, 1, 3).reshape(B, T, d)
        return self.project(out, self.Wo, "b_o")


class FeedForward:
    def __init__(self, W1, b1, W2, b2):
        self.W1, self.b1, self.W2, self.b2 = W1, b1, W2, b2

    def __call__(self, x):
        return gelu(x @ self.W1 + self.b1) @ self.W2 + self.b2


class Block:
    """Pre-norm: x + attn(ln1(x)), then + mlp(ln2(x))."""

    def __init__(self, P, n_heads, causal=True):
        biases = {name: P[name] for name in ("b_q", "b_k", "b_v", "b_o") if name in P}
        self.ln1 = LayerNorm(P["ln1_g"], P["ln1_b"])
        self.attn = MultiHeadAttention(P["W_q"], P["W_k"], P["W_v"], P["W_o"], n_heads, causal, biases)
        self.ln2 = LayerNorm(P["ln2_g"], P["ln2_b"])
        self.mlp = FeedForward(P["W1"], P["b1"], P["W2"], P["b2"])

    def __call__(self, x):
        x = x + self.attn(self.ln1(x))
        x = x + self.mlp(self.ln2(x))
        return x
