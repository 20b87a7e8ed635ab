"""Broken course pieces: an unsorted vocabulary, ids from 1, a batch that is not shifted, windows that miss the end."""

import numpy as np

from invariants.mutants import mutant


@mutant(replaces="build_vocab", killed_by="course.vocabulary_is_sorted_characters", bug="characters in order of first appearance")
def first_seen_vocab(text):
    return "".join(dict.fromkeys(text))


@mutant(replaces="encode", killed_by="course.ids_index_the_vocabulary", bug="ids counted from 1")
def one_based_encode(text, vocab):
    return np.array([vocab.index(ch) + 1 for ch in text], dtype=np.int64)


@mutant(replaces="decode", killed_by="course.tokenizer_round_trip", bug="decode drops whitespace (strips each character)")
def stripping_decode(ids, vocab):
    return "".join(vocab[int(i)].strip() for i in ids)


@mutant(
    replaces="get_batch",
    killed_by="course.batches_shift_by_one",
    bug="starts drawn from range(len(data) - seq_len - 1): the last window is never drawn",
)
def short_range_get_batch(data, batch_size, seq_len, seed):
    data = np.asarray(data)
    starts = np.random.default_rng(seed).integers(0, len(data) - seq_len - 1, size=batch_size)
    x = np.stack([data[s : s + seq_len] for s in starts])
    return x, np.stack([data[s + 1 : s + seq_len + 1] for s in starts])


@mutant(replaces="get_batch", killed_by="course.batches_shift_by_one", bug="y is x, not x shifted by one")
def unshifted_get_batch(data, batch_size, seq_len, seed):
    data = np.asarray(data)
    starts = np.random.default_rng(seed).integers(0, len(data) - seq_len, size=batch_size)
    x = np.stack([data[s : s + seq_len] for s in starts])
    return x, x.copy()


@mutant(replaces="gpt_logits", killed_by="course.overfit_gate", bug="the embeddings are detached: no gradient reaches any weight", backend="torch")
def detached_gpt_logits(ids, params, n_heads):
    import invariants.reference.torch as rt

    detached = {**params, "wte": params["wte"].detach(), "wpe": params["wpe"].detach(),
                "blocks": [{k: v.detach() for k, v in b.items()} for b in params["blocks"]]}
    return rt.gpt_logits(ids, detached, n_heads)
