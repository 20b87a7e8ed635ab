"""A second held-out set of decoder bugs (issue 35 §2), written from classes of bugs that shipped, before the likely-bug line's
measured rules were written and without reading them; frozen once written: its figures are measured, never tuned on.

Each is the numpy reference with one function replaced, as a user's own decoder would be wrong: some in the protocol's own
functions (gqa_attention, llama_decode), some only inside the block, where only the block, model and decode laws see them.
Each bug's `cause` is a kind of tests/heldout_bugs.KINDS, the vocabulary the likely-bug line is graded in.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
from heldout_bugs import HeldOut

import invariants.reference.numpy as ref

HELD_OUT_2: dict[str, HeldOut] = {}
OUTCOMES_2 = Path(__file__).parent / "fixtures" / "heldout_outcomes_2.json"  # python -m tests.heldout_bugs --second


def held_out(slug, function, *, replaces, bug, cause):
    """Register `function` as the held-out bug heldout2.<slug>."""
    HELD_OUT_2[f"heldout2.{slug}"] = HeldOut(f"heldout2.{slug}", bug, "", "numpy", replaces, function, cause=cause)


def _gqa(*, window_shift=0, softmax_axis=-1, scale=None, transposed=False, dtype=None, chunk_causal=True):
    """The reference's gqa_attention with one thing changed: the window's width, the softmax's axis, the scores' scale, the causal mask
    transposed, the scores rounded through `dtype`, or no causal mask among a chunk's own queries."""

    def gqa_attention(q, k, v, causal=True, key_mask=None, window=None, *, fully_masked="zeros"):
        B, H, T, D = q.shape
        S = k.shape[2]
        k, v = ref.repeat_kv(k, H // k.shape[1]), ref.repeat_kv(v, H // v.shape[1])
        scores = q @ k.swapaxes(-1, -2) * (1 / math.sqrt(D) if scale is None else scale(D))  # (B, H, T, S)
        if dtype is not None:
            scores = scores.astype(dtype).astype(q.dtype)
        w = None if window is None else window + window_shift
        visible = ref.visible_keys(T, S, causal, w)  # (T, S)
        if causal and transposed and T == S:
            visible = visible.T
        if causal and not chunk_causal and T < S:
            visible = ref.visible_keys(T, S, False, None)  # BUG: a decode chunk's queries see the whole chunk
        if key_mask is not None:
            visible = visible & np.asarray(key_mask, dtype=bool)[:, None, None, :]
        visible = np.broadcast_to(visible, scores.shape)
        if softmax_axis == -1:
            weights = ref.masked_softmax(scores, visible, fully_masked=fully_masked)
        else:  # BUG: normalised over the queries
            shifted = np.where(visible, scores, -np.inf)
            shifted = shifted - shifted.max(axis=softmax_axis, keepdims=True)
            e = np.where(visible, np.exp(shifted), 0.0)
            weights = e / np.maximum(e.sum(axis=softmax_axis, keepdims=True), np.finfo(np.float64).tiny)
        return weights @ v, weights

    return gqa_attention


held_out("window_one_too_narrow", _gqa(window_shift=-1), replaces="gqa_attention",
         bug="the sliding window keeps w - 1 keys (j > p - w + 1): one key too few", cause="window")
held_out("softmax_over_queries", _gqa(softmax_axis=-2), replaces="gqa_attention",
         bug="the softmax normalises over the query axis (axis=-2), not the keys", cause="softmax_axis")
held_out("scores_scaled_by_d", _gqa(scale=lambda D: 1 / D), replaces="gqa_attention",
         bug="the scores are scaled by 1/d_head instead of 1/√d_head", cause="scale")
held_out("causal_mask_transposed", _gqa(transposed=True), replaces="gqa_attention",
         bug="the causal mask is transposed (each query sees itself and the future)", cause="mask")
held_out("scores_in_float32", _gqa(dtype=np.float32), replaces="gqa_attention",
         bug="the scores are computed in float32 (correct code, float64 run)", cause="float32")
held_out("scores_in_float16", _gqa(dtype=np.float16), replaces="gqa_attention",
         bug="the scores are rounded to float16 inside a float64 attention (a stray .half())", cause="precision")
held_out("decode_chunk_not_causal", _gqa(chunk_causal=False), replaces="gqa_attention",
         bug="a decode chunk of several tokens has no causal mask among its own queries (only the cache is masked)", cause="mask")


def _decode_without_final_norm(ids, params, n_heads, n_kv_heads, rope_base=ref.ROPE_BASE, window=None, chunks=None, *,
                               pairing="half_split", eps=ref.EPS):
    ids = np.asarray(ids)
    T = ids.shape[1]
    chunks = [T] if chunks is None else [int(n) for n in np.asarray(chunks).reshape(-1)]
    cache, logits, caches, start = [None] * len(params["blocks"]), [], [], 0
    for n in chunks:
        x = params["embed"][ids[:, start:start + n]]
        positions = ref.chunk_positions(start, n)
        for layer, block in enumerate(params["blocks"]):
            x, cache[layer] = ref.llama_block_step(x, block, n_heads, n_kv_heads, rope_base, window, positions, cache[layer],
                                                   pairing=pairing, eps=eps)
        logits.append(x @ params["W_out"])  # BUG: no final RMSNorm before the head
        caches.append(list(cache))
        start += n
    return np.concatenate(logits, axis=1), ref.cache_positions(caches, n_kv_heads)


held_out("final_norm_missing", _decode_without_final_norm, replaces="llama_decode",
         bug="the model has no final RMSNorm before the head", cause="final_norm")


def _positions_past_plus_one(past_length, n):
    return np.arange(past_length, past_length + n) + (1 if past_length else 0)  # BUG: past_length + 1 after the prefill


held_out("decode_positions_plus_one", _positions_past_plus_one, replaces="chunk_positions",
         bug="after the prefill, a decode step's tokens start at past_length + 1", cause="decode_positions")


def _rope_ignoring_base(x, positions, base=ref.ROPE_BASE, *, pairing="half_split"):
    return ref.rope(x, positions, 10000.0, pairing=pairing)  # BUG: rope_theta from the config ignored


held_out("rope_base_ignored", _rope_ignoring_base, replaces="rope",
         bug="RoPE ignores the configured base (rope_theta) and uses 10000", cause="rope_positions")


def _block(*, gain_first=False, residual_from_normed=False):
    """The reference's llama_block_step with the gain applied before the norm, or the residual taken from the normed input."""

    def norm(x, gain, eps):
        if gain_first:  # BUG: x·g normalised, not x normalised then scaled
            x = x * gain
            return x / np.sqrt((x * x).mean(axis=-1, keepdims=True) + eps)
        return ref.rms_norm(x, gain, eps)

    def step(x, params, n_heads, n_kv_heads, rope_base, window, positions, cache=None, *, pairing="half_split", eps=ref.EPS):
        p = params
        normed = norm(x, p["attn_norm"], eps)
        attended, cache = ref.llama_attention(normed, p, n_heads, n_kv_heads, positions, rope_base, window, cache, pairing=pairing)
        h = (normed if residual_from_normed else x) + attended  # BUG (residual_from_normed): the skip carries the normed stream
        return h + ref.swiglu(norm(h, p["ffn_norm"], eps), p["W_gate"], p["W_up"], p["W_down"]), cache

    return step


held_out("norm_gain_before_normalising", _block(gain_first=True), replaces="llama_block_step",
         bug="the block's RMSNorm multiplies by the gain before normalising", cause="gain")
held_out("residual_from_normed_input", _block(residual_from_normed=True), replaces="llama_block_step",
         bug="the attention's residual adds to the normed input, not to the block's input", cause="residual")


def _rope_on_queries_only(x, p, n_heads, n_kv_heads, positions, rope_base, window, cache=None, *, pairing="half_split"):
    q = ref.split_heads(ref.project(x, p["W_q"], p.get("b_q")), n_heads)
    k = ref.split_heads(ref.project(x, p["W_k"], p.get("b_k")), n_kv_heads)
    v = ref.split_heads(ref.project(x, p["W_v"], p.get("b_v")), n_kv_heads)
    q = ref.rope(q, positions, rope_base, pairing=pairing)  # BUG: the keys are never rotated
    held = np.asarray(positions)
    if cache is not None:
        k, v = np.concatenate([cache[0], k], axis=2), np.concatenate([cache[1], v], axis=2)
        held = np.concatenate([cache[2], held])
    heads, _ = ref.gqa_attention(q, k, v, True, None, window)
    return ref.merge_heads(heads) @ p["W_o"], (k, v, held)


held_out("rope_on_queries_only", _rope_on_queries_only, replaces="llama_attention",
         bug="the block's attention rotates the queries but not the keys", cause="rope_positions")
