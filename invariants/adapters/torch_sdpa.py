"""torch's F.scaled_dot_product_attention behind the protocol's attention.

SDPA is the attention core only, so the projections, the head split and the output
projection are the protocol's own (x @ W, then (B, T, d) -> (B, H, T, D)). SDPA scales by
1/√D and masks with is_causal. It returns no weights; they are read from SDPA itself by
attending over identity values: SDPA(q, k, I) = softmax(q·kᵀ/√D + mask) @ I, the weights
SDPA's kernel computes, not a second implementation of them. (An adapter that wants only the
output declares ATTENTION_WEIGHTS = False and returns `heads` merged and projected.)
"""

import torch
import torch.nn.functional as F

BACKEND = "torch"


def attention(x, W_q, W_k, W_v, W_o, n_heads, causal=True):
    """(B, T, d) -> (B, T, d) and the weights (B, H, T, T), through F.scaled_dot_product_attention."""
    B, T, d = x.shape
    q, k, v = ((x @ W).reshape(B, T, n_heads, d // n_heads).transpose(1, 2) for W in (W_q, W_k, W_v))  # (B, T, d) -> (B, H, T, D)
    heads = F.scaled_dot_product_attention(q, k, v, is_causal=causal)  # (B, H, T, D)
    identity = torch.eye(T, dtype=x.dtype, device=x.device).expand(B, n_heads, T, T)  # (B, H, T, T)
    weights = F.scaled_dot_product_attention(q, k, identity, is_causal=causal)  # (B, H, T, T) @ I: the weights
    return heads.transpose(1, 2).reshape(B, T, d) @ W_o, weights  # (B, H, T, D) -> (B, T, d)
