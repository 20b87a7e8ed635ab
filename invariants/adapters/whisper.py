"""transformers' Whisper layers behind the protocol: the encoder layer as the block, the decoder layer as the encoder-decoder's decoder block.

WhisperEncoderLayer is x + self_attn(LN(x)), then x + fc2(gelu(fc1(LN(x)))): the protocol's block.
WhisperDecoderLayer adds cross-attention between the two: x + self_attn(LN₁(x)) (causal),
+ encoder_attn(LN₂(x), memory), + fc2(gelu(fc1(LN₃(x)))): the protocol's decoder_block. The parts come
from the same layers: attention is the decoder layer's self_attn, cross_attention its
encoder_attn (both WhisperAttention, eager: they return the weights), feed_forward the encoder
layer's fc1, activation and fc2, layer_norm its self_attn_layer_norm, gelu hidden_act "gelu" (erf).
Conventions converted:
- nn.Linear stores (out, in): every weight is the suite's transposed (T).
- Its attention has q, v and output biases but no k bias (k_proj has bias=False), so it cannot
  take the suite's attention biases: ATTENTION_BIASES is left undeclared (never drawn) and the
  three biases it has are zeros.
- Its LayerNorms are nn.LayerNorm(d_model): eps is fixed at torch's 1e-5 (LAYER_NORM_EPS = 1e-5).
- The self-attention mask is additive, -inf above the diagonal in causal mode, none in encoder
  mode; cross-attention has none.
"""

import functools

from transformers import WhisperConfig
from transformers.models.whisper.modeling_whisper import WhisperDecoderLayer, WhisperEncoderLayer

from invariants.adapters import toolkit as tk

BACKEND = "torch"
GELU_FORM = "erf"
LAYER_NORM_EPS = 1e-5


def attn(w="W"):  # WhisperAttention's layout for the suite's {w}_q ... {w}_o; k_proj has no bias
    return {"q_proj.weight": tk.T(f"{w}_q"), "k_proj.weight": tk.T(f"{w}_k"), "v_proj.weight": tk.T(f"{w}_v"), "out_proj.weight": tk.T(f"{w}_o"),
            "q_proj.bias": tk.zeros(f"{w}_q", axis=1), "v_proj.bias": tk.zeros(f"{w}_v", axis=1), "out_proj.bias": tk.zeros(f"{w}_o", axis=1)}


FFN = {"fc1.weight": tk.T("W1"), "fc1.bias": "b1", "fc2.weight": tk.T("W2"), "fc2.bias": "b2"}
ENCODER = tk.norm("self_attn_layer_norm", "ln1") | tk.under("self_attn.", attn()) | tk.norm("final_layer_norm", "ln2") | FFN
# The decoder layer has the encoder layer's parameters, cross-attention between them, and its final norm is the third (ln3 replaces ln2):
DECODER = ENCODER | tk.norm("encoder_attn_layer_norm", "ln2") | tk.under("encoder_attn.", attn("Wc")) | tk.norm("final_layer_norm", "ln3")


def _layer(d_model, n_heads=1, d_ff=1, decoder=False):
    config = WhisperConfig(d_model=d_model, encoder_attention_heads=n_heads, decoder_attention_heads=n_heads, encoder_ffn_dim=d_ff,
                           decoder_ffn_dim=d_ff, activation_function="gelu", attn_implementation="eager")
    return WhisperDecoderLayer(config, layer_idx=0) if decoder else WhisperEncoderLayer(config)


_decoder = functools.partial(_layer, decoder=True)
gelu = _layer(1).activation_fn  # ACT2FN["gelu"]: F.gelu, the erf form
layer_norm = tk.layer_norm(_layer, part="self_attn_layer_norm")
attention = tk.attention(_decoder, attn(), lambda a, x, causal: a(x, attention_mask=tk.causal_mask(x, causal, additive=True)), part="self_attn")
cross_attention = tk.cross_attention(_decoder, attn(), lambda a, x, memory: a(x, key_value_states=memory), part="encoder_attn")
feed_forward = tk.feed_forward(_layer, FFN, lambda layer, x: layer.fc2(layer.activation_fn(layer.fc1(x))))
transformer_block = tk.transformer_block(_layer, ENCODER, lambda layer, x, causal: layer(x, tk.causal_mask(x, causal, additive=True)))
decoder_block = tk.decoder_block(_decoder, DECODER, lambda layer, x, memory: layer(x, tk.causal_mask(x, additive=True), memory, use_cache=False))
