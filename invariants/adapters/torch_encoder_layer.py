"""torch's nn.TransformerEncoderLayer(norm_first=True, batch_first=True, activation="gelu") behind the protocol: a pre-norm block.

The layer is x + self_attn(norm1(x)), then x + linear2(gelu(linear1(norm2(x)))): the protocol's
block. The parts come from the same layer: attention is its self_attn (nn.MultiheadAttention,
asked for per-head weights), feed_forward its _ff_block (linear1, the activation, linear2),
layer_norm its norm1, gelu its activation.
Conventions converted:
- nn.Linear stores (out, in): in_proj_weight = [W_qᵀ; W_kᵀ; W_vᵀ], out_proj.weight = W_oᵀ,
  linear1.weight = W1ᵀ, linear2.weight = W2ᵀ.
- activation="gelu" is F.gelu, the erf form (GELU_FORM = "erf").
- Its attention always has biases (ATTENTION_BIASES = True): in_proj_bias = [b_q; b_k; b_v],
  out_proj.bias = b_o, zeros where the suite drew none.
- dim_feedforward and layer_norm_eps are constructor arguments: the layer is built with the
  suite's d_ff and eps (1e-5 for the block, its default).
- Causal mode passes a boolean src_mask (True above the diagonal) with is_causal=True; encoder
  mode passes none. In eval mode, without autograd and with an even number of heads, torch runs
  the layer on its fused "fast path" (torch._transformer_encoder_layer_fwd); with odd heads, or
  autograd, on the Python modules: the suite's draws test both, as users get them.
"""

import torch

from invariants.adapters import toolkit as tk

BACKEND = "torch"
GELU_FORM = "erf"
ATTENTION_BIASES = True

ATTN = {"in_proj_weight": tk.cat(tk.T("W_q"), tk.T("W_k"), tk.T("W_v")), "in_proj_bias": tk.cat("b_q", "b_k", "b_v"),
        "out_proj.weight": tk.T("W_o"), "out_proj.bias": "b_o"}
FFN = {"linear1.weight": tk.T("W1"), "linear1.bias": "b1", "linear2.weight": tk.T("W2"), "linear2.bias": "b2"}
BLOCK = tk.norm("norm1", "ln1") | tk.norm("norm2", "ln2") | tk.under("self_attn.", ATTN) | FFN


def _layer(d_model, n_heads=1, d_ff=1, eps=1e-5):
    return torch.nn.TransformerEncoderLayer(d_model, n_heads, d_ff, dropout=0.0, activation="gelu", layer_norm_eps=eps,
                                            batch_first=True, norm_first=True)


def _attend(mha, x, causal):
    return mha(x, x, x, attn_mask=tk.causal_mask(x, causal), need_weights=True, average_attn_weights=False)  # out (B, T, d), weights (B, H, T, T)


gelu = _layer(1).activation  # F.gelu
layer_norm = tk.layer_norm(_layer, part="norm1")
attention = tk.attention(_layer, ATTN, _attend, part="self_attn")
feed_forward = tk.feed_forward(_layer, FFN, lambda layer, x: layer._ff_block(x))
transformer_block = tk.transformer_block(_layer, BLOCK, lambda layer, x, causal: layer(x, src_mask=tk.causal_mask(x, causal), is_causal=causal))
