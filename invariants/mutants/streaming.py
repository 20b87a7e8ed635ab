"""Broken StreamingLLM caches: each a bug that shipped in a rolling cache with attention sinks (cited)."""

import numpy as np

from invariants.mutants import mutant
from invariants.reference.numpy import gqa_attention, rope, streaming_attention, streaming_held


@mutant(
    replaces="streaming_held",
    killed_by="streaming.streaming_sees_sinks_and_window",
    also_named_by=("streaming.streaming_attention_agrees_with_reference",),
    bug="the first n_sink + 1 tokens kept, not n_sink: n_keep counted one more for a BOS the model may not have (ggml-org/llama.cpp#5622)",
)
def one_sink_too_many_streaming_held(t, n_sink, cache_size):
    return streaming_held(t, min(n_sink + 1, cache_size - 1), cache_size)  # BUG: + 1


@mutant(
    replaces="streaming_held",
    killed_by="streaming.streaming_sees_sinks_and_window",
    also_named_by=("streaming.streaming_cache_law",),
    bug="the sinks evicted with the window: a plain sliding window of cache_size tokens, the BOS erased (nomic-ai/gpt4all#956)",
)
def sinks_evicted_streaming_held(t, n_sink, cache_size):
    return list(range(max(0, t + 1 - cache_size), t + 1))  # BUG: no sinks kept


@mutant(
    replaces="streaming_held",
    killed_by="streaming.streaming_sees_sinks_and_window",
    bug="the newest cached token evicted instead of the oldest one after the sinks (JaydenLyh/Reward-Forcing#5)",
)
def newest_evicted_streaming_held(t, n_sink, cache_size):
    if t < cache_size:
        return list(range(t + 1))
    return [*range(cache_size - 1), t]  # BUG: slot cache_size - 1 rewritten each step, the window frozen behind it


@mutant(
    replaces="streaming_held",
    killed_by="streaming.streaming_without_sinks_is_sliding_window",
    also_named_by=("streaming.streaming_sees_sinks_and_window",),
    bug="the window one key too wide: cache_size - n_sink tokens before the query, itself extra (sgl-project/sglang#26147)",
)
def wide_window_streaming_held(t, n_sink, cache_size):
    return streaming_held(t, n_sink, cache_size + 1)  # BUG: + 1


@mutant(
    replaces="streaming_attention",
    killed_by="streaming.streaming_positions_within_the_cache",
    also_named_by=("streaming.streaming_attention_agrees_with_reference",),
    bug="RoPE at the positions in the text: the keys a query sees and the query itself rotated where they stand in the stream, "
    "not within the cache, so the sinks drift away (huggingface/transformers#31581, #33691)",
)
def text_positions_streaming_attention(q, k, v, n_sink, cache_size, rope_base=10_000.0, *, pairing="half_split"):
    T = q.shape[2]
    positions = np.arange(T)
    q, k = rope(q, positions, rope_base, pairing=pairing), rope(k, positions, rope_base, pairing=pairing)  # BUG: the text's positions
    visible = np.zeros((T, T), dtype=bool)
    for t in range(T):
        visible[t, streaming_held(t, n_sink, cache_size)] = True
    out, weights = np.zeros_like(q), np.zeros(q.shape[:3] + (T,), dtype=q.dtype)
    for t in range(T):
        held = np.flatnonzero(visible[t])
        out[:, :, t:t + 1], weights[:, :, t:t + 1, held] = gqa_attention(q[:, :, t:t + 1], k[:, :, held], v[:, :, held], False)
    return out, weights


@mutant(
    replaces="streaming_decode",
    killed_by="streaming.streaming_decode_matches_attention",
    bug="transformers' SinkCache driven at the positions in the text: each new key rotated at its text position while the cached "
    "window is re-rotated back one position per eviction, so the cache's positions are not consecutive (huggingface/transformers#33691)",
)
def text_position_sink_cache_streaming_decode(q, k, v, n_sink, cache_size, rope_base=10_000.0, *, pairing="half_split"):
    B, H, T, D = q.shape
    out, held = np.zeros_like(q), np.full((T, cache_size), -1, dtype=np.int64)
    tokens, keys, values = [], [], []  # the cache: token ids, rotated keys (B, H_kv, 1, D) and values
    for t in range(T):
        if len(tokens) == cache_size:  # full: evict the oldest after the sinks, shift the rest of the window back one slot
            window = np.concatenate(keys[n_sink + 1:], axis=2) if cache_size > n_sink + 1 else None
            shifted = [] if window is None else np.split(rope(window, [-1] * window.shape[2], rope_base, pairing=pairing), window.shape[2], axis=2)
            tokens, keys, values = tokens[:n_sink] + tokens[n_sink + 1:], keys[:n_sink] + shifted, values[:n_sink] + values[n_sink + 1:]
        tokens.append(t)
        keys.append(rope(k[:, :, t:t + 1], [t], rope_base, pairing=pairing))  # BUG: the text's position t, not the slot's
        values.append(v[:, :, t:t + 1])
        query = rope(q[:, :, t:t + 1], [t], rope_base, pairing=pairing)
        out[:, :, t:t + 1] = gqa_attention(query, np.concatenate(keys, axis=2), np.concatenate(values, axis=2), False)[0]
        held[t, :len(tokens)] = tokens
    return out, held


@mutant(
    replaces="streaming_decode",
    killed_by="streaming.streaming_cache_law",
    bug="the cache never trimmed: every key kept and the attention masked to the sinks and the window, memory growing without "
    "bound (vivekkalyanarangan30/llm_from_scratch#3)",
)
def untrimmed_streaming_decode(q, k, v, n_sink, cache_size, rope_base=10_000.0, *, pairing="half_split"):
    T = q.shape[2]
    held = np.where(np.arange(T)[None, :] <= np.arange(T)[:, None], np.arange(T)[None, :], -1)  # BUG: (T, T), every token seen
    return streaming_attention(q, k, v, n_sink, cache_size, rope_base, pairing=pairing)[0], held
