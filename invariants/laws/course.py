"""Invariants of the P01 course's pieces: the character tokenizer, next-token batches, and the overfit gate."""

from __future__ import annotations

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

import invariants.reference.numpy as ref
from invariants.asserts import assert_equal, assert_shape, assert_value, assert_where
from invariants.inputs import valid_inputs
from invariants.protocol import ImplementationError
from invariants.registry import invariant
from invariants.strategies.core import integers, seeds
from invariants.strategies.params import GPTConfig, init_gpt_params
from invariants.strategies.text import COURSE_ALPHABET, corpora, token_streams, window_lengths

LESSON = 170  # where a lesson meets this component: the registry's order (test ids, the kill matrix's first failure)
HOLDS = ("build_vocab", "encode", "decode", "get_batch")  # the protocol functions whose laws it holds


@valid_inputs("encode")
def encode_arguments(impl, case):
    """A text and its vocabulary: the text's sorted characters (an empty text is a valid call too)."""
    corpus = case.draw(corpora(min_size=1), "corpus")
    text = corpus[: case.draw(integers(0, len(corpus)), "text's length")]
    return text, "".join(sorted(set(corpus)))


@valid_inputs("get_batch")
def get_batch_arguments(impl, case):
    """A token stream and a batch of windows that fit it."""
    data = case.draw(token_streams(), "data")
    return data, case.draw(integers(1, 4), "batch_size"), case.draw(window_lengths(len(data)), "seq_len"), case.draw(seeds(), "seed")


@invariant(
    requires=("build_vocab",),
    hint="the vocabulary is not the sorted distinct characters: kept in order of first appearance, "
         "with duplicates, or built from words, stripped or Unicode-normalised text",
)
def vocabulary_is_sorted_characters(impl, case):
    """build_vocab(text) is the text's distinct characters, each once, in code-point order."""
    text = case.draw(corpora(), "text")
    assert_value(impl.build_vocab(text), "".join(sorted(set(text))), "build_vocab(text)", "build_vocab(text)")


@invariant(
    requires=("encode", "decode"),
    hint="the tokenizer is not a bijection: characters dropped or merged (whitespace stripped, Unicode normalised), "
         "or encode and decode disagree on the ids",
)
def tokenizer_round_trip(impl, case):
    """decode(encode(t, vocab), vocab) == t for every text t over the vocabulary, the empty text included."""
    corpus = case.draw(corpora(min_size=1), "corpus")
    start = case.draw(integers(0, len(corpus)), "t's start in the corpus")
    end = case.draw(integers(start, len(corpus)), "t's end in the corpus")
    t = corpus[start:end]
    vocab = "".join(sorted(set(corpus)))
    call = "decode(encode(t, vocab), vocab) with vocab the corpus's sorted characters"
    assert_value(impl.decode(impl.encode(t, vocab), vocab), t, "decode(encode(t))", call)


@invariant(
    requires=("encode",),
    hint="ids are not positions in the vocabulary string: off by one (ids from 1), or from another table",
)
def ids_index_the_vocabulary(impl, case):
    """encode(t, vocab) is the 1-D array of each character's index in vocab: vocab[ids[i]] == t[i]."""
    corpus = case.draw(corpora(min_size=1), "corpus")
    vocab = "".join(sorted(set(corpus)))
    call = "encode(corpus, vocab) with vocab the corpus's sorted characters"
    ids = assert_shape(impl.encode(corpus, vocab), (len(corpus),), "encode(corpus)", call)
    assert_equal(ids, np.array([vocab.index(ch) for ch in corpus]), "encode(corpus)", call)


@invariant(
    requires=("get_batch",),
    hint="y is not x shifted by one (y = x, or shifted the wrong way), or the windows do not come from the data: "
         "a start drawn from range(len(data) - seq_len - 1) misses the last window and fails when only one fits",
)
def batches_shift_by_one(impl, case):
    """get_batch returns x (B, T) and y (B, T) with x[b] = data[s : s+T] and y[b] = data[s+1 : s+T+1] for some start s."""
    data = case.draw(token_streams(), "data")
    seq_len = case.draw(window_lengths(len(data)), "seq_len")
    batch_size = case.draw(integers(1, 4), "batch_size")
    seed = case.draw(seeds(), "seed")
    call = f"get_batch(data (len {len(data)}), batch_size={batch_size}, seq_len={seq_len}, seed={seed})"
    answer = impl.get_batch(data, batch_size, seq_len, seed)
    assert_value(len(answer) if isinstance(answer, tuple) else type(answer).__name__, 2, "number of arrays get_batch returned", call)
    x = assert_shape(answer[0], (batch_size, seq_len), "x", call)
    y = assert_shape(answer[1], (batch_size, seq_len), "y", call)
    assert_equal(y[:, :-1], x[:, 1:], "y[:, :-1]", call + ": y must be x shifted by one")
    windows = sliding_window_view(data, seq_len + 1)  # (n - T, T + 1): every start s
    pairs = np.concatenate([x, y[:, -1:]], axis=1)  # (B, T + 1): x[b] followed by y[b]'s last token
    found = (pairs[:, None, :] == windows[None, :, :]).all(axis=-1).any(axis=-1)  # (B,)
    strays = [int(b) for b in np.flatnonzero(~found)]
    example = f"; x[{strays[0]}]={x[strays[0]].tolist()}, y[{strays[0]}]={y[strays[0]].tolist()}" if strays else ""
    assert_value(strays, [], "batch rows b whose x[b], y[b] are not data[s : s+T], data[s+1 : s+T+1]", call + example)


OVERFIT_TEXT = "the quick brown fox jumps over the lazy dog. the dog sleeps. "  # 61 characters of the course alphabet
OVERFIT_MODEL = GPTConfig(vocab=len(COURSE_ALPHABET), max_len=64, n_layers=2, n_heads=4, d_head=8, attn_bias=False)
OVERFIT_STEPS, OVERFIT_LR, OVERFIT_TARGET = 120, 3e-3, 0.1  # Adam at the course's lr; a correct model needs ~40 steps


def _adam_trains(impl):
    """Adam cannot train in float16 (its eps and squared gradients underflow; mixed precision keeps float32 master weights)."""
    if impl.dtype == "float16":
        return "course.overfit_gate trains with Adam, which diverges to NaN in pure float16 even for a correct model; run it in float32"
    return None


@invariant(
    requires=("gpt_logits", "cross_entropy"),
    backends=("torch",),
    in_process=True,
    applies=_adam_trains,
    hint="the model cannot memorise 60 tokens, so something breaks learning: gradients cut (.detach(), .item(), numpy "
         "inside the forward), a parameter that never reaches the output, or a wrong loss",
)
def overfit_gate(impl, case):
    """A tiny model (V 28, d 32, 2 layers, 4 heads) trained with Adam through gpt_logits and cross_entropy drives its loss on 60 tokens below 0.1."""
    import torch

    ids = np.array([COURSE_ALPHABET.index(ch) for ch in OVERFIT_TEXT])  # (61,)
    x, y = impl.to_backend(ids[None, :-1]), impl.to_backend(ids[None, 1:])  # (1, 60) each: y is x shifted by one
    params = init_gpt_params(OVERFIT_MODEL, 0)

    def leaf(array):
        return impl.to_backend(array, requires_grad=True)

    tensors = {name: leaf(array) for name, array in params.items() if name != "blocks"}
    tensors["blocks"] = [{name: leaf(array) for name, array in block.items()} for block in params["blocks"]]
    leaves = [t for name, t in tensors.items() if name != "blocks"] + [t for block in tensors["blocks"] for t in block.values()]
    gpt_logits, cross_entropy = impl.raw("gpt_logits"), impl.raw("cross_entropy")
    optimizer = torch.optim.Adam(leaves, lr=OVERFIT_LR)
    call = f"{OVERFIT_STEPS} Adam steps (lr {OVERFIT_LR}) on cross_entropy(gpt_logits(x, params, {OVERFIT_MODEL.n_heads}), y)"
    try:
        for _ in range(OVERFIT_STEPS):
            loss = cross_entropy(gpt_logits(x, tensors, OVERFIT_MODEL.n_heads), y)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            if loss.item() < OVERFIT_TARGET / 2:  # stop once clearly below; the trusted loss below decides
                break
        with torch.no_grad():
            logits = impl.to_numpy(gpt_logits(x, tensors, OVERFIT_MODEL.n_heads), "gpt_logits")  # (1, 60, V)
    except Exception as exc:
        first_line = (str(exc).strip().splitlines() or [""])[0]
        raise ImplementationError(f"training through gpt_logits raised {type(exc).__name__}: {first_line}", original=exc) from None
    final = np.asarray(ref.cross_entropy(logits.astype(np.float64), ids[None, 1:]))  # the reference's loss, not the implementation's
    assert_where(final < OVERFIT_TARGET, final, "loss after training (reference cross-entropy)", f"< {OVERFIT_TARGET}", call)
