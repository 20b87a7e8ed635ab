"""Broken per-layer attention types: each a bug that reached a release of transformers, vLLM, Megatron-Bridge, litgpt or an
inference engine (cited)."""

import numpy as np

from invariants.mutants import mutant
from invariants.reference.numpy import cache_positions, check_vocab_ids, chunk_positions, layer_attention, llama_block_step, rms_norm


@mutant(
    also_named_by=("layer_types.hybrid_logits_agree_with_reference",),
    replaces="layer_attention",
    killed_by="layer_types.one_type_is_llama",
    bug="the sliding window on every layer, full ones included: Qwen2's max_window_layers lost in an attention refactor "
    "(huggingface/transformers#36162, fixing #35924)",
)
def every_layer_sliding_layer_attention(layer_types, window, rope_bases):
    return [(window, base) for _, base in layer_attention(layer_types, window, rope_bases)]  # BUG: full layers windowed too


@mutant(
    replaces="layer_attention",
    killed_by="layer_types.far_tokens_unseen_by_sliding_layers",
    bug="global attention on every layer, the sliding layers' window never applied (lablup/mlxcel#495, fixed by #555)",
)
def no_layer_sliding_layer_attention(layer_types, window, rope_bases):
    return [(None, base) for _, base in layer_attention(layer_types, window, rope_bases)]  # BUG: no window anywhere


@mutant(
    replaces="layer_attention",
    killed_by="layer_types.hybrid_logits_agree_with_reference",
    bug="Gemma 2's local and global layers swapped: sliding on layers 1, 3, 5 instead of 0, 2, 4 (huggingface/transformers#31775)",
)
def inverted_layer_attention(layer_types, window, rope_bases):
    swapped = ["full_attention" if kind == "sliding_attention" else "sliding_attention" for kind in layer_types]  # BUG
    return [(w, rope_bases[kind]) for (w, _), kind in zip(layer_attention(swapped, window, rope_bases), layer_types, strict=True)]


@mutant(
    replaces="layer_attention",
    killed_by="layer_types.hybrid_logits_agree_with_reference",
    bug="the pattern one layer off: a one-based layer number indexed into the zero-based layer_types "
    "(NVIDIA-NeMo/Megatron-Bridge#4875; litgpt's layer_idx + 1 map, Lightning-AI/litgpt#1972)",
)
def shifted_layer_attention(layer_types, window, rope_bases):
    shifted = [*layer_types[1:], layer_types[0]]  # BUG: layer i takes layer i + 1's type
    return [(w, rope_bases[kind]) for (w, _), kind in zip(layer_attention(shifted, window, rope_bases), layer_types, strict=True)]


@mutant(
    replaces="layer_attention",
    killed_by="layer_types.rope_base_read_by_type",
    bug="one RoPE base for every layer, Gemma 3's global layers rotated on the local 10,000 (Lightning-AI/litgpt#1993 added the "
    "local base; google/gemma.cpp#986)",
)
def one_base_layer_attention(layer_types, window, rope_bases):
    return [(w, float(rope_bases["sliding_attention"])) for w, _ in layer_attention(layer_types, window, rope_bases)]  # BUG


@mutant(
    replaces="hybrid_decode",
    killed_by="layer_types.hybrid_decode_matches_full_forward",
    bug="after the prefill the window applied to every layer: global layers lose the keys older than the window "
    "(vllm-project/vllm#51756)",
)
def windowed_decode_hybrid_decode(ids, params, n_heads, n_kv_heads, layer_types, window, rope_bases, chunks=None, *,
                                  pairing="half_split", eps=1e-5):
    ids = np.asarray(ids)
    check_vocab_ids(ids, params["embed"].shape[0])
    chunks = [ids.shape[1]] if chunks is None else [int(n) for n in np.asarray(chunks).reshape(-1)]
    layers = layer_attention(layer_types, window, rope_bases)
    cache, logits, caches, start = [None] * len(layers), [], [], 0
    for n in chunks:
        x = params["embed"][ids[:, start : start + n]]
        for layer, (block, (w, base)) in enumerate(zip(params["blocks"], layers, strict=True)):
            x, cache[layer] = llama_block_step(x, block, n_heads, n_kv_heads, base, w if start == 0 else window,  # BUG: window in decode
                                               chunk_positions(start, n), cache[layer], pairing=pairing, eps=eps)
        logits.append(rms_norm(x, params["norm"], eps) @ params["W_out"])
        caches.append(list(cache))
        start += n
    return np.concatenate(logits, axis=1), cache_positions(caches, n_kv_heads)
