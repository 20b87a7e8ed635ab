"""torch's nn.MultiheadAttention (batch_first, no biases) behind the protocol's attention.

Conventions converted:
- nn.Linear computes x @ weightᵀ, so in_proj_weight = [W_qᵀ; W_kᵀ; W_vᵀ] (3d, d) and
  out_proj.weight = W_oᵀ, handed to the module through the toolkit (torch.func.functional_call),
  so autograd reaches them and nothing is copied.
- The causal mask is a boolean attn_mask, True where a query may NOT attend (key > query).
- MultiheadAttention averages the weights over heads by default; average_attn_weights=False
  returns them per head, (B, H, T, T), as the protocol wants.
"""

import torch

from invariants.adapters import toolkit as tk

BACKEND = "torch"
LAYOUT = {"in_proj_weight": tk.cat(tk.T("W_q"), tk.T("W_k"), tk.T("W_v")), "out_proj.weight": tk.T("W_o")}  # (3d, d), (d, d)


def _mha(d_model, n_heads):
    return torch.nn.MultiheadAttention(d_model, n_heads, bias=False, batch_first=True)


def _forward(mha, x, causal):
    return mha(x, x, x, attn_mask=tk.causal_mask(x, causal), need_weights=True, average_attn_weights=False)  # out (B, T, d), weights (B, H, T, T)


attention = tk.attention(_mha, LAYOUT, _forward)
