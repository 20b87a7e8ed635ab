"""torch's nn.TransformerDecoderLayer(norm_first=True, batch_first=True, activation="gelu") behind the protocol: the encoder-decoder's decoder block.

The layer is x + self_attn(norm1(x)) (causal), + multihead_attn(norm2(x), memory), + linear2(gelu(linear1(norm3(x)))):
the protocol's decoder_block. The parts come from the same layer: cross_attention is its
multihead_attn (nn.MultiheadAttention over the memory, asked for per-head weights), attention its
self_attn, feed_forward its _ff_block, layer_norm its norm1, gelu its activation.
Conventions converted:
- nn.Linear stores (out, in): in_proj_weight = [W_qᵀ; W_kᵀ; W_vᵀ] (Wc_… for multihead_attn),
  out_proj.weight = W_oᵀ, linear1.weight = W1ᵀ, linear2.weight = W2ᵀ.
- activation="gelu" is F.gelu, the erf form (GELU_FORM = "erf").
- Its attention always has biases, and the protocol's decoder block has none: they are zeros.
- The causal mask is a boolean tgt_mask (True above the diagonal) with tgt_is_causal=True; the
  cross-attention has none.
"""

import torch

from invariants.adapters import toolkit as tk

BACKEND = "torch"
GELU_FORM = "erf"


def attn(w="W"):  # nn.MultiheadAttention's layout for the suite's {w}_q ... {w}_o, its biases zeros
    zero = [tk.zeros(f"{w}_{p}", axis=1) for p in "qkv"]
    return {"in_proj_weight": tk.cat(*(tk.T(f"{w}_{p}") for p in "qkv")), "in_proj_bias": tk.cat(*zero),
            "out_proj.weight": tk.T(f"{w}_o"), "out_proj.bias": tk.zeros(f"{w}_o", axis=1)}


FFN = {"linear1.weight": tk.T("W1"), "linear1.bias": "b1", "linear2.weight": tk.T("W2"), "linear2.bias": "b2"}
LAYER = (tk.norm("norm1", "ln1") | tk.norm("norm2", "ln2") | tk.norm("norm3", "ln3") | tk.under("self_attn.", attn())
         | tk.under("multihead_attn.", attn("Wc")) | FFN)


def _layer(d_model, n_heads=1, d_ff=1, eps=1e-5):
    return torch.nn.TransformerDecoderLayer(d_model, n_heads, d_ff, dropout=0.0, activation="gelu", layer_norm_eps=eps,
                                            batch_first=True, norm_first=True)


def _attend(mha, x, memory, mask=None):  # out (B, T, d), weights (B, H, T, S)
    return mha(x, memory, memory, attn_mask=mask, need_weights=True, average_attn_weights=False)


gelu = _layer(1).activation  # F.gelu
layer_norm = tk.layer_norm(_layer, part="norm1")
attention = tk.attention(_layer, attn(), lambda mha, x, causal: _attend(mha, x, x, tk.causal_mask(x, causal)), part="self_attn")
cross_attention = tk.cross_attention(_layer, attn(), _attend, part="multihead_attn")
feed_forward = tk.feed_forward(_layer, FFN, lambda layer, x: layer._ff_block(x))
decoder_block = tk.decoder_block(_layer, LAYER, lambda layer, x, memory: layer(x, memory, tgt_mask=tk.causal_mask(x), tgt_is_causal=True))
