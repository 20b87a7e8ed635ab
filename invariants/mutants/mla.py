"""Broken multi-head latent attention: each a bug that shipped (cited) or that a port of DeepSeek's MLA invites."""

import math

import numpy as np

from invariants.mutants import mutant
from invariants.reference.numpy import (
    EPS,
    ROPE_BASE,
    masked_softmax,
    merge_heads,
    mla_absorbed,
    mla_attention,
    mla_latent,
    mla_query,
    mla_widths,
    rms_norm,
    rope,
    split_heads,
    visible_keys,
)


@mutant(
    also_named_by=("mla.agrees_with_reference",),
    replaces="mla_softmax_scale",
    killed_by="mla.softmax_scale_known_values",
    bug="YaRN's mscale² left out of MLA's softmax scale: 1/√(D_n + D_r) whatever the factor (onnxruntime/mobius#548; "
    "DeepSeek-V2 in huggingface/transformers#47435)",
)
def unscaled_by_mscale_softmax_scale(qk_nope_head_dim, qk_rope_head_dim, mscale):
    return 1.0 / math.sqrt(qk_nope_head_dim + qk_rope_head_dim)  # BUG: no mscale²


@mutant(
    also_named_by=("mla.agrees_with_reference",),
    replaces="mla_softmax_scale",
    killed_by="mla.softmax_scale_known_values",
    bug="the softmax scale's exponent sign reversed: scores multiplied by √(D_n + D_r) (AI-Hypercomputer/maxtext#1370)",
)
def reversed_softmax_scale(qk_nope_head_dim, qk_rope_head_dim, mscale):
    return mscale * mscale * math.sqrt(qk_nope_head_dim + qk_rope_head_dim)  # BUG: √D, not 1/√D


@mutant(
    replaces="mla_softmax_scale",
    killed_by="mla.softmax_scale_known_values",
    bug="the softmax scaled by 1/√D_n (qk_nope_head_dim, the head width of a model without the decoupled RoPE part), not 1/√(D_n + D_r)",
)
def nope_width_softmax_scale(qk_nope_head_dim, qk_rope_head_dim, mscale):
    return mscale * mscale / math.sqrt(qk_nope_head_dim)  # BUG: D_r left out


def _half_rope(x, positions, base=ROPE_BASE, *, pairing="half_split"):
    """RoPE on the first half of the D_r features only (rounded down to pairs), the rest passed through."""
    turned = 2 * (x.shape[-1] // 4)
    return np.concatenate([rope(x[..., :turned], positions, base, pairing=pairing), x[..., turned:]], axis=-1) if turned else x


@mutant(
    replaces="mla_latent",
    killed_by="mla.agrees_with_reference",
    also_named_by=("mla.cache_agrees_with_reference",),
    bug="a partial_rotary_factor of 0.5 applied to MLA's RoPE head: only half of the D_r features turn (vllm-project/vllm#41185)",
)
def half_rotated_mla_latent(x, p, positions, rope_base, *, pairing="half_split", eps=EPS):
    latent = rms_norm(x @ p["W_dkv"], p["kv_norm"], eps)
    return np.concatenate([latent, _half_rope(x @ p["W_kr"], positions, rope_base, pairing=pairing)], axis=-1)  # BUG: half rotated


@mutant(
    replaces="mla_attention",
    killed_by="mla.nope_part_position_free",
    bug="RoPE sized by qk_nope_head_dim and turning the position-free features of q and k "
    "(junfanz1/MiniGPT-and-DeepSeek-MLA-Multi-Head-Latent-Attention#1, its third point)",
)
def rotated_nope_mla_attention(x, params, n_heads, positions, rope_base=ROPE_BASE, mscale=1.0, *, pairing="half_split", eps=EPS):
    p = params
    D_n, D_r, _ = mla_widths(p, n_heads)
    q = mla_query(x, p, n_heads, positions, rope_base, pairing=pairing, eps=eps)  # (B, H, T, D_n + D_r)
    cache = mla_latent(x, p, positions, rope_base, pairing=pairing, eps=eps)
    k_nope = split_heads(cache[..., :-D_r] @ p["W_uk"], n_heads)  # (B, H, T, D_n)
    if D_n % 2 == 0:  # BUG: the nope features rotated too
        q = np.concatenate([rope(q[..., :D_n], positions, rope_base, pairing=pairing), q[..., D_n:]], axis=-1)
        k_nope = rope(k_nope, positions, rope_base, pairing=pairing)
    k = np.concatenate([k_nope, np.broadcast_to(cache[:, None, :, -D_r:], (*k_nope.shape[:-1], D_r))], axis=-1)
    v = split_heads(cache[..., :-D_r] @ p["W_uv"], n_heads)
    T = x.shape[1]
    scores = q @ k.swapaxes(-1, -2) * mscale * mscale / math.sqrt(D_n + D_r)
    weights = masked_softmax(scores, np.broadcast_to(visible_keys(T, T), scores.shape))
    return merge_heads(weights @ v) @ p["W_o"], weights


@mutant(
    replaces="mla_latent",
    killed_by="mla.latent_rescaling_invariant",
    also_named_by=("mla.agrees_with_reference", "mla.cache_agrees_with_reference"),
    bug="kv_a_layernorm skipped: the latent x·W_dkv up-projected and cached without its RMSNorm",
)
def unnormalised_mla_latent(x, p, positions, rope_base, *, pairing="half_split", eps=EPS):
    return np.concatenate([x @ p["W_dkv"], rope(x @ p["W_kr"], positions, rope_base, pairing=pairing)], axis=-1)  # BUG: no kv_norm


@mutant(
    replaces="mla_decode",
    killed_by="mla.cache_size",
    bug="the decompressed per-head keys and values cached instead of the latent and the RoPE key: H·(D_n + D_r + D_v) numbers a "
    "token (deepseek-ai/DeepSeek-R1#238: the released modeling_deepseek.py)",
)
def decompressed_cache_mla_decode(x, params, n_heads, positions, rope_base=ROPE_BASE, mscale=1.0, chunks=None, *, pairing="half_split",
                                  eps=EPS):
    out, _ = mla_attention(x, params, n_heads, positions, rope_base, mscale, pairing=pairing, eps=eps)
    D_n, D_r, _ = mla_widths(params, n_heads)
    cache = mla_latent(x, params, positions, rope_base, pairing=pairing, eps=eps)
    k_nope, v = cache[..., :-D_r] @ params["W_uk"], cache[..., :-D_r] @ params["W_uv"]  # (B, T, H·D_n), (B, T, H·D_v)
    k_rope = np.tile(cache[..., -D_r:], n_heads)  # (B, T, H·D_r): BUG: every head's keys and values held
    return out, np.concatenate([k_nope, k_rope, v], axis=-1)


@mutant(
    replaces="mla_absorbed",
    killed_by="mla.decode_equals_attention",
    bug="W_uv absorbed from the wrong storage order: the (r_kv, H·D_v) matrix viewed as nn.Linear's (H·D_v, r_kv) weight, so each "
    "head's output reads scrambled value weights",
)
def transposed_value_mla_absorbed(q, cache, p, n_heads, mscale):
    D_n, D_r, D_v = mla_widths(p, n_heads)
    r_kv = p["W_uk"].shape[0]
    W_uv = p["W_uv"].reshape(n_heads, D_v, r_kv).transpose(2, 0, 1)  # BUG: (r_kv, H·D_v) read as nn.Linear's (H·D_v, r_kv) storage
    W_uk = p["W_uk"].reshape(r_kv, n_heads, D_n)
    latent, k_rope = cache[:, None, :, :-D_r], cache[:, None, :, -D_r:]
    scores = (np.einsum("bhtn,rhn->bhtr", q[..., :D_n], W_uk) @ latent.swapaxes(-1, -2) + q[..., D_n:] @ k_rope.swapaxes(-1, -2))
    scores = scores * mscale * mscale / math.sqrt(D_n + D_r)
    T, S = q.shape[2], cache.shape[1]
    weights = masked_softmax(scores, np.broadcast_to(visible_keys(T, S), scores.shape))
    return np.einsum("bhtr,rhv->bhtv", weights @ latent, W_uv)


@mutant(
    replaces="mla_decode",
    killed_by="mla.decode_equals_attention",
    bug="each decode chunk's queries and keys rotated from position 0, not at their own positions (pytorch/executorch#2010)",
)
def chunk_from_zero_mla_decode(x, params, n_heads, positions, rope_base=ROPE_BASE, mscale=1.0, chunks=None, *, pairing="half_split",
                               eps=EPS):
    T = x.shape[1]
    chunks = [T] if chunks is None else [int(n) for n in np.asarray(chunks).reshape(-1)]
    outs, cached, start = [], [], 0
    for n in chunks:
        new, at = x[:, start : start + n], np.arange(n)  # BUG: 0..n-1 for every chunk
        cached.append(mla_latent(new, params, at, rope_base, pairing=pairing, eps=eps))
        cache = np.concatenate(cached, axis=1)
        q = mla_query(new, params, n_heads, at, rope_base, pairing=pairing, eps=eps)
        outs.append(merge_heads(mla_absorbed(q, cache, params, n_heads, mscale)) @ params["W_o"])
        start += n
    return np.concatenate(outs, axis=1), cache


@mutant(replaces="mla_latent", killed_by="mla.agrees_with_reference", dtype="float16",
        bug="the latent's RMSNorm squares its float16 projection without an upcast: latents past 256 square to inf and normalise to "
        "0 (xlite-dev/LeetCUDA#335: its fp16 rms_norm and layer_norm overflowed and gave zeros after dividing by infinity)")
def latent_norm_in_float16(x, p, positions, rope_base, *, pairing="half_split", eps=EPS):
    c = x @ p["W_dkv"]  # (B, T, r_kv)
    latent = c / np.sqrt((c * c).mean(axis=-1, keepdims=True) + eps) * p["kv_norm"]  # BUG: c² in float16
    return np.concatenate([latent, rope(x @ p["W_kr"], positions, rope_base, pairing=pairing)], axis=-1)
