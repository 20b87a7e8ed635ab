"""Broken modern decoders: RoPE, grouped-query attention, masks, SwiGLU, the Llama block and model, the KV cache, cross-attention.

Each mutant is the reference with one function (or one helper the reference calls: visible_keys,
masked_softmax, repeat_kv, chunk_positions, llama_attention) replaced; the line marked BUG is the
difference. Where a bug shipped in public code the docstring-free `bug=` names the thread.
"""

from __future__ import annotations

import math

import numpy as np

import invariants.reference.numpy as ref
from invariants.mutants import mutant
from invariants.reference.numpy import (
    EPS,
    ROPE_BASE,
    attention,
    feed_forward,
    gqa_attention,
    layer_norm,
    merge_heads,
    project,
    repeat_kv,
    rms_norm,
    rope,
    rope_angles,
    rope_join,
    rope_pairs,
    silu,
    softmax,
    split_heads,
    swiglu,
    visible_keys,
)

# -- RoPE --------------------------------------------------------------------------------------------------------------


@mutant(replaces="rope", killed_by="rope.relative_offsets",
        bug="rotate_half (pairs (i, i + D/2)) with cos and sin laid out for interleaved pairs: not a rotation (karpathy/nanochat#264)")
def rotate_half_with_interleaved_frequencies(x, positions, base=ROPE_BASE, *, pairing="half_split"):
    angles = np.repeat(rope_angles(positions, x.shape[-1], base), 2, axis=-1)  # BUG: (T, D) as [θ0, θ0, θ1, θ1, ...]
    cos, sin = np.cos(angles).astype(x.dtype), np.sin(angles).astype(x.dtype)
    half = x.shape[-1] // 2
    rotated_half = np.concatenate([-x[..., half:], x[..., :half]], axis=-1)  # rotate_half: the half-split partner
    return x * cos + rotated_half * sin


@mutant(replaces="rope", killed_by="rope.preserves_pair_norms",
        bug="sign slip in the second coordinate: (x·cos - y·sin, x·sin - y·cos), not a rotation")
def second_coordinate_sign_slip(x, positions, base=ROPE_BASE, *, pairing="half_split"):
    angles = rope_angles(positions, x.shape[-1], base)
    cos, sin = np.cos(angles).astype(x.dtype), np.sin(angles).astype(x.dtype)
    first, second = rope_pairs(x, pairing)
    return rope_join(first * cos - second * sin, first * sin - second * cos, pairing)  # BUG: - second·cos


@mutant(replaces="rope", killed_by="rope.position_zero_is_identity", bug="positions counted from 1 (arange(1, T + 1)): position 0 is rotated")
def positions_from_one(x, positions, base=ROPE_BASE, *, pairing="half_split"):
    return rope(x, np.asarray(positions) + 1, base, pairing=pairing)  # BUG: + 1


@mutant(also_named_by=("rope.preserves_pair_norms",),
        replaces="rope", killed_by="rope.pairing_anchor",
        bug="interleaved pairs (2i, 2i + 1) while declaring half-split: a checkpoint converted for the other layout (huggingface/transformers#25199)")
def interleaved_while_declaring_half_split(x, positions, base=ROPE_BASE, *, pairing="half_split"):
    return rope(x, positions, base, pairing="interleaved")  # BUG: the pairing of Meta's checkpoints, not the declared one


@mutant(replaces="rope", killed_by="rope.pairing_anchor", bug="frequencies θ_i = base^(-i/D) instead of base^(-2i/D)")
def frequencies_without_the_two(x, positions, base=ROPE_BASE, *, pairing="half_split"):
    D = x.shape[-1]
    angles = np.asarray(positions, dtype=np.float64)[:, None] * base ** (-np.arange(D // 2) / D)  # BUG: -i/D
    cos, sin = np.cos(angles).astype(x.dtype), np.sin(angles).astype(x.dtype)
    first, second = rope_pairs(x, pairing)
    return rope_join(first * cos - second * sin, first * sin + second * cos, pairing)


@mutant(also_named_by=("rope.pairing_anchor",),
        replaces="rope", killed_by="rope.agrees_with_reference", backend="torch", dtype="bfloat16",
        bug="RoPE angles computed in the model's dtype (bfloat16): positions past 256 round (huggingface/transformers#29285)")
def angles_in_bfloat16(x, positions, base=ROPE_BASE, *, pairing="half_split"):
    import torch

    from invariants.reference.torch import rope_join as join
    from invariants.reference.torch import rope_pairs as pairs

    D = x.shape[-1]
    inv_freq = (base ** (-torch.arange(0, D, 2, dtype=torch.float32, device=x.device) / D)).to(x.dtype)  # BUG: θ in bfloat16
    angles = torch.as_tensor(positions, device=x.device).to(x.dtype)[:, None] * inv_freq  # BUG: p and p·θ in bfloat16
    cos, sin = torch.cos(angles), torch.sin(angles)
    first, second = pairs(x, pairing)
    return join(first * cos - second * sin, first * sin + second * cos, pairing)


# -- grouped-query attention -----------------------------------------------------------------------------------------


@mutant(replaces="repeat_kv", killed_by="gqa.repeated_kv_heads",
        also_named_by=("gqa.head_groups",),  # "a query head reads another kv head than h // (H / H_kv)"
        bug="kv heads tiled [kv0, kv1, kv0, kv1] instead of repeat-interleaved (onnx/onnx#7274)")
def tiled_kv_heads(k, group):
    return np.tile(k, (1, group, 1, 1))  # BUG: np.tile, torch's .repeat


@mutant(replaces="gqa_attention", killed_by="gqa.head_groups",
        also_named_by=("gqa.repeated_kv_heads",),  # "tiled [kv0, kv1, kv0, kv1] ... instead of repeat-interleaved"
        bug="keys repeat-interleaved but values tiled: query head h reads another kv head's values")
def values_tiled_keys_repeated(q, k, v, causal=True, key_mask=None, window=None, *, fully_masked="zeros"):
    group = q.shape[1] // k.shape[1]
    return gqa_attention(q, repeat_kv(k, group), np.tile(v, (1, group, 1, 1)), causal, key_mask, window, fully_masked=fully_masked)  # BUG


@mutant(replaces="visible_keys", killed_by="gqa.queries_shorter_than_keys",
        bug="causal mask aligned top-left when T < S: query i sees keys 0..i (SDPA's is_causal, pytorch/pytorch#115111)")
def top_left_causal(T, S, causal=True, window=None):
    query_position = np.arange(T)[:, None]  # BUG: arange(T), not arange(S - T, S)
    key_position = np.arange(S)[None, :]
    seen = np.ones((T, S), dtype=bool)
    if causal:
        seen &= key_position <= query_position
        if window is not None:
            seen &= key_position > query_position - window
    return seen


@mutant(replaces="gqa_attention", killed_by="gqa.agrees_with_reference", bug="scores scaled by 1/√(H·D) (the model width) instead of 1/√D")
def scaled_by_model_width(q, k, v, causal=True, key_mask=None, window=None, *, fully_masked="zeros"):
    return gqa_attention(q / math.sqrt(q.shape[1]), k, v, causal, key_mask, window, fully_masked=fully_masked)  # BUG: an extra 1/√H


# -- masks -----------------------------------------------------------------------------------------------------------


@mutant(replaces="visible_keys", killed_by="masking.window_key_count",
        bug="window one key too wide: j >= p - w, w + 1 keys (flash-attention's window_size=(w, w), huggingface/transformers#39408)")
def window_one_too_wide(T, S, causal=True, window=None):
    return visible_keys(T, S, causal, None if window is None else window + 1)  # BUG: w + 1 keys


@mutant(replaces="masked_softmax", killed_by="masking.window_outside_keys_ignored",
        bug="softmax stabilised by the maximum over all keys before masking: hidden keys change the rounding")
def max_over_all_keys(scores, visible, *, fully_masked="zeros"):
    shifted = scores - scores.max(axis=-1, keepdims=True)  # BUG: the max includes keys the query may not see
    any_visible = visible.any(axis=-1, keepdims=True)
    e = np.where(visible, np.exp(shifted), 0.0)
    total = e.sum(axis=-1, keepdims=True)
    return np.where(any_visible, e / np.where(total > 0, total, 1.0), 0.0)


@mutant(replaces="visible_keys", killed_by="masking.window_covering_all_keys_is_causal",
        bug="'the window covers every key, no mask needed': the causal mask dropped when w >= S")
def no_mask_when_window_covers(T, S, causal=True, window=None):
    if window is not None and window >= S:
        return np.ones((T, S), dtype=bool)  # BUG: the causal part of the mask skipped too
    return visible_keys(T, S, causal, window)


@mutant(replaces="gqa_attention", killed_by="masking.padding_hidden_keys_ignored", bug="key-padding mask applied to the queries (rows), not the keys")
def key_mask_on_queries(q, k, v, causal=True, key_mask=None, window=None, *, fully_masked="zeros"):
    B, H, T, D = q.shape
    k, v = repeat_kv(k, H // k.shape[1]), repeat_kv(v, H // v.shape[1])
    scores = q @ k.swapaxes(-1, -2) / math.sqrt(D)
    seen = visible_keys(T, k.shape[2], causal, window)
    if key_mask is not None:
        seen = seen & np.asarray(key_mask, dtype=bool)[:, None, -T:, None]  # BUG: masks query rows
    weights = ref.masked_softmax(scores, np.broadcast_to(seen, scores.shape), fully_masked=fully_masked)
    return weights @ v, weights


@mutant(replaces="masked_softmax", killed_by="masking.fully_masked_rows",
        bug="no guard for fully masked rows: softmax over all -inf is 0/0 = NaN (pytorch/pytorch#103749)")
def unguarded_softmax(scores, visible, *, fully_masked="zeros"):
    return softmax(np.where(visible, scores, -np.inf))  # BUG: a row with no visible key is NaN


def _additive_gqa(q, k, v, causal, key_mask, window, plane):
    """gqa_attention with each mask added to the scores as its own plane of `plane(dtype)` where hidden (the unsafe way)."""
    B, H, T, D = q.shape
    S = k.shape[2]
    k, v = repeat_kv(k, H // k.shape[1]), repeat_kv(v, H // v.shape[1])
    scores = q @ k.swapaxes(-1, -2) / math.sqrt(D)  # (B, H, T, S)
    fill = plane(scores.dtype)
    zero = np.zeros((), dtype=scores.dtype)
    scores = scores + np.where(visible_keys(T, S, causal, window), zero, fill)  # the causal (and window) plane
    if key_mask is not None:
        scores = scores + np.where(np.asarray(key_mask, dtype=bool)[:, None, None, :], zero, fill)  # the padding plane
    weights = softmax(scores)  # a fully masked row of -inf is NaN here
    return weights @ v, weights


@mutant(also_named_by=("masking.fully_masked_rows",),
        replaces="gqa_attention", killed_by="masking.masks_compose_in_low_precision", dtype="float16",
        bug="causal and padding masks added as finfo.min planes: min + min = -inf and score + min overflows in float16 "
        "(huggingface/transformers#27114, NVIDIA-NeMo/Automodel#2658)")
def summed_finfo_min_masks(q, k, v, causal=True, key_mask=None, window=None, *, fully_masked="zeros"):
    return _additive_gqa(q, k, v, causal, key_mask, window, lambda dtype: np.asarray(np.finfo(dtype).min, dtype=dtype))  # BUG


@mutant(replaces="gqa_attention", killed_by="masking.masks_compose_in_low_precision", dtype="float16",
        also_named_by=("masking.fully_masked_rows",),  # "or a finite sentinel (-1e9, finfo.min)"
        bug="masks filled with a -1e9 sentinel, which is -inf in float16 (google/flax#982)")
def minus_1e9_sentinel(q, k, v, causal=True, key_mask=None, window=None, *, fully_masked="zeros"):
    return _additive_gqa(q, k, v, causal, key_mask, window, lambda dtype: np.asarray(-1e9).astype(dtype))  # BUG: -inf in float16


# -- SwiGLU ----------------------------------------------------------------------------------------------------------


@mutant(replaces="swiglu", killed_by="swiglu.diagonal_closed_form", bug="a sigmoid gate (GLU) instead of SiLU: σ(x·W_gate) ⊙ x·W_up")
def sigmoid_gate(x, W_gate, W_up, W_down):
    return (ref.sigmoid(x @ W_gate) * (x @ W_up)) @ W_down  # BUG: σ, not z·σ(z)


@mutant(also_named_by=("swiglu.linear_in_up",),
        replaces="swiglu", killed_by="swiglu.diagonal_closed_form",
        bug="SiLU with no gate: silu(x·W_gate)·W_down, W_up ignored (google-research/timesfm#493)")
def silu_without_gate(x, W_gate, W_up, W_down):
    return silu(x @ W_gate) @ W_down  # BUG: no up branch


@mutant(replaces="swiglu", killed_by="swiglu.linear_in_up", bug="SiLU on the up branch: silu(x·W_up) ⊙ x·W_gate (ml-explore/mlx-lm#767)")
def silu_on_up_branch(x, W_gate, W_up, W_down):
    return (silu(x @ W_up) * (x @ W_gate)) @ W_down  # BUG: the branches swapped


@mutant(replaces="swiglu", killed_by="swiglu.linear_in_up", bug="SiLU of the product: silu(x·W_gate ⊙ x·W_up) (Nijikadesu/breakdown-minimind#3)")
def silu_of_product(x, W_gate, W_up, W_down):
    return silu((x @ W_gate) * (x @ W_up)) @ W_down  # BUG: SiLU outside the product


@mutant(also_named_by=("swiglu.linear_in_up",),
        replaces="swiglu", killed_by="swiglu.agrees_with_reference", bug="a residual added inside the feed-forward network (the block adds it again)")
def residual_inside_swiglu(x, W_gate, W_up, W_down):
    return x + swiglu(x, W_gate, W_up, W_down)  # BUG: + x


# -- the Llama block and model ---------------------------------------------------------------------------------------


@mutant(replaces="llama_block_step", killed_by="llama.residual_identity", bug="post-norm Llama block: RMSNorm after each residual add")
def post_norm_llama_block(x, params, n_heads, n_kv_heads, rope_base, window, positions, cache=None, *, pairing="half_split", eps=EPS):
    p = params
    attended, cache = ref.llama_attention(x, p, n_heads, n_kv_heads, positions, rope_base, window, cache, pairing=pairing)
    h = rms_norm(x + attended, p["attn_norm"], eps)  # BUG: norm(x + f(x)), not x + f(norm(x))
    return rms_norm(h + swiglu(h, p["W_gate"], p["W_up"], p["W_down"]), p["ffn_norm"], eps), cache


def _llama_attention(x, p, n_heads, n_kv_heads, positions, rope_base, window, cache, pairing, *, causal=True, rotate_values=False,
                     cache_repeated=False, extend_cache=True):
    """The reference's llama_attention with one of its steps switched (each mutant below switches one)."""
    q = split_heads(project(x, p["W_q"], p.get("b_q")), n_heads)
    k = split_heads(project(x, p["W_k"], p.get("b_k")), n_kv_heads)
    v = split_heads(project(x, p["W_v"], p.get("b_v")), n_kv_heads)
    q, k = rope(q, positions, rope_base, pairing=pairing), rope(k, positions, rope_base, pairing=pairing)
    if rotate_values:
        v = rope(v, positions, rope_base, pairing=pairing)
    if cache_repeated:
        k, v = repeat_kv(k, n_heads // n_kv_heads), repeat_kv(v, n_heads // n_kv_heads)
    held = np.asarray(positions)
    if cache is not None and extend_cache:
        k, v, held = np.concatenate([cache[0], k], axis=2), np.concatenate([cache[1], v], axis=2), np.concatenate([cache[2], held])
    heads, _ = gqa_attention(q, k, v, causal, None, window)
    return merge_heads(heads) @ p["W_o"], (k, v, held)


@mutant(replaces="llama_attention", killed_by="llama.causal_non_leakage", bug="the block's attention called without the causal mask",
        also_named_by=("llama.model_causal_non_leakage",))  # "a block is not causal"
def llama_attention_not_causal(x, p, n_heads, n_kv_heads, positions, rope_base, window, cache=None, *, pairing="half_split"):
    return _llama_attention(x, p, n_heads, n_kv_heads, positions, rope_base, window, cache, pairing, causal=False)  # BUG


@mutant(replaces="llama_attention", killed_by="llama.values_are_not_rotated", bug="RoPE applied to the values as well as to q and k",
        also_named_by=("llama.value_bias_reaches_values",))  # "or RoPE is applied to the values (b_v rotated by position)"
def rope_on_values(x, p, n_heads, n_kv_heads, positions, rope_base, window, cache=None, *, pairing="half_split"):
    return _llama_attention(x, p, n_heads, n_kv_heads, positions, rope_base, window, cache, pairing, rotate_values=True)  # BUG


@mutant(replaces="llama_attention", killed_by="llama.value_bias_reaches_values",
        bug="the value bias added twice (a biased projection, then b_v again by hand)")
def value_bias_added_twice(x, p, n_heads, n_kv_heads, positions, rope_base, window, cache=None, *, pairing="half_split"):
    doubled = {**p, "b_v": 2 * p["b_v"]} if "b_v" in p else p  # BUG: b_v twice
    return _llama_attention(x, doubled, n_heads, n_kv_heads, positions, rope_base, window, cache, pairing)


@mutant(replaces="llama_block_step", killed_by="llama.block_norm_seen_alone", bug="the attention's RMSNorm given ffn_norm's gain (gains swapped)")
def norm_gains_swapped(x, params, n_heads, n_kv_heads, rope_base, window, positions, cache=None, *, pairing="half_split", eps=EPS):
    swapped = {**params, "attn_norm": params["ffn_norm"], "ffn_norm": params["attn_norm"]}  # BUG: each norm reads the other's gain
    return ref.llama_block_step(x, swapped, n_heads, n_kv_heads, rope_base, window, positions, cache, pairing=pairing, eps=eps)


@mutant(replaces="llama_block_step", killed_by="llama.block_agrees_with_reference", bug="LayerNorm (centred, no bias) where Llama has RMSNorm",
        also_named_by=("llama.block_norm_seen_alone",))  # "the row centred first (a LayerNorm's centring)"
def layer_norm_for_rms_norm(x, params, n_heads, n_kv_heads, rope_base, window, positions, cache=None, *, pairing="half_split", eps=EPS):
    p = params
    zero = np.zeros_like(p["attn_norm"])
    attended, cache = ref.llama_attention(layer_norm(x, p["attn_norm"], zero, eps), p, n_heads, n_kv_heads, positions, rope_base, window,
                                          cache, pairing=pairing)  # BUG: layer_norm
    h = x + attended
    return h + swiglu(layer_norm(h, p["ffn_norm"], zero, eps), p["W_gate"], p["W_up"], p["W_down"]), cache


@mutant(replaces="rms_norm", killed_by="llama.model_causal_non_leakage",
        also_named_by=("llama.causal_non_leakage",),  # "a norm over the sequence axis"
        bug="RMSNorm over the whole sequence (the token and feature axes) instead of per token")
def rms_norm_over_the_sequence(x, gain, eps=EPS):
    mean_square = (x * x).mean(axis=(-2, -1), keepdims=True) if x.ndim >= 3 else (x * x).mean(axis=-1, keepdims=True)  # BUG: axis -2 too
    return x / np.sqrt(mean_square + eps) * gain


@mutant(replaces="llama_logits", killed_by="llama.logits_agree_with_reference",
        bug="the head tied to the embedding table (embed.T) though W_out is given")
def tied_head(ids, params, n_heads, n_kv_heads, rope_base=ROPE_BASE, window=None, *, pairing="half_split", eps=EPS):
    untied = {**params, "W_out": params["embed"].T}  # BUG: Llama's head is untied
    return ref.llama_logits(ids, untied, n_heads, n_kv_heads, rope_base, window, pairing=pairing, eps=eps)


# -- the KV cache ------------------------------------------------------------------------------------------------------


@mutant(replaces="chunk_positions", killed_by="decoding.decode_matches_full_forward", also_named_by=("decoding.cache_size_law",),
        bug="each chunk's positions counted from 0, not from past_length (pytorch/executorch#2010)")
def positions_restart_each_chunk(past_length, n):
    return np.arange(n)  # BUG: past_length ignored


@mutant(replaces="chunk_positions", killed_by="decoding.decode_matches_full_forward", also_named_by=("decoding.cache_size_law",),
        bug="the offset advanced by the prompt length twice: a decode step at 2·past_length (skyzh/tiny-llm#46)")
def offset_counted_twice(past_length, n):
    return np.arange(2 * past_length, 2 * past_length + n)  # BUG: past_length added again


@mutant(also_named_by=("decoding.cache_size_law",),
        replaces="llama_attention", killed_by="decoding.decode_matches_full_forward",
        bug="the cache replaced by each chunk's keys instead of extended")
def cache_replaced(x, p, n_heads, n_kv_heads, positions, rope_base, window, cache=None, *, pairing="half_split"):
    return _llama_attention(x, p, n_heads, n_kv_heads, positions, rope_base, window, cache, pairing, extend_cache=False)  # BUG


@mutant(replaces="llama_attention", killed_by="decoding.cache_size_law",
        bug="keys and values repeated for every query head before caching: right logits, H / H_kv times the cache")
def cache_after_repeat_kv(x, p, n_heads, n_kv_heads, positions, rope_base, window, cache=None, *, pairing="half_split"):
    return _llama_attention(x, p, n_heads, n_kv_heads, positions, rope_base, window, cache, pairing, cache_repeated=True)  # BUG


def _window_cache_attention(x, p, n_heads, n_kv_heads, positions, rope_base, window, cache, pairing, *, see_later=False,
                            trim_first=False, keep=None):
    """Llama's attention on a window cache that holds (k, v, positions), the mask built from the keys' positions.

    With a cache (after the prefill) one step can be switched: see_later (once the chunk passes the window, the ring is
    taken as full and only the window is masked), trim_first (the cache cut to its last w keys before the chunk attends);
    keep(w) is how many of the most recent keys the cache keeps after each chunk (w by default).
    """
    q = rope(split_heads(project(x, p["W_q"], p.get("b_q")), n_heads), positions, rope_base, pairing=pairing)  # (B, H, T, D)
    k = rope(split_heads(project(x, p["W_k"], p.get("b_k")), n_kv_heads), positions, rope_base, pairing=pairing)  # (B, H_kv, T, D)
    v = split_heads(project(x, p["W_v"], p.get("b_v")), n_kv_heads)
    held = np.asarray(positions)
    if cache is not None:
        k, v, held = np.concatenate([cache[0], k], axis=2), np.concatenate([cache[1], v], axis=2), np.concatenate([cache[2], held])
        if trim_first and window is not None:
            k, v, held = k[:, :, -window:], v[:, :, -window:], held[-window:]  # BUG (trim_first): before the chunk attends
    query, key = np.asarray(positions)[:, None], held[None, :]  # (T, 1), (1, S)
    full = see_later and cache is not None and window is not None and query.max() >= window
    seen = np.ones((len(query), len(held)), dtype=bool) if full else key <= query  # BUG (see_later): no causal part once full
    if window is not None:
        seen = seen & (key > query - window)
    group = n_heads // n_kv_heads
    scores = q @ repeat_kv(k, group).swapaxes(-1, -2) / math.sqrt(q.shape[-1])  # (B, H, T, S)
    heads = ref.masked_softmax(scores, np.broadcast_to(seen, scores.shape)) @ repeat_kv(v, group)  # (B, H, T, D)
    if window is not None:
        first = max(len(held) - (window if keep is None else keep(window)), 0)  # keep the most recent keys only
        k, v, held = k[:, :, first:], v[:, :, first:], held[first:]
    return merge_heads(heads) @ p["W_o"], (k, v, held)


@mutant(replaces="llama_attention", killed_by="decoding.decode_matches_full_forward",
        bug="a ring-buffer window cache whose multi-token chunk, once past the window, lets a query see the chunk's later keys")
def ring_chunk_sees_later_keys(x, p, n_heads, n_kv_heads, positions, rope_base, window, cache=None, *, pairing="half_split"):
    return _window_cache_attention(x, p, n_heads, n_kv_heads, positions, rope_base, window, cache, pairing, see_later=True)  # BUG


@mutant(replaces="llama_attention", killed_by="decoding.decode_matches_full_forward",
        bug="a window cache trimmed to w keys before a multi-token chunk attends: the chunk's earlier queries lose keys they see")
def window_trimmed_before_chunk_attends(x, p, n_heads, n_kv_heads, positions, rope_base, window, cache=None, *, pairing="half_split"):
    return _window_cache_attention(x, p, n_heads, n_kv_heads, positions, rope_base, window, cache, pairing, trim_first=True)  # BUG


@mutant(replaces="llama_attention", killed_by="decoding.cache_size_law",
        bug="a window cache that keeps w - 2 keys: the next query's w - 1 predecessors are not all there")
def window_cache_keeps_too_little(x, p, n_heads, n_kv_heads, positions, rope_base, window, cache=None, *, pairing="half_split"):
    return _window_cache_attention(x, p, n_heads, n_kv_heads, positions, rope_base, window, cache, pairing,
                                   keep=lambda w: max(w - 2, 0))  # BUG: w - 1 are needed


# -- cross-attention and the decoder block ---------------------------------------------------------------------------


def _cross(x, memory, W_q, W_k, W_v, W_o, n_heads, *, causal=False, positions=False):
    q = split_heads(x @ W_q, n_heads)
    k, v = split_heads(memory @ W_k, n_heads), split_heads(memory @ W_v, n_heads)
    if positions and q.shape[-1] % 2 == 0:
        q, k = rope(q, np.arange(q.shape[2])), rope(k, np.arange(k.shape[2]))
    heads, weights = gqa_attention(q, k, v, causal, None, None)
    return merge_heads(heads) @ W_o, weights


@mutant(also_named_by=("cross_attention.memory_permutation_invariance",),
        replaces="cross_attention", killed_by="cross_attention.sees_every_memory_position",
        bug="cross-attention with the decoder's causal mask (huggingface/transformers#48172)")
def causal_cross_attention(x, memory, W_q, W_k, W_v, W_o, n_heads):
    return _cross(x, memory, W_q, W_k, W_v, W_o, n_heads, causal=True)  # BUG


@mutant(replaces="cross_attention", killed_by="cross_attention.memory_permutation_invariance",
        bug="RoPE applied in cross-attention: the memory's keys get positions")
def rope_in_cross_attention(x, memory, W_q, W_k, W_v, W_o, n_heads):
    return _cross(x, memory, W_q, W_k, W_v, W_o, n_heads, positions=True)  # BUG


@mutant(replaces="cross_attention", killed_by="cross_attention.cross_agrees_with_reference", bug="cross-attention scores not scaled by 1/√D")
def unscaled_cross_attention(x, memory, W_q, W_k, W_v, W_o, n_heads):
    D = x.shape[-1] // n_heads
    return _cross(x * math.sqrt(D), memory, W_q, W_k, W_v, W_o, n_heads)  # BUG: the 1/√D undone (q·√D)


def _decoder_block(x, memory, p, n_heads, gelu_form, eps, *, residual=True, causal=True, keys_from_stream=False, norm_memory=False):
    x = x + attention(layer_norm(x, p["ln1_g"], p["ln1_b"], eps), p["W_q"], p["W_k"], p["W_v"], p["W_o"], n_heads, causal)[0]
    normed = layer_norm(x, p["ln2_g"], p["ln2_b"], eps)
    source = normed if keys_from_stream else layer_norm(memory, p["ln2_g"], p["ln2_b"], eps) if norm_memory else memory
    crossed = ref.cross_attention(normed, source, p["Wc_q"], p["Wc_k"], p["Wc_v"], p["Wc_o"], n_heads)[0]
    x = x + crossed if residual else crossed
    return x + feed_forward(layer_norm(x, p["ln3_g"], p["ln3_b"], eps), p["W1"], p["b1"], p["W2"], p["b2"], gelu_form=gelu_form)


@mutant(replaces="decoder_block", killed_by="cross_attention.block_residual_identity",
        bug="the cross-attention's output replaces the stream (no residual)")
def cross_without_residual(x, memory, params, n_heads, *, gelu_form="tanh", eps=EPS):
    return _decoder_block(x, memory, params, n_heads, gelu_form, eps, residual=False)  # BUG


@mutant(replaces="decoder_block", killed_by="cross_attention.block_causal_non_leakage", bug="the decoder's self-attention without the causal mask")
def decoder_self_attention_not_causal(x, memory, params, n_heads, *, gelu_form="tanh", eps=EPS):
    return _decoder_block(x, memory, params, n_heads, gelu_form, eps, causal=False)  # BUG


@mutant(replaces="decoder_block", killed_by="cross_attention.block_sees_every_memory_position",
        bug="the cross-attention's keys and values taken from the decoder stream (self-attention twice)")
def cross_keys_from_stream(x, memory, params, n_heads, *, gelu_form="tanh", eps=EPS):
    return _decoder_block(x, memory, params, n_heads, gelu_form, eps, keys_from_stream=True)  # BUG


@mutant(replaces="decoder_block", killed_by="cross_attention.block_agrees_with_reference", bug="the encoder's memory normalised again with ln2")
def memory_normalised_with_ln2(x, memory, params, n_heads, *, gelu_form="tanh", eps=EPS):
    return _decoder_block(x, memory, params, n_heads, gelu_form, eps, norm_memory=True)  # BUG


# -- attention with QK-norm --------------------------------------------------------------------------------------------


def _qk_norm_attention(q, k, v, W_o):
    """The rest of qk_norm_attention once q (B, H, T, D) and k, v (B, H_kv, T, D) are made: causal GQA and the output projection."""
    heads, weights = gqa_attention(q, k, v, True, None, None)
    return merge_heads(heads) @ W_o, weights


def _heads(x, W, n, positions, rope_base, pairing, gain=None, eps=EPS):
    """x·W split into n heads, RMS-normalised per head with `gain` (None: not normalised), then rotated."""
    y = split_heads(x @ W, n)
    return rope(y if gain is None else rms_norm(y, gain, eps), positions, rope_base, pairing=pairing)


@mutant(replaces="qk_norm_attention", killed_by="qk_norm.causal_non_leakage", bug="QK-norm attention without the causal mask")
def qk_norm_attention_not_causal(x, params, n_heads, n_kv_heads, positions, rope_base=ROPE_BASE, *, pairing="half_split", eps=EPS):
    p = params
    q = _heads(x, p["W_q"], n_heads, positions, rope_base, pairing, p["q_norm"], eps)
    k = _heads(x, p["W_k"], n_kv_heads, positions, rope_base, pairing, p["k_norm"], eps)
    heads, weights = gqa_attention(q, k, split_heads(x @ p["W_v"], n_kv_heads), False, None, None)  # BUG: causal=False
    return merge_heads(heads) @ p["W_o"], weights


@mutant(replaces="qk_norm_attention", killed_by="qk_norm.repeated_kv_heads", bug="the kv heads tiled [kv0, kv1, kv0, kv1] for the query heads")
def qk_norm_kv_heads_tiled(x, params, n_heads, n_kv_heads, positions, rope_base=ROPE_BASE, *, pairing="half_split", eps=EPS):
    p = params
    q = _heads(x, p["W_q"], n_heads, positions, rope_base, pairing, p["q_norm"], eps)
    k = _heads(x, p["W_k"], n_kv_heads, positions, rope_base, pairing, p["k_norm"], eps)
    tiles = (1, n_heads // n_kv_heads, 1, 1)
    return _qk_norm_attention(q, np.tile(k, tiles), np.tile(split_heads(x @ p["W_v"], n_kv_heads), tiles), p["W_o"])  # BUG: tiled


@mutant(replaces="qk_norm_attention", killed_by="qk_norm.relative_positions",
        bug="QK-norm applied after RoPE: the gain then differs within a rotated pair, so the scores see absolute positions")
def qk_norm_after_rope(x, params, n_heads, n_kv_heads, positions, rope_base=ROPE_BASE, *, pairing="half_split", eps=EPS):
    p = params
    q, k = _heads(x, p["W_q"], n_heads, positions, rope_base, pairing), _heads(x, p["W_k"], n_kv_heads, positions, rope_base, pairing)
    q, k = rms_norm(q, p["q_norm"], eps), rms_norm(k, p["k_norm"], eps)  # BUG: after the rotation
    return _qk_norm_attention(q, k, split_heads(x @ p["W_v"], n_kv_heads), p["W_o"])


@mutant(replaces="qk_norm_attention", killed_by="qk_norm.head_rescaling_invariant",
        bug="QK-norm over the whole projection (all heads' H·D features, the gain tiled) instead of each head's D")
def qk_norm_over_all_heads(x, params, n_heads, n_kv_heads, positions, rope_base=ROPE_BASE, *, pairing="half_split", eps=EPS):
    p = params
    q = split_heads(rms_norm(x @ p["W_q"], np.tile(p["q_norm"], n_heads), eps), n_heads)  # BUG: one root mean square for all heads
    k = split_heads(rms_norm(x @ p["W_k"], np.tile(p["k_norm"], n_kv_heads), eps), n_kv_heads)
    q, k = rope(q, positions, rope_base, pairing=pairing), rope(k, positions, rope_base, pairing=pairing)
    return _qk_norm_attention(q, k, split_heads(x @ p["W_v"], n_kv_heads), p["W_o"])


@mutant(replaces="qk_norm_attention", killed_by="qk_norm.agrees_with_reference", bug="the key norm's gain used for the queries (k_norm twice)")
def qk_norm_k_gain_for_queries(x, params, n_heads, n_kv_heads, positions, rope_base=ROPE_BASE, *, pairing="half_split", eps=EPS):
    p = params
    q = _heads(x, p["W_q"], n_heads, positions, rope_base, pairing, p["k_norm"], eps)  # BUG: k_norm, not q_norm
    k = _heads(x, p["W_k"], n_kv_heads, positions, rope_base, pairing, p["k_norm"], eps)
    return _qk_norm_attention(q, k, split_heads(x @ p["W_v"], n_kv_heads), p["W_o"])


@mutant(also_named_by=("qk_norm.weights_bounded_below",),
        replaces="qk_norm_attention", killed_by="qk_norm.head_rescaling_invariant", bug="the keys not normalised (q_norm only)")
def qk_norm_keys_not_normalised(x, params, n_heads, n_kv_heads, positions, rope_base=ROPE_BASE, *, pairing="half_split", eps=EPS):
    p = params
    q = _heads(x, p["W_q"], n_heads, positions, rope_base, pairing, p["q_norm"], eps)
    k = _heads(x, p["W_k"], n_kv_heads, positions, rope_base, pairing)  # BUG: no k_norm
    return _qk_norm_attention(q, k, split_heads(x @ p["W_v"], n_kv_heads), p["W_o"])


def _rms_norm_eps_outside(x, gain, eps=EPS):
    return x / (np.sqrt((x * x).mean(axis=-1, keepdims=True)) + eps) * gain  # BUG: eps outside the square root


@mutant(replaces="qk_norm_attention", killed_by="qk_norm.agrees_with_reference", bug="the QK-norm's eps added outside the square root")
def qk_norm_eps_outside_root(x, params, n_heads, n_kv_heads, positions, rope_base=ROPE_BASE, *, pairing="half_split", eps=EPS):
    p = params
    q = rope(_rms_norm_eps_outside(split_heads(x @ p["W_q"], n_heads), p["q_norm"], eps), positions, rope_base, pairing=pairing)
    k = rope(_rms_norm_eps_outside(split_heads(x @ p["W_k"], n_kv_heads), p["k_norm"], eps), positions, rope_base, pairing=pairing)
    return _qk_norm_attention(q, k, split_heads(x @ p["W_v"], n_kv_heads), p["W_o"])


@mutant(replaces="qk_norm_attention", killed_by="qk_norm.linear_in_values", bug="the values normalised too (k_norm applied to v)")
def qk_norm_values_normalised(x, params, n_heads, n_kv_heads, positions, rope_base=ROPE_BASE, *, pairing="half_split", eps=EPS):
    p = params
    q = _heads(x, p["W_q"], n_heads, positions, rope_base, pairing, p["q_norm"], eps)
    k = _heads(x, p["W_k"], n_kv_heads, positions, rope_base, pairing, p["k_norm"], eps)
    v = rms_norm(split_heads(x @ p["W_v"], n_kv_heads), p["k_norm"], eps)  # BUG: the values are not normalised
    return _qk_norm_attention(q, k, v, p["W_o"])


# -- where the last survivors lived: positions ignored, the norm in 16 bits --------------------------------------------


@mutant(replaces="qk_norm_attention", killed_by="qk_norm.agrees_with_reference",
        bug="the positions argument ignored: RoPE at 0..T-1 whatever positions says, wrong for packed sequences, left padding and "
        "Megatron's --reset-position-ids (NVIDIA/Megatron-LM#453: RoPE ignores position IDs)")
def qk_norm_positions_ignored(x, params, n_heads, n_kv_heads, positions, rope_base=ROPE_BASE, *, pairing="half_split", eps=EPS):
    p = params
    counted = np.arange(x.shape[1])  # BUG: 0..T-1, not `positions`
    q = _heads(x, p["W_q"], n_heads, counted, rope_base, pairing, p["q_norm"], eps)
    k = _heads(x, p["W_k"], n_kv_heads, counted, rope_base, pairing, p["k_norm"], eps)
    return _qk_norm_attention(q, k, split_heads(x @ p["W_v"], n_kv_heads), p["W_o"])


@mutant(replaces="qk_norm_attention", killed_by="qk_norm.agrees_with_reference", backend="torch", dtype="float16",
        bug="the per-head QK-norm squares in float16 without an upcast: projections past 256 square to inf, the head is 0 "
        "and its weights uniform (pytorch/pytorch#133085: the fused RMSNorm squares fp16 input where LlamaRMSNorm upcasts)")
def qk_norm_in_float16(x, params, n_heads, n_kv_heads, positions, rope_base=ROPE_BASE, *, pairing="half_split", eps=EPS):
    import torch

    from invariants.reference import torch as tref

    def norm(y, gain):
        return y / torch.sqrt((y * y).mean(dim=-1, keepdim=True) + eps) * gain  # BUG: y·y in the input's 16-bit dtype

    p = params
    q = tref.rope(norm(tref.split_heads(x @ p["W_q"], n_heads), p["q_norm"]), positions, rope_base, pairing=pairing)
    k = tref.rope(norm(tref.split_heads(x @ p["W_k"], n_kv_heads), p["k_norm"]), positions, rope_base, pairing=pairing)
    heads, weights = tref.gqa_attention(q, k, tref.split_heads(x @ p["W_v"], n_kv_heads), True, None, None)
    return tref.merge_heads(heads) @ p["W_o"], weights


def _rms_norm_in_dtype(x, gain, eps):
    """RMSNorm with mean(x²) in x's own dtype: in float16, inf once a row holds |x| >= 256."""
    return x / np.sqrt((x * x).mean(axis=-1, keepdims=True) + eps) * gain  # BUG: no upcast to float32 for the statistics


@mutant(replaces="llama_block_step", killed_by="llama.block_agrees_with_reference", dtype="float16",
        also_named_by=("llama.logits_agree_with_reference",),  # "an RMSNorm squaring a float16 stream without an upcast"
        bug="the block's RMSNorm squares its float16 stream without an upcast: rows past 256 square to inf and normalise to 0 "
        "(nntrainer/nntrainer#3935: its CausalLM's fp16 RMSNorm accumulates x² in fp16 and overflows)")
def llama_norm_in_float16(x, params, n_heads, n_kv_heads, rope_base, window, positions, cache=None, *, pairing="half_split", eps=EPS):
    p = params
    attended, cache = ref.llama_attention(_rms_norm_in_dtype(x, p["attn_norm"], eps), p, n_heads, n_kv_heads, positions, rope_base,
                                          window, cache, pairing=pairing)
    h = x + attended
    return h + swiglu(_rms_norm_in_dtype(h, p["ffn_norm"], eps), p["W_gate"], p["W_up"], p["W_down"]), cache
