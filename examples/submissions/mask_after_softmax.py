"""A P01 submission in one file, functional style, with one classic bug: the causal mask is applied
after the softmax (future weights are zeroed, but the rows no longer sum to 1 and the scores of
the future still shaped the past)."""

import numpy as np

BACKEND = "numpy"


def build_vocab(text):
    return "".join(sorted(set(text)))


def encode(text, vocab):
    lookup = {ch: i for i, ch in enumerate(vocab)}
    return np.array([lookup[ch] for ch in text], dtype=np.int64)


def decode(ids, vocab):
    return "".join(vocab[int(i)] for i in ids)


def get_batch(data, batch_size, seq_len, seed):
    rng = np.random.default_rng(seed)
    starts = rng.integers(0, len(data) - seq_len, size=batch_size)
    return np.stack([data[s : s + seq_len] for s in starts]), np.stack([data[s + 1 : s + seq_len + 1] for s in starts])


def softmax(x, axis=-1):
    e = np.exp(x - x.max(axis=axis, keepdims=True))
    return e / e.sum(axis=axis, keepdims=True)


def cross_entropy(logits, targets):
    z = logits - logits.max(axis=-1, keepdims=True)
    logp = z - np.log(np.exp(z).sum(axis=-1, keepdims=True))
    return -np.take_along_axis(logp, targets[..., None], axis=-1).mean()


def layer_norm(x, gain, bias, eps=1e-5):
    mu = x.mean(-1, keepdims=True)
    return (x - mu) / np.sqrt(((x - mu) ** 2).mean(-1, keepdims=True) + eps) * gain + bias


def gelu(x):
    return 0.5 * x * (1 + np.tanh(np.sqrt(2 / np.pi) * (x + 0.044715 * x**3)))


def attention(x, W_q, W_k, W_v, W_o, n_heads, causal=True):
    B, T, d = x.shape
    dh = d // n_heads
    q, k, v = (np.transpose((x @ W).reshape(B, T, n_heads, dh), (0, 2, 1, 3)) for W in (W_q, W_k, W_v))
    weights = softmax(q @ np.swapaxes(k, -1, -2) / np.sqrt(dh))
    if causal:
        weights = weights * np.tril(np.ones((T, T)))  # BUG: masks after the softmax
    out = np.transpose(weights @ v, (0, 2, 1, 3)).reshape(B, T, d)
    return out @ W_o, weights


def feed_forward(x, W1, b1, W2, b2):
    return gelu(x @ W1 + b1) @ W2 + b2


def transformer_block(x, p, n_heads, causal=True):
    attn, _ = attention(layer_norm(x, p["ln1_g"], p["ln1_b"]), p["W_q"], p["W_k"], p["W_v"], p["W_o"], n_heads, causal)
    x = x + attn
    return x + feed_forward(layer_norm(x, p["ln2_g"], p["ln2_b"]), p["W1"], p["b1"], p["W2"], p["b2"])


def gpt_logits(ids, params, n_heads):
    V, max_len = params["wte"].shape[0], params["wpe"].shape[0]
    if ids.shape[1] > max_len or ids.min() < 0 or ids.max() >= V:
        raise ValueError("ids out of range or sequence too long")
    x = params["wte"][ids] + params["wpe"][: ids.shape[1]]
    for p in params["blocks"]:
        x = transformer_block(x, p, n_heads)
    return layer_norm(x, params["lnf_g"], params["lnf_b"]) @ params["wte"].T
