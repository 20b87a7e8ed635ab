"""transformers' ViT encoder layer (ViTLayer) behind the protocol: a pre-norm block with no decoder mode.

ViTLayer is x + attention(layernorm_before(x)), then x + mlp(layernorm_after(x)): the protocol's
block. ViTModel never builds a mask (every patch sees every patch), so the adapter declares
ENCODER_ONLY = True and is called with causal=False only; the decoder-mode invariants are skipped
with that reason. The parts come from the same layer: attention is its ViTAttention (eager, which
returns the weights), feed_forward its ViTMLP, layer_norm its layernorm_before, gelu the
activation of hidden_act="gelu" (the erf form, ViT's default).
Conventions converted:
- nn.Linear stores (out, in): q_proj.weight = W_qᵀ, ..., o_proj.weight = W_oᵀ, fc1.weight = W1ᵀ, fc2.weight = W2ᵀ.
- Its attention always has biases (qkv_bias=True, and o_proj's): ATTENTION_BIASES = True, zeros
  where the suite drew none.
- Its softmax runs in float32 whatever the input (COMPUTE_DTYPE = "float32"): a float64 run holds the
  laws held to rounding to float32's (invariants.conventions.rounding_dtype).
- intermediate_size and layer_norm_eps are config fields: the layer is built with the suite's d_ff
  and eps (ViT's own default eps is 1e-12).
"""

from transformers import ViTConfig
from transformers.activations import ACT2FN
from transformers.models.vit.modeling_vit import ViTLayer

from invariants.adapters import toolkit as tk

BACKEND = "torch"
GELU_FORM = "erf"
COMPUTE_DTYPE = "float32"  # its eager attention's softmax, whatever the input dtype
ATTENTION_BIASES = True
ENCODER_ONLY = True

ATTN = {f"{p}_proj.{kind}": spec for p in "qkvo" for kind, spec in (("weight", tk.T(f"W_{p}")), ("bias", f"b_{p}"))}
MLP = {"fc1.weight": tk.T("W1"), "fc1.bias": "b1", "fc2.weight": tk.T("W2"), "fc2.bias": "b2"}
BLOCK = tk.norm("layernorm_before", "ln1") | tk.norm("layernorm_after", "ln2") | tk.under("attention.", ATTN) | tk.under("mlp.", MLP)


def _layer(d_model, n_heads=1, d_ff=1, eps=1e-5):
    return ViTLayer(ViTConfig(hidden_size=d_model, num_attention_heads=n_heads, intermediate_size=d_ff, layer_norm_eps=eps,
                              hidden_act="gelu", attn_implementation="eager"))


gelu = ACT2FN["gelu"]
layer_norm = tk.layer_norm(_layer, part="layernorm_before")
attention = tk.attention(_layer, ATTN, lambda attn, x, causal: attn(x), part="attention")  # returns (out, weights)
feed_forward = tk.feed_forward(_layer, MLP, part="mlp")
transformer_block = tk.transformer_block(_layer, BLOCK, lambda layer, x, causal: layer(x))
