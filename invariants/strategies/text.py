"""Corpora for the character tokenizer and token streams for next-token batches (the P01 course's data side)."""

from __future__ import annotations

import numpy as np
from hypothesis import strategies as st
from hypothesis.strategies import SearchStrategy

from invariants.strategies._validation import check_int, check_int_range, check_order
from invariants.strategies.core import byte_arrays, cached_strategy, integers, permutation_of, sampled_from

__all__ = ["corpora", "token_streams", "window_lengths"]

COURSE_ALPHABET = " .abcdefghijklmnopqrstuvwxyz"  # the course corpus's 28 characters
TRICKY_CHARACTERS = "\n\t \u00a0e\u0301\u00e9\u00df\u4e2d\U0001f642"  # whitespace, a combining accent, é (one code point), ß, 中, an emoji


@cached_strategy
def corpora(*, min_size: int = 0, max_size: int = 80) -> SearchStrategy[str]:
    """Strings of min_size to max_size characters (code points) to build a character vocabulary from.

    Mixes course-like text (lowercase, spaces, full stops), arbitrary Unicode, and on purpose:
    a single character repeated (a vocabulary of one), whitespace and newlines (a tokenizer
    that splits or strips loses them), a combining accent next to a precomposed é (a tokenizer
    that normalises Unicode merges them) and characters outside the Basic Multilingual Plane.
    """
    check_int_range("size", min_size, max_size, low=0)
    alphabets = sampled_from((COURSE_ALPHABET, TRICKY_CHARACTERS, COURSE_ALPHABET + TRICKY_CHARACTERS))
    from_alphabet = alphabets.flatmap(lambda chars: st.text(alphabet=chars, min_size=min_size, max_size=max_size))
    repeated = st.builds(lambda ch, n: ch * n, st.characters(), integers(max(min_size, 1), max(max_size, 1)))
    if max_size == 0:
        repeated = st.just("")
    return st.one_of(from_alphabet, st.text(min_size=min_size, max_size=max_size), repeated)


@cached_strategy
def token_streams(*, min_vocab: int = 1, max_vocab: int = 30, min_length: int = 2, max_length: int = 64) -> SearchStrategy[np.ndarray]:
    """1-D int64 arrays of n token ids, n in [min_length, max_length], ids in [0, vocab) with vocab in [min_vocab, max_vocab].

    Generates on purpose streams of distinct ids (a shuffle of 0 .. n - 1, a vocabulary of n:
    every window then occurs once, so its origin in the stream is unambiguous) and streams of
    one repeated id (every window is the same).
    """
    check_int_range("vocab", min_vocab, max_vocab, low=1)
    check_int_range("length", min_length, max_length, low=1)

    @st.composite
    def streams(draw):
        vocab, n = draw(integers(min_vocab, max_vocab)), draw(integers(min_length, max_length))
        pattern = draw(sampled_from(("random", "distinct", "one repeated id")))
        b = draw(byte_arrays((n,))).astype(np.int64)
        if pattern == "distinct":
            return permutation_of(b).astype(np.int64)  # 0 .. n - 1 in the order that sorts the bytes
        if pattern == "one repeated id":
            return np.full(n, vocab - 1, dtype=np.int64)
        return b % vocab if vocab <= 256 else b * vocab // 256

    return streams()


@cached_strategy
def window_lengths(n_tokens: int, *, min_seq: int = 1, max_seq: int | None = None) -> SearchStrategy[int]:
    """seq_len values for get_batch on a stream of n_tokens: in [min_seq, max_seq], max_seq defaulting to n_tokens - 1.

    Hits the longest window (n_tokens - 1, where exactly one start position remains: the
    off-by-one edge) on purpose, not only by chance.
    """
    check_int("n_tokens", n_tokens, low=2)
    max_seq = n_tokens - 1 if max_seq is None else max_seq
    check_int_range("seq", min_seq, max_seq, low=1)
    check_order("max_seq", max_seq, "n_tokens - 1", n_tokens - 1)
    return st.one_of(st.just(max_seq), integers(min_seq, max_seq))
