"""torch's nn.MultiheadAttention (batch_first, no biases) behind the protocol's attention.

Conventions converted:
- nn.Linear computes x @ weightᵀ, so in_proj_weight = [W_qᵀ; W_kᵀ; W_vᵀ] (3d, d) and
  out_proj.weight = W_oᵀ. The protocol's weights are handed to the module with
  torch.func.functional_call, so autograd reaches them and nothing is copied.
- The causal mask is a boolean attn_mask, True where a query may NOT attend (key > query).
- MultiheadAttention averages the weights over heads by default; average_attn_weights=False
  returns them per head, (B, H, T, T), as the protocol wants.
"""

from __future__ import annotations

from functools import lru_cache

import torch
from torch.func import functional_call

BACKEND = "torch"


@lru_cache(maxsize=32)
def _module(d, n_heads, dtype, device):
    """An nn.MultiheadAttention of this shape; its own weights are never used (functional_call replaces them)."""
    return torch.nn.MultiheadAttention(d, n_heads, bias=False, batch_first=True, dtype=dtype, device=device).eval()


def attention(x, W_q, W_k, W_v, W_o, n_heads, causal=True):
    """(B, T, d) -> (B, T, d) and the weights (B, H, T, T), through nn.MultiheadAttention."""
    T, d = x.shape[1], x.shape[2]
    module = _module(d, n_heads, x.dtype, x.device)
    weights = {"in_proj_weight": torch.cat([W_q.T, W_k.T, W_v.T]), "out_proj.weight": W_o.T}  # (3d, d), (d, d)
    mask = torch.triu(torch.ones(T, T, dtype=torch.bool, device=x.device), diagonal=1) if causal else None  # (T, T)
    options = {"attn_mask": mask, "need_weights": True, "average_attn_weights": False}
    return functional_call(module, weights, (x, x, x), options)  # out (B, T, d), weights (B, H, T, T)
