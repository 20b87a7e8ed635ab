"""Invariants of incremental decoding with a KV cache: any decode schedule gives the full forward's logits; the cache's law.

llama_decode(ids (B, T), params, n_heads, n_kv_heads, rope_base, window, chunks) runs a prefill of
chunks[0] tokens and then each further chunk on the cache the implementation owns, and returns
the logits of every position (B, T, V) and what its cache holds after each chunk: the positions
of the keys in its slots (any layout: growing, preallocated, a ring of w slots), or, for a
cache that grows by what it holds, its size (the number of cached values, all layers, keys and
values). Splits that straddle a window's edge are drawn first and often (decode_schedules(straddling=w)),
where ring and trimmed window caches break. Shipped slips it catches: a new token's position
counted from 0 instead of past_length (pytorch/executorch#2010), the offset advanced by the prompt
length twice (skyzh/tiny-llm#46), chunked prefill with the chunk's own positions
(huggingface/transformers#43082), a chunk's causal mask aligned top-left over the cache.
Decoding is compared with the full forward to rounding, never bitwise: other shapes take other kernels.
"""

from __future__ import annotations

import numpy as np
from hypothesis import strategies as st

from invariants.asserts import assert_close, assert_equal, assert_shape, assert_value, assert_where
from invariants.conventions import declared
from invariants.inputs import valid_inputs
from invariants.laws.llama import draw_one_layer_config, logits_against_reference, model_case, model_condition, named_sizes, sizes
from invariants.protocol import ROUNDINGS, ImplementationError, describe_call
from invariants.registry import invariant
from invariants.strategies.decoder import decode_schedules, llama_params
from invariants.strategies.params import token_ids

LESSON = 140  # where a lesson meets this component: the registry's order (test ids, the kill matrix's first failure)
HOLDS = ("llama_decode",)  # the protocol functions whose laws it holds
TOOLKIT_ERROR = "ToolkitError"  # invariants.adapters.toolkit's own errors (its type's name, as the gate's worker reports it): never a refusal


def schedules_for(impl, seq, window, *, min_chunks=1, straddling=False):
    """decode_schedules of seq narrowed to the chunks impl declares it takes (MAX_DECODE_CHUNK, CHUNKS_WITHIN_WINDOW,
    DECODE_CHUNKS_WITHIN_WINDOW); straddling: only those that straddle the window's edge."""
    chunks_within = declared(impl, "CHUNKS_WITHIN_WINDOW") or declared(impl, "DECODE_CHUNKS_WITHIN_WINDOW")
    within = window if window is not None and chunks_within else None
    limits = [n for n in (within, declared(impl, "MAX_DECODE_CHUNK")) if n is not None]
    return decode_schedules(seq, min_chunks=min_chunks, max_prefill=within, max_chunk=min(limits, default=None),
                            straddling=window if straddling else None)


@valid_inputs("llama_decode")
def llama_decode_arguments(impl, case):
    """One-layer Llama weights, a 2- or 3-token prompt and a split of it into chunks the implementation declares it takes."""
    config = draw_one_layer_config(impl, case)
    params = case.draw(llama_params(config), "params")
    ids = case.draw(token_ids(config.vocab, max_batch=1, min_seq=2, max_seq=3), "ids")
    chunks = case.draw(schedules_for(impl, ids.shape[1], config.window), "chunks")  # the chunks it declares it takes
    return ids, params, config.n_heads, config.n_kv_heads, config.rope_base, config.window, chunks


def decode_case(impl, case, *, min_chunks=1, **options):
    """A config, params, ids and a schedule for llama_decode; the first branch (drawn first) straddles a window's edge:
    w >= 2, more than w tokens, a prefill shorter than w and a chunk of 2 to w tokens that ends past w - 1."""
    edge = declared(impl, "SLIDING_WINDOW") and (declared(impl, "MAX_DECODE_CHUNK") or 2) >= 2
    at_edge = edge and case.draw(st.sampled_from((True, False)), "at the window's edge")
    if at_edge:
        config, params, ids = model_case(impl, case, windowed=True, min_window=2, max_window=5, edge=True, **options)
    else:
        config, params, ids = model_case(impl, case, min_seq=2 if min_chunks > 1 else 1, decoding=True, **options)
    chunks = case.draw(schedules_for(impl, ids.shape[1], config.window, min_chunks=min_chunks, straddling=at_edge), "chunks")
    return config, params, ids, chunks


def decode(impl, ids, params, config, chunks, call):
    """impl.llama_decode's (logits (B, T, V), what its cache holds), shapes checked; a raised error is reported as a refusal."""
    __tracebackhide__ = True
    try:
        answer = impl.llama_decode(ids, params, *sizes(config), chunks)
    except ImplementationError as exc:
        if type(exc.original).__name__ == TOOLKIT_ERROR:  # the adapter's toolkit failed, not the code: no declaration would help
            raise
        raise ImplementationError(
            f"llama_decode refused chunks={chunks.tolist()} at window={config.window} ({exc}): if it takes no such split, declare "
            "MAX_DECODE_CHUNK or CHUNKS_WITHIN_WINDOW (docs/protocol.md); otherwise it crashed", original=exc.original, refused=True) from None
    assert_value(len(answer) if isinstance(answer, tuple) else 1, 2, "number of arrays llama_decode returned (logits, cache)", call)
    logits = assert_shape(answer[0], (*ids.shape, config.vocab), "decoded logits", call)
    held = answer[1]
    if np.ndim(held) != 1:  # cache_positions (n, L, H_kv, S)
        return logits, assert_shape(held, (len(chunks), config.n_layers, config.n_kv_heads, np.shape(held)[-1]),
                                    "cache positions (chunks, layers, kv heads the cache stores, slots)", call)
    return logits, assert_shape(held, chunks.shape, "cache sizes (one per chunk)", call)


@invariant(
    requires=("llama_decode", "llama_logits"),
    hint="a decode step puts its tokens at the wrong positions (from 0 in every chunk instead of from past_length, or the offset "
    "advanced twice), aligns its causal mask top-left over the cache, replaces the cache instead of extending it or rotates "
    "cached keys again; or a window cache drops keys a chunk's earlier queries still see, or shows them the chunk's later keys",
)
def decode_matches_full_forward(impl, case):
    """Decoding in chunks split anywhere (a prefill, then one or more tokens at a time) gives the full forward's logits at every
    position, to rounding."""
    config, params, ids, chunks = decode_case(impl, case, min_chunks=2)  # one chunk would be a plain forward
    T, w = ids.shape[1], config.window
    shown = named_sizes(config, ids=ids, chunks=chunks)
    if w is not None and T > w and declared(impl, "CHUNKS_WITHIN_WINDOW"):  # its own full forward refuses T > w
        call = describe_call("llama_decode", shown, "vs the reference's llama_logits (its own full forward takes at most w tokens)")
        logits, _ = decode(impl, ids, params, config, chunks, call)
        logits_against_reference(impl, logits, ids, params, config, "decoded logits", call)
        return
    call = describe_call("llama_decode", shown, "vs llama_logits on the whole sequence")
    logits, _ = decode(impl, ids, params, config, chunks, call)
    full = assert_shape(impl.llama_logits(ids, params, *sizes(config)), logits.shape, "llama_logits output", call)
    # the two paths round every step differently, and the norms magnify that where the residual stream cancels
    tol = impl.tolerance.scaled(ROUNDINGS["llama_block"] * max(1, config.n_layers)).conditioned(model_condition(impl, ids, params, config))
    tol = tol.at_scale(float(np.abs(full).max(initial=0.0)))
    disagrees = ~tol.allows(logits.astype(np.float64), full.astype(np.float64)).all(axis=(0, 2))  # (T,)
    starts = np.cumsum([0, *np.asarray(chunks).reshape(-1).tolist()])[:-1]
    assert_close(logits, full, "decoded logits", tol, call, first_position=int(np.argmax(disagrees)) if disagrees.any() else None,
                 chunk_starts=[int(s) for s in starts], window=w)


@invariant(
    requires=("llama_decode",),
    hint="the cache stores keys per query head (repeated before caching: the point of GQA lost), holds a position twice (the "
    "whole cache appended again, or positions restarting at 0 each chunk), holds the wrong positions (an offset counted twice), "
    "is replaced by each chunk instead of extended, or keeps fewer than the w - 1 most recent positions a window's next query needs",
)
def cache_size_law(impl, case):
    """After t tokens each layer's cache holds the keys of H_kv heads at positions 0 .. t - 1, each once (with a window w, at least
    the last w - 1 of them: what the next query needs besides its own); a size is 2·L·B·H_kv·D values per position held."""
    config, params, ids, chunks = decode_case(impl, case, min_group=2)
    call = describe_call("llama_decode", named_sizes(config, ids=ids, chunks=chunks))
    _, held = decode(impl, ids, params, config, chunks, call)
    t = np.cumsum(chunks)  # tokens seen after each chunk
    first_needed = np.zeros_like(t) if config.window is None else np.maximum(t - config.window + 1, 0)  # (n,): the oldest still needed
    if held.ndim == 1:
        _sizes_law(held, config, ids.shape[0], t, call)
        return
    positions = np.arange(ids.shape[1])  # (T,)
    times = (held[..., None] == positions).sum(axis=-2)  # (n, L, H_kv, T): how often each position is held
    must = (positions < t[:, None, None, None]) & (positions >= first_needed[:, None, None, None])  # (n, 1, 1, T): held once
    assert_where((held == -1) | ((held >= 0) & (held < t[:, None, None, None])), held, "cache positions",
                 f"-1 (an empty slot) or a position already seen (< t, t = {t.tolist()})", call)
    assert_where((times <= 1) & (times >= must), times, "how often each position is held, per chunk, layer and kv head",
                 f"once for positions {'0' if config.window is None else 'max(0, t - w + 1)'} .. t - 1, at most once before, t = {t.tolist()}",
                 call)


def _sizes_law(cache_sizes, config, batch, t, call):
    """The law for a cache reported by its size: 2·L·B·H_kv·D·t values; with a window, from ·min(t, w - 1) to ·t."""
    __tracebackhide__ = True
    per_token = 2 * config.n_layers * batch * config.n_kv_heads * config.d_head  # keys and values of one position, all layers
    if config.window is None:
        assert_equal(cache_sizes, per_token * t, f"cache sizes (2·L·B·H_kv·D = {per_token} values per token)", call)
        return
    low, high = per_token * np.minimum(t, config.window - 1), per_token * t
    assert_where((cache_sizes >= low) & (cache_sizes <= high), cache_sizes, "cache sizes",
                 f"between {per_token}·min(t, w - 1) and {per_token}·t, t = {t.tolist()}", call)
