"""Broken blocks: post-norm, a replaced or missing residual, the wrong norm, a dropped or forced mask, parallel sublayers.

Each takes the reference's gelu_form and eps options (its gpt_logits passes them on) and uses them.
"""

import numpy as np

from invariants.mutants import mutant
from invariants.mutants.attention import _buffered_future, _finish, _masked_softmax, _qkv, _scores
from invariants.reference.numpy import ATTENTION_BIAS_NAMES, EPS, attention, feed_forward, layer_norm


def _attend(h, p, n_heads, causal):
    """The attention sublayer's output on an already-normalised h, with the biases when present."""
    biases = {name: p[name] for name in ATTENTION_BIAS_NAMES if name in p}
    return attention(h, p["W_q"], p["W_k"], p["W_v"], p["W_o"], n_heads, causal, **biases)[0]


def _ffn(h, p, gelu_form):
    return feed_forward(h, p["W1"], p["b1"], p["W2"], p["b2"], gelu_form=gelu_form)


@mutant(replaces="transformer_block", killed_by="block.residual_identity", bug="post-norm: LN(x + f(x)) as in the 2017 Transformer")
def post_norm_block(x, params, n_heads, causal=True, *, gelu_form="tanh", eps=EPS):
    p = params
    x = layer_norm(x + _attend(x, p, n_heads, causal), p["ln1_g"], p["ln1_b"], eps)
    return layer_norm(x + _ffn(x, p, gelu_form), p["ln2_g"], p["ln2_b"], eps)


@mutant(replaces="transformer_block", killed_by="block.residual_identity", bug="the residual is replaced, not added: x = attn(LN(x))")
def replaced_residual_block(x, params, n_heads, causal=True, *, gelu_form="tanh", eps=EPS):
    p = params
    x = _attend(layer_norm(x, p["ln1_g"], p["ln1_b"], eps), p, n_heads, causal)
    return x + _ffn(layer_norm(x, p["ln2_g"], p["ln2_b"], eps), p, gelu_form)


@mutant(replaces="transformer_block", killed_by="block.residual_identity", bug="the feed-forward sublayer has no skip connection")
def no_skip_ffn_block(x, params, n_heads, causal=True, *, gelu_form="tanh", eps=EPS):
    p = params
    x = x + _attend(layer_norm(x, p["ln1_g"], p["ln1_b"], eps), p, n_heads, causal)
    return _ffn(layer_norm(x, p["ln2_g"], p["ln2_b"], eps), p, gelu_form)


@mutant(replaces="transformer_block", killed_by="block.feed_forward_sublayer_alone", bug="the feed-forward's norm uses ln1's gain and bias")
def shared_norm_block(x, params, n_heads, causal=True, *, gelu_form="tanh", eps=EPS):
    p = params
    x = x + _attend(layer_norm(x, p["ln1_g"], p["ln1_b"], eps), p, n_heads, causal)
    return x + _ffn(layer_norm(x, p["ln1_g"], p["ln1_b"], eps), p, gelu_form)


@mutant(replaces="transformer_block", killed_by="block.attention_sublayer_alone", bug="attention reads the stream without its LayerNorm")
def unnormed_attention_block(x, params, n_heads, causal=True, *, gelu_form="tanh", eps=EPS):
    p = params
    x = x + _attend(x, p, n_heads, causal)
    return x + _ffn(layer_norm(x, p["ln2_g"], p["ln2_b"], eps), p, gelu_form)


@mutant(also_named_by=("block.attention_sublayer_alone",),
        replaces="transformer_block", killed_by="block.causal_non_leakage", bug="causal is not passed on: the attention never masks")
def unmasked_block(x, params, n_heads, causal=True, *, gelu_form="tanh", eps=EPS):
    p = params
    x = x + _attend(layer_norm(x, p["ln1_g"], p["ln1_b"], eps), p, n_heads, False)
    return x + _ffn(layer_norm(x, p["ln2_g"], p["ln2_b"], eps), p, gelu_form)


@mutant(replaces="transformer_block", killed_by="block.permutation_equivariant", bug="causal hard-coded to True: encoder mode masks too")
def always_causal_block(x, params, n_heads, causal=True, *, gelu_form="tanh", eps=EPS):
    p = params
    x = x + _attend(layer_norm(x, p["ln1_g"], p["ln1_b"], eps), p, n_heads, True)
    return x + _ffn(layer_norm(x, p["ln2_g"], p["ln2_b"], eps), p, gelu_form)


@mutant(replaces="transformer_block", killed_by="block.agrees_with_reference", bug="parallel sublayers: the FFN reads x, not x + attn (GPT-J)")
def parallel_block(x, params, n_heads, causal=True, *, gelu_form="tanh", eps=EPS):
    p = params
    attended = _attend(layer_norm(x, p["ln1_g"], p["ln1_b"], eps), p, n_heads, causal)
    return x + attended + _ffn(layer_norm(x, p["ln2_g"], p["ln2_b"], eps), p, gelu_form)


@mutant(
    replaces="attention",
    killed_by="block.causal_non_leakage",
    # "a mask buffer built for a block size of 64", "a buffer for a fixed block size": it is the attention's mask
    also_named_by=("attention.causal_non_leakage", "attention.causal_weights_pattern"),
    bug="the block's attention masks with a buffer built for a block size of 32 and sliced: nothing masked past 32 tokens",
)
def block_mask_buffer_for_32_tokens(x, W_q, W_k, W_v, W_o, n_heads, causal=True, **biases):
    q, k, v = _qkv(x, W_q, W_k, W_v, n_heads, biases)
    weights = _masked_softmax(_scores(q, k), causal, _buffered_future(x.shape[1], 32))  # BUG: see _buffered_future
    return _finish(weights, v, W_o, biases)


def _layer_norm_in_dtype(x, gain, bias, eps):
    """LayerNorm with its variance in x's own dtype: in float16, inf once a row spreads past 256."""
    centred = x - x.mean(axis=-1, keepdims=True)
    return centred / np.sqrt((centred * centred).mean(axis=-1, keepdims=True) + eps) * gain + bias  # BUG: no upcast to float32


@mutant(replaces="transformer_block", killed_by="block.agrees_with_reference", dtype="float16",
        bug="the block's LayerNorm takes its variance in float16: rows spread past 256 square to inf and normalise to the bias "
        "(microsoft/onnxruntime#17692: LayerNormalization in fp16 fails on data with large variance)")
def layer_norm_in_float16_block(x, params, n_heads, causal=True, *, gelu_form="tanh", eps=EPS):
    p = params
    x = x + _attend(_layer_norm_in_dtype(x, p["ln1_g"], p["ln1_b"], eps), p, n_heads, causal)
    return x + _ffn(_layer_norm_in_dtype(x, p["ln2_g"], p["ln2_b"], eps), p, gelu_form)
