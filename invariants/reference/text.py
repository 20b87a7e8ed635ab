"""The P01 course's data side: a character tokenizer and next-token batches.

Functional, so that it crosses the protocol boundary: the vocabulary is a string of the
distinct characters of the corpus, sorted, and a token id is an index into it.
"""

from __future__ import annotations

import numpy as np


def build_vocab(text):
    """The sorted distinct characters of `text`: the tokenizer's whole vocabulary."""
    return "".join(sorted(set(text)))


def encode(text, vocab):
    """Characters -> ids (a 1-D int64 array); a character outside `vocab` is a ValueError."""
    index = {ch: i for i, ch in enumerate(vocab)}
    unknown = sorted(set(text) - index.keys())
    if unknown:
        raise ValueError(f"characters {''.join(unknown)!r} are not in the vocabulary")
    return np.array([index[ch] for ch in text], dtype=np.int64)


def decode(ids, vocab):
    """Ids -> characters: the inverse of encode."""
    return "".join(vocab[int(i)] for i in ids)


def get_batch(data, batch_size, seq_len, seed):
    """Random windows of `data` (1-D ids): x (batch, seq) and y, the same windows shifted by one."""
    data = np.asarray(data)
    if len(data) < seq_len + 1:
        raise ValueError(f"data has {len(data)} tokens; windows of seq_len {seq_len} need at least {seq_len + 1}")
    starts = np.random.default_rng(seed).integers(0, len(data) - seq_len, size=batch_size)  # (batch,)
    x = np.stack([data[s : s + seq_len] for s in starts])  # (batch, seq)
    y = np.stack([data[s + 1 : s + seq_len + 1] for s in starts])  # (batch, seq): the next token
    return x, y
