"""P01 block 1-2: a character tokenizer and random training windows."""

import numpy as np


class CharTokenizer:
    """Every distinct character of the corpus is one token; ids follow the sorted order."""

    def __init__(self, text):
        self.vocab = sorted(set(text))
        self.stoi = {ch: i for i, ch in enumerate(self.vocab)}
        self.itos = dict(enumerate(self.vocab))

    @classmethod
    def from_vocab(cls, vocab):
        """A tokenizer whose ids index `vocab` as given."""
        tok = cls("")
        tok.vocab = list(vocab)
        tok.stoi = {ch: i for i, ch in enumerate(tok.vocab)}
        tok.itos = dict(enumerate(tok.vocab))
        return tok

    @property
    def size(self):
        return len(self.vocab)

    def encode(self, text):
        missing = [ch for ch in text if ch not in self.stoi]
        if missing:
            raise ValueError(f"unknown characters {''.join(sorted(set(missing)))!r}")
        return np.array([self.stoi[ch] for ch in text], dtype=np.int64)

    def decode(self, ids):
        return "".join(self.itos[int(i)] for i in ids)


def get_batch(data, B, T, rng):
    """B random windows of length T, and the same windows shifted by one token (the targets)."""
    starts = rng.integers(0, len(data) - T, size=B)
    x = np.stack([data[s : s + T] for s in starts])
    y = np.stack([data[s + 1 : s + T + 1] for s in starts])
    return x, y
