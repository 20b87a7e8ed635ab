"""karpathy/nanochat's RoPE (nanochat/gpt.py) and its attention core with its KV cache (nanochat/flash_attention.py) behind rope
and gqa_attention.

    pytest --pyargs invariants --impl invariants.adapters.nanochat --impl-dtype float32

Only these two: nanochat's GPT is no protocol Llama (RMSNorm without a gain, QK norm, a ReLU² MLP,
value embeddings, residual scalars). Its conventions, stated: RoPE pairs (i, i + D/2) (half split);
its tables are computed in float32 and cast to nanochat's COMPUTE_DTYPE (float32 on the CPU)
(COMPUTE_DTYPE = "float32"); it rotates by -θ, "the transpose of the textbook convention" (its own
comment), so its tables are read at -p (cos(-a) = cos(a), sin(-a) = -sin(a)) for the protocol's +θ.
The core is flash_attn_with_kvcache (FA3 on a GPU, its own SDPA path on the CPU, which this runs):
a window of w keys is its window_size (w - 1, 0) (FA3's left window counts the keys before the
query's own), -1 for none; it is causal whatever `causal` says and takes no padding mask.
"""

import torch
from nanochat.flash_attention import flash_attn_with_kvcache
from nanochat.gpt import GPT, apply_rotary_emb

from invariants.adapters import toolkit as tk

BACKEND = "torch"
ROPE_PAIRING = "half_split"
COMPUTE_DTYPE = "float32"
ATTENTION_WEIGHTS, CAUSAL_ONLY, KEY_MASK = False, True, False


def _rotate(x, positions, base):  # x (N, T, 1, D): nanochat's (B, T, H, D)
    cos, sin = GPT._precompute_rotary_embeddings(None, int(positions.max()) + 1, x.shape[-1], base=base, device=x.device)  # (1, P, 1, D/2)
    return apply_rotary_emb(x, cos[:, positions], -sin[:, positions])


def gqa_attention(q, k, v, causal, key_mask, window):
    (B, H, T, D), (H_kv, S) = q.shape, k.shape[1:3]
    k_cache, v_cache = k.new_zeros(B, S, H_kv, D), v.new_zeros(B, S, H_kv, D)  # its KVCache's layer: (B, T_max, H_kv, D)
    seqlens, window_size = torch.zeros(B, dtype=torch.int32, device=q.device), (-1 if window is None else window - 1, 0)
    for start, end in ((0, S - T), (S - T, S)) if S > T else ((0, S),):  # the cached keys' prefill, then the queries
        queries = q if end == S else q.new_zeros(B, H, end - start, D)
        out = flash_attn_with_kvcache(queries.transpose(1, 2), k_cache, v_cache, k=k[:, :, start:end].transpose(1, 2),
                                      v=v[:, :, start:end].transpose(1, 2), cache_seqlens=seqlens, causal=True, window_size=window_size)
        seqlens += end - start  # what its KVCache.advance does after the last layer
    return out.transpose(1, 2)  # (B, T, H, D) -> (B, H, T, D)


rope = tk.rope(_rotate)
