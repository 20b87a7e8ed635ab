"""torch's F.scaled_dot_product_attention with enable_gqa behind the protocol's gqa_attention and cross_attention.

    pytest --pyargs invariants --impl invariants.adapters.sdpa_gqa --impl-dtype float64

SDPA is the attention core: it takes q (B, H, T, D) and k, v (B, H_kv, S, D) and, with
enable_gqa=True, shares kv head h // (H / H_kv) with query head h (repeat-interleave), scaling by
1/√D. Its conventions, and what the adapter does with each:

- Causal alignment: is_causal=True aligns the mask top-left when T != S (query i sees keys 0..i:
  pytorch/pytorch#115111), while the protocol aligns bottom-right (a KV cache's queries are the
  last positions). The adapter passes is_causal=True only where the two agree (T = S, no window, no
  key mask) and otherwise builds the protocol's boolean mask itself: query i at position S - T + i
  sees keys j <= S - T + i, within the window when there is one, and only the keys the key mask
  keeps. Masks are booleans (True: may attend), never additive values.
- Fully masked rows: SDPA (torch >= 2.5) returns 0 for a query whose boolean mask row is all
  False, the protocol's default FULLY_MASKED_ROWS = "zeros"; nothing to convert.
- Weights: SDPA returns none. They are read from SDPA itself by attending over identity values,
  SDPA(q, k, I) = softmax(q·kᵀ/√D + mask) @ I, with the same mask and enable_gqa (so the identity
  has H_kv heads): the weights SDPA's kernel computes, not a second implementation of them.
- cross_attention: the protocol's projections and head split (x @ W, contiguous column blocks), then
  SDPA with no mask (queries from x, keys and values from memory).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

BACKEND = "torch"
PROTOCOL_VERSION = 2


def _mask(T, S, causal, key_mask, window, device):
    """The protocol's (B or 1, 1, T, S) boolean mask (True: may attend), or None where SDPA needs none."""
    if not causal and key_mask is None:
        return None
    query_position = torch.arange(S - T, S, device=device)[:, None]  # (T, 1): bottom-right aligned
    key_position = torch.arange(S, device=device)[None, :]  # (1, S)
    allowed = torch.ones(T, S, dtype=torch.bool, device=device)
    if causal:
        allowed &= key_position <= query_position
        if window is not None:
            allowed &= key_position > query_position - window
    allowed = allowed[None, None]  # (1, 1, T, S)
    if key_mask is not None:
        allowed = allowed & key_mask.to(torch.bool)[:, None, None, :]  # (B, 1, T, S)
    return allowed


def _sdpa(q, k, v, causal, key_mask, window):
    T, S = q.shape[2], k.shape[2]
    if causal and T == S and key_mask is None and window is None:
        return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)  # SDPA's own causal path
    return F.scaled_dot_product_attention(q, k, v, attn_mask=_mask(T, S, causal, key_mask, window, q.device), enable_gqa=True)


def gqa_attention(q, k, v, causal=True, key_mask=None, window=None):
    """q (B, H, T, D), k and v (B, H_kv, S, D) -> out (B, H, T, D) and the weights (B, H, T, S), through SDPA with enable_gqa."""
    B, H_kv, S, _ = k.shape
    out = _sdpa(q, k, v, causal, key_mask, window)  # (B, H, T, D)
    identity = torch.eye(S, dtype=q.dtype, device=q.device).expand(B, H_kv, S, S)  # (B, H_kv, S, S)
    return out, _sdpa(q, k, identity, causal, key_mask, window)  # (B, H, T, S): the weights SDPA applies


def cross_attention(x, memory, W_q, W_k, W_v, W_o, n_heads):
    """x (B, T, d), memory (B, S, d) -> out (B, T, d) and the weights (B, H, T, S), through SDPA without a mask."""
    B, T, d = x.shape
    S = memory.shape[1]
    D = d // n_heads

    def split(y, W):
        return (y @ W).reshape(B, y.shape[1], n_heads, D).transpose(1, 2)  # (B, H, len, D)

    q, k, v = split(x, W_q), split(memory, W_k), split(memory, W_v)
    heads = F.scaled_dot_product_attention(q, k, v)  # (B, H, T, D)
    identity = torch.eye(S, dtype=x.dtype, device=x.device).expand(B, n_heads, S, S)
    weights = F.scaled_dot_product_attention(q, k, identity)  # (B, H, T, S)
    return heads.transpose(1, 2).reshape(B, T, d) @ W_o, weights
