"""lucidrains' x-transformers (pip install x-transformers) behind the protocol: its Decoder and Encoder of depth 1 as the block, and their parts.

A Decoder(depth=1) is x + Attention(LayerNorm(x)), then x + FeedForward(LayerNorm(x)): the protocol's
pre-norm block, causal; an Encoder is the same block in encoder mode. pre_norm_has_final_norm=False
leaves out the norm a stack ends with. The parts come from the same layers: attention is layer 0's
Attention (its weights from return_intermediates), feed_forward layer 1's FeedForward, layer_norm
layer 0's LayerNorm, gelu the FeedForward's activation (nn.GELU, erf).
Conventions converted or declared:
- nn.Linear stores (out, in): to_q.weight = W_qᵀ, ..., to_out.weight = W_oᵀ, ff.0.0.weight = W1ᵀ, ff.2.weight = W2ᵀ.
- Its LayerNorm multiplies by gamma + 1 (norm_add_unit_offset, on by default): gamma = gain - 1. It
  has no bias (LAYER_NORM_BIAS = False) and nn.LayerNorm's fixed eps (LAYER_NORM_EPS = 1e-5). Its
  attention has no biases (ATTENTION_BIASES undeclared), its feed-forward has them and the erf GELU
  (GELU_FORM = "erf").
- With one head its attention leaves out the output projection unless asked (project_out): the
  protocol's always has W_o, so it is asked for (attn_project_out=True).
- The feed-forward width is dim·ff_mult, truncated to an int: ff_mult = Fraction(d_ff, d_model) makes it d_ff exactly.
- Its attention computes the softmax in float32 whatever the input dtype (Attend's attn_fn):
  COMPUTE_DTYPE = "float32", and it is compared in float32, as ViT is (tox -e external).
"""

from fractions import Fraction

from x_transformers import Decoder, Encoder

from invariants.adapters import toolkit as tk

BACKEND = "torch"
GELU_FORM = "erf"
LAYER_NORM_BIAS = False
LAYER_NORM_EPS = 1e-5
COMPUTE_DTYPE = "float32"


def _offset(gain):  # its LayerNorm multiplies by gamma + 1
    return lambda params: params[gain] - 1


ATTN = {"to_q.weight": tk.T("W_q"), "to_k.weight": tk.T("W_k"), "to_v.weight": tk.T("W_v"), "to_out.weight": tk.T("W_o")}
FFN = {"ff.0.0.weight": tk.T("W1"), "ff.0.0.bias": "b1", "ff.2.weight": tk.T("W2"), "ff.2.bias": "b2"}
NORMS = {"layers.0.0.0.gamma": _offset("ln1_g"), "layers.1.0.0.gamma": _offset("ln2_g")}
BLOCK = NORMS | tk.under("layers.0.1.", ATTN) | tk.under("layers.1.1.", FFN)


def _layers(d_model, n_heads=1, d_ff=None, causal=True):
    return (Decoder if causal else Encoder)(dim=d_model, depth=1, heads=n_heads, attn_dim_head=d_model // n_heads, attn_project_out=True,
                                            ff_mult=Fraction(d_ff or 4 * d_model, d_model), pre_norm_has_final_norm=False)


def _attend(attn, x, causal):
    out, intermediates = attn(x, causal=causal, return_intermediates=True)
    return out, intermediates.post_softmax_attn  # (B, T, d), (B, H, T, T)


gelu = _layers(1).get_submodule("layers.1.1.ff.0.1")  # the FeedForward's own activation, nn.GELU()
layer_norm = tk.layer_norm(_layers, layout={"gamma": _offset("gain")}, part="layers.0.0.0")
attention = tk.attention(_layers, ATTN, _attend, part="layers.0.1")
feed_forward = tk.feed_forward(_layers, FFN, part="layers.1.1")
transformer_block = tk.transformer_block(_layers, BLOCK, lambda stack, x, causal: stack(x))
