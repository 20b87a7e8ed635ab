"""Invariants of incremental decoding with a KV cache: any decode schedule gives the full forward's logits; the cache's size law.

llama_decode(ids (B, T), params, n_heads, n_kv_heads, rope_base, window, chunks) runs a prefill of
chunks[0] tokens and then each further chunk on the cache the implementation owns, and returns
the logits of every position (B, T, V) and the cache's size after each chunk (the number of
cached values, all layers, keys and values). Shipped slips it catches: a new token's position
counted from 0 instead of past_length (pytorch/executorch#2010), the offset advanced by the prompt
length twice (skyzh/tiny-llm#46), chunked prefill with the chunk's own positions
(huggingface/transformers#43082), a chunk's causal mask aligned top-left over the cache.
Decoding is compared with the full forward to rounding, never bitwise: other shapes take other kernels.
"""

from __future__ import annotations

import numpy as np

from invariants.asserts import assert_close, assert_equal, assert_shape, assert_value, assert_where
from invariants.llama import ROUNDINGS, model_case, model_condition, sizes
from invariants.registry import invariant
from strategies.decoder import decode_schedules


def _call(config, ids, chunks, note=""):
    text = (f"llama_decode(ids{list(ids.shape)}, params, n_heads={config.n_heads}, n_kv_heads={config.n_kv_heads}, "
            f"rope_base={config.rope_base!r}, window={config.window}, chunks={chunks.tolist()})")
    return f"{text} {note}" if note else text


def decode(impl, ids, params, config, chunks, call):
    """impl.llama_decode's (logits (B, T, V), cache_sizes (n,)), shapes checked."""
    __tracebackhide__ = True
    answer = impl.llama_decode(ids, params, *sizes(config), chunks)
    assert_value(len(answer) if isinstance(answer, tuple) else 1, 2, "number of arrays llama_decode returned (logits, cache_sizes)", call)
    logits = assert_shape(answer[0], (*ids.shape, config.vocab), "decoded logits", call)
    return logits, assert_shape(answer[1], chunks.shape, "cache sizes (one per chunk)", call)


@invariant(
    requires=("llama_decode", "llama_logits"),
    hint="a decode step puts its tokens at the wrong positions (counted from 0 in every chunk instead of from past_length, or "
    "the offset advanced twice), its causal mask is aligned top-left over the cache (the new query sees key 0 only), the "
    "cache is replaced instead of extended, or the cached keys are stored before RoPE and rotated again",
)
def decode_matches_full_forward(impl, case):
    """Decoding in chunks split anywhere (a prefill, then one or more tokens at a time) gives the full forward's logits at every
    position, to rounding."""
    config, params, ids = model_case(impl, case, min_seq=2)
    chunks = case.draw(decode_schedules(ids.shape[1], min_chunks=2), "chunks")  # one chunk would be a plain forward
    call = _call(config, ids, chunks, "vs llama_logits on the whole sequence")
    logits, _ = decode(impl, ids, params, config, chunks, call)
    full = assert_shape(impl.llama_logits(ids, params, *sizes(config)), logits.shape, "llama_logits output", call)
    # the two paths round every step differently, and the norms magnify that where the residual stream cancels
    tol = impl.tolerance.scaled(ROUNDINGS * max(1, config.n_layers)).conditioned(model_condition(impl, ids, params, config))
    assert_close(logits, full, "decoded logits", tol.at_scale(float(np.abs(full).max(initial=0.0))), call)


@invariant(
    requires=("llama_decode",),
    hint="the cache holds more than the keys and values of the tokens seen: keys repeated for every query head before caching "
    "(H / H_kv times the size: the point of GQA lost), the whole cache appended again each step, or the queries cached too; "
    "or it holds fewer than a window needs, or than the tokens seen (the cache replaced by each chunk instead of extended)",
)
def cache_size_law(impl, case):
    """After t tokens the cache holds 2·L·B·H_kv·D·t values; with a window w, at most that and at least 2·L·B·H_kv·D·min(t, w - 1)
    (the keys the next query needs besides its own)."""
    config, params, ids = model_case(impl, case, min_group=2)
    chunks = case.draw(decode_schedules(ids.shape[1]), "chunks")
    call = _call(config, ids, chunks)
    _, cache_sizes = decode(impl, ids, params, config, chunks, call)
    per_token = 2 * config.n_layers * ids.shape[0] * config.n_kv_heads * config.d_head  # keys and values of one position, all layers
    t = np.cumsum(chunks)  # tokens seen after each chunk
    if config.window is None:
        assert_equal(cache_sizes, per_token * t, f"cache sizes (2·L·B·H_kv·D = {per_token} values per token)", call)
        return
    low, high = per_token * np.minimum(t, config.window - 1), per_token * t
    assert_where((cache_sizes >= low) & (cache_sizes <= high), cache_sizes, "cache sizes",
                 f"between {per_token}·min(t, w - 1) and {per_token}·t, t = {t.tolist()}", call)

