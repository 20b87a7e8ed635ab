"""A P01 submission handed in half-way: the tokenizer and softmax only."""

import numpy as np

BACKEND = "numpy"


def build_vocab(text):
    return "".join(sorted(set(text)))


def encode(text, vocab):
    return np.array([vocab.index(ch) for ch in text], dtype=np.int64)


def decode(ids, vocab):
    return "".join(vocab[i] for i in ids)


def softmax(x, axis=-1):
    e = np.exp(x - x.max(axis=axis, keepdims=True))
    return e / e.sum(axis=axis, keepdims=True)
