"""Invariants of dtypes: every floating answer comes back in the dtype its floating inputs went in.

One invariant per protocol function with floating answers, so that a partial implementation
skips exactly what it lacks and a failure names the function. Integer and count answers
(tokens_per_expert, gpt_param_count, moe_n_params, encode, get_batch, ...) are not floating
and are left to their own invariants; the scalar answers (cross_entropy, load_balancing_loss)
are 0-d arrays and keep the dtype like any other.

Why it needs checking: under numpy 2's promotion rules (NEP 50) a numpy float64 scalar or
0-d array is as strong as a float64 array, so `x32 / np.sqrt(d)` or `x32 + np.float64(eps)` is
float64, while a Python float (`math.sqrt(d)`, `1e-5`) adopts x's dtype. A float32 run of such
code agrees with the reference better than it should and passes every value check; only its
dtype tells. In torch the usual slip goes the other way: a buffer made with torch's default
dtype (`torch.zeros(N, d)`) is float32 whatever x is, so a float64 or bfloat16 run answers
float32.

The expected dtype is `answer_dtype(impl)`: the run's dtype, except that a bfloat16 answer
arrives as float32 (numpy has no bfloat16; the suite and the gate's worker widen it exactly).
In a bfloat16 run a float32 answer must therefore also hold bfloat16 numbers only: a value off
the bfloat16 grid was computed, or kept, in float32.
"""

from __future__ import annotations

import numpy as np

from invariants.asserts import assert_dtype, assert_value, assert_where
from invariants.block import block_params_for
from invariants.conventions import (
    attention_biases,
    biases_as_declared,
    causal_modes,
    d_ff_for,
    declared,
    layer_norm_eps,
    returns_weights,
    rms_norm_eps,
)
from invariants.decoding import schedules_for
from invariants.gqa import draw_gqa_inputs
from invariants.llama import draw_config
from invariants.moe import moe_params_for
from invariants.norms import gains_and_biases_for
from invariants.protocol import FUNCTIONS
from invariants.registry import invariant
from invariants.rope import draw_rope_inputs
from strategies.activation import activation_inputs
from strategies.attention import attention_args, attention_inputs
from strategies.core import attention_shapes, float_arrays, integers, sampled_from
from strategies.decoder import (
    cross_args,
    cross_inputs,
    decoder_block_params,
    gqa_args,
    llama_block_params,
    llama_params,
    swiglu_inputs,
)
from strategies.feed_forward import feed_forward_weights, hidden_states
from strategies.moe import moe_shapes, moe_tokens, router_logits
from strategies.norms import gains_and_biases, norm_rows
from strategies.params import gpt_configs, gpt_params, token_ids
from strategies.softmax import logits, targets

# Protocol functions whose answers are not floating arrays, with what they return: no dtype to keep.
NOT_FLOATING = {
    "gpt_param_count": "an int",
    "tokens_per_expert": "(E,) integer counts",
    "moe_n_params": "an int",
    "moe_active_params": "an int",
    "inference_flops_per_token": "a number from an int, no array in",
    "training_flops": "a number from ints, no array in",
    "build_vocab": "a str",
    "encode": "(n,) integer ids",
    "decode": "a str",
    "get_batch": "(x, y) integer ids",
}

COMMON_CAUSES = (
    "a numpy float64 scalar or 0-d array in the arithmetic (np.float64(eps), np.sqrt(d), np.sqrt(2 / np.pi), np.array(eps): "
    "numpy 2 promotes float32 to float64 through them, where a Python float from math.sqrt or d ** -0.5 would not), "
    "a float64 constant array (np.ones(n), np.zeros(shape), np.array([...]) without dtype=x.dtype), "
    "torch.tensor(python_float) or torch.zeros(...) in torch's default dtype (float32) instead of x.dtype, "
    ".double() or .float() on the way, or .item() / float(...) (a Python float comes back as float64)"
)


def _hint(specific):
    return f"{specific}; in general the dtype leaks through {COMMON_CAUSES}"


def answer_dtype(impl):
    """The numpy dtype in which every floating answer of `impl` must arrive: its run dtype, bfloat16 carried as float32.

    The suite hands every floating input over in impl.dtype and brings every answer back as
    numpy (invariants.boundary; the gate's worker does the same). numpy has no bfloat16, so a
    bfloat16 tensor comes back widened to float32, exactly; every other dtype (float64, float32,
    float16, in either backend) comes back as itself, and a Python float as float64. This is the
    one place that decides the expected dtype.
    """
    return np.dtype(np.float32) if impl.dtype == "bfloat16" else np.dtype(impl.dtype)


def _why(impl):
    if impl.dtype == "bfloat16":
        return "the input dtype bfloat16, which numpy carries as float32"
    return "the input dtype"


def _describe(impl, value):
    """What the implementation received for `value`: floating arrays in impl.dtype, integers as int64."""
    if isinstance(value, np.ndarray):
        kind = "int64" if value.dtype.kind in "iu" else "bool" if value.dtype == bool else impl.dtype
        return f"{kind} {tuple(value.shape)}"
    if isinstance(value, dict):  # params: the names, and the dtype the arrays went in
        return "{" + ", ".join(value) + f"}} in {impl.dtype}"
    if isinstance(value, (list, tuple)):
        return f"[{len(value)} × {_describe(impl, value[0])}]" if value else "[]"
    return repr(value)


def _call(impl, name, args):
    """The call as the implementation received it: layer_norm(x=float32 (3, 5), gain=float32 (5,), ..., eps=1e-05)."""
    params = FUNCTIONS[name].params
    return f"{name}({', '.join(f'{p}={_describe(impl, a)}' for p, a in zip(params, args, strict=True))})"


def _on_bfloat16_grid(answer):
    """(...) True where a float32 value is a bfloat16 number: its low 16 mantissa bits are 0 (bfloat16 is float32's top half)."""
    bits = np.array(answer, dtype=np.float32, order="C").view(np.uint32)  # a copy keeps 0-d answers 0-d
    return (bits & np.uint32(0xFFFF)) == 0


def assert_keeps_dtype(impl, name, args, *, parts=None):
    """Call impl.<name>(*args) and check that each floating answer (each of `parts`, for a tuple) has answer_dtype(impl)."""
    __tracebackhide__ = True
    call = _call(impl, name, args)
    what = FUNCTIONS[name].signature
    answer = getattr(impl, name)(*args)
    if parts is None:
        answers = {what: answer}
    else:
        n = len(answer) if isinstance(answer, tuple) else 1
        assert_value(n, len(parts), f"number of arrays {name} returned ({', '.join(parts)})", call)
        answers = {f"{what}[{i}] ({part})": a for i, (part, a) in enumerate(zip(parts, answer, strict=True))}
    expected = answer_dtype(impl)
    for label, value in answers.items():
        value = assert_dtype(value, expected, label, call, why=_why(impl))
        if impl.dtype == "bfloat16":
            assert_where(_on_bfloat16_grid(value), value, label, "a bfloat16 number (the answer was computed or kept in float32, "
                         "wider than the input dtype bfloat16)", call)


@invariant(
    requires=("softmax",),
    hint=_hint("softmax's answer is not in x's dtype: the sum or the max is taken in float64 (dtype=np.float64), "
               "or the exponentials are written into a new buffer in the default dtype"),
)
def softmax_keeps_dtype(impl, case):
    """softmax(x, axis) has x's dtype."""
    x = case.draw(logits(max_ndim=2, max_vocab=8), "x")
    axis = case.draw(integers(-x.ndim, x.ndim - 1), "axis")
    assert_keeps_dtype(impl, "softmax", (x, axis))


@invariant(
    requires=("layer_norm",),
    hint=_hint("eps or the width d enters layer_norm as a numpy float64 scalar (eps = np.float64(eps), "
               "x.sum(-1) / np.float64(d), var + np.array(eps))"),
)
def layer_norm_keeps_dtype(impl, case):
    """layer_norm(x, gain, bias, eps) has x's dtype, eps being a Python float."""
    x = case.draw(norm_rows(max_rows=3, max_d=8), "x")
    g, b = case.draw(gains_and_biases_for(impl, x.shape[-1]), "gain, bias")
    assert_keeps_dtype(impl, "layer_norm", (x, g, b, layer_norm_eps(impl)))  # a Python float, as the suite always passes eps


@invariant(
    requires=("rms_norm",),
    hint=_hint("eps or 1/√d enters rms_norm as a numpy float64 scalar (np.float64(eps), x / np.sqrt(d), np.mean(x**2, dtype=np.float64))"),
)
def rms_norm_keeps_dtype(impl, case):
    """rms_norm(x, gain, eps) has x's dtype, eps being a Python float."""
    x = case.draw(norm_rows(max_rows=3, max_d=8), "x")
    g, _ = case.draw(gains_and_biases(x.shape[-1]), "gain, bias")
    assert_keeps_dtype(impl, "rms_norm", (x, g, rms_norm_eps(impl)))


@invariant(
    requires=("gelu",),
    hint=_hint("GELU's constant √(2/π) is np.sqrt(2 / np.pi), a numpy float64 scalar (math.sqrt(2 / math.pi) is a Python float), "
               "or the erf form goes through math.erf / scipy in float64"),
)
def gelu_keeps_dtype(impl, case):
    """gelu(x) has x's dtype."""
    x = case.draw(activation_inputs(max_ndim=2, max_side=4), "x")
    assert_keeps_dtype(impl, "gelu", (x,))


@invariant(
    requires=("cross_entropy",),
    hint=_hint("the loss comes back as a Python float (loss.item(), float(loss)), or it is averaged in float64 "
               "(np.mean(..., dtype=np.float64), a sum divided by np.float64(N))"),
)
def cross_entropy_keeps_dtype(impl, case):
    """cross_entropy(logits, targets), a scalar, has the logits' dtype (the targets are int64)."""
    x = case.draw(logits(min_ndim=2, max_ndim=2, max_side=4, max_vocab=8), "logits")  # (N, V)
    t = case.draw(targets(x), "targets")
    assert_keeps_dtype(impl, "cross_entropy", (x, t))


@invariant(
    requires=("attention",),
    hint=_hint("the scores are scaled by 1 / np.sqrt(D), a numpy float64 scalar (math.sqrt(D) or D ** -0.5 keep the dtype), "
               "or the causal mask is a float array of 0 and -inf made in float64 or torch's default dtype and added to the scores"),
)
def attention_keeps_dtype(impl, case):
    """attention's out and weights both have x's dtype, causal or not."""
    causal = case.draw(sampled_from(causal_modes(impl)), "causal")
    inputs = case.draw(attention_inputs(max_batch=2, max_seq=4, max_heads=2, max_d_head=3, causal=causal), "inputs")
    parts = ("out", "weights") if returns_weights(impl) else None  # ATTENTION_WEIGHTS = False: out alone
    assert_keeps_dtype(impl, "attention", attention_args(inputs), parts=parts)


@invariant(
    requires=("feed_forward",),
    hint=_hint("GELU's √(2/π) is np.sqrt(2 / np.pi) (a numpy float64 scalar), or the hidden layer is written into a buffer "
               "in the default dtype"),
)
def feed_forward_keeps_dtype(impl, case):
    """feed_forward(x, W1, b1, W2, b2) has x's dtype."""
    x = case.draw(hidden_states(max_batch=2, max_seq=3, max_d=6), "x")  # (B, T, d)
    d_ff = d_ff_for(impl, x.shape[-1])  # None unless FEED_FORWARD_RATIO is declared
    widths = dict(min_hidden=1, max_hidden=8) if d_ff is None else dict(min_hidden=d_ff, max_hidden=d_ff)
    p = case.draw(biases_as_declared(impl, feed_forward_weights(x.shape[-1], **widths)), "W1, b1, W2, b2")
    assert_keeps_dtype(impl, "feed_forward", (x, p["W1"], p["b1"], p["W2"], p["b2"]))


@invariant(
    requires=("transformer_block",),
    hint=_hint("a part of the block promotes (layer_norm's eps, attention's 1 / np.sqrt(D), GELU's np.sqrt(2 / np.pi)), "
               "or the residual stream is accumulated in a new buffer of the default dtype"),
)
def transformer_block_keeps_dtype(impl, case):
    """transformer_block(x, params, n_heads, causal) has x's dtype."""
    shape = case.draw(attention_shapes(max_batch=2, max_seq=4, max_heads=2, max_d_head=3), "shape")
    x = case.draw(float_arrays((shape.batch, shape.seq, shape.d_model)), "x")  # (B, T, d)
    params = case.draw(block_params_for(impl, shape.d_model), "params")
    causal = case.draw(sampled_from(causal_modes(impl)), "causal")
    assert_keeps_dtype(impl, "transformer_block", (x, params, shape.n_heads, causal))


@invariant(
    requires=("gpt_logits",),
    hint=_hint("the embeddings are gathered into a new buffer of the default dtype (np.zeros((B, T, d)), torch.zeros(B, T, d)), "
               "or a part promotes (layer_norm's eps, attention's 1 / np.sqrt(D), GELU's np.sqrt(2 / np.pi))"),
)
def gpt_logits_keeps_dtype(impl, case):
    """gpt_logits(ids, params, n_heads) has the dtype of the params (the ids are int64)."""
    sizes = dict(max_vocab=6, max_max_len=4, max_layers=1, max_heads=2, max_d_head=3)
    config = case.draw(gpt_configs(**sizes, attn_bias=attention_biases(impl)), "config")
    params = case.draw(biases_as_declared(impl, gpt_params(config)), "params")
    ids = case.draw(token_ids(config.vocab, max_batch=2, max_seq=config.max_len), "ids")
    assert_keeps_dtype(impl, "gpt_logits", (ids, params, config.n_heads))


@invariant(
    requires=("top_k_gates",),
    hint=_hint("the gates are scattered into np.zeros(shape) / torch.zeros(N, E) in the default dtype instead of "
               "zeros_like(router_logits), or the kept scores' softmax is taken in float64"),
)
def top_k_gates_keeps_dtype(impl, case):
    """top_k_gates(router_logits, k) has the router logits' dtype."""
    shape = case.draw(moe_shapes(max_tokens=4, max_experts=4), "shape")
    scores = case.draw(router_logits(shape.tokens, shape.experts), "router_logits")  # (N, E)
    assert_keeps_dtype(impl, "top_k_gates", (scores, shape.k))


@invariant(
    requires=("moe",),
    hint=_hint("the output buffer is np.zeros((N, d)) / torch.zeros(N, d) in the default dtype instead of zeros_like(x), "
               "or the gates or the router scores are taken in float64"),
)
def moe_keeps_dtype(impl, case):
    """moe(x, router, experts, k) has x's dtype, whichever experts the tokens are routed to."""
    shape = case.draw(moe_shapes(max_tokens=4, max_experts=3, max_d=4), "shape")
    x = case.draw(moe_tokens(shape.tokens, shape.d_model), "x")  # (N, d)
    p = case.draw(moe_params_for(impl, shape.d_model, shape.experts, 4), "router, experts")
    assert_keeps_dtype(impl, "moe", (x, p["router"], p["experts"], shape.k))


@invariant(
    requires=("load_balancing_loss",),
    hint=_hint("the routing shares f are float64 (np.bincount(...) / (N * k) is float64 whatever the logits: cast it to "
               "router_logits.dtype), or the loss comes back as a Python float (.item())"),
)
def load_balancing_loss_keeps_dtype(impl, case):
    """load_balancing_loss(router_logits, k), a scalar, has the router logits' dtype."""
    shape = case.draw(moe_shapes(max_tokens=4, max_experts=4), "shape")
    scores = case.draw(router_logits(shape.tokens, shape.experts), "router_logits")  # (N, E)
    assert_keeps_dtype(impl, "load_balancing_loss", (scores, shape.k))


# --- the modern decoder (protocol v2): one dtype invariant per floating function -------------------------------------


def _llama_config(impl, case):
    """A one-layer LlamaConfig impl can take (invariants.llama.draw_config), whose window, where CHUNKS_WITHIN_WINDOW is declared,
    takes the 3 tokens drawn here in one forward."""
    return draw_config(impl, case, max_layers=1, **({"min_window": 3} if declared(impl, "CHUNKS_WITHIN_WINDOW") else {}))


@invariant(requires=("rope",), hint=_hint("rope's answer is not in x's dtype: cos and sin left in float32 or float64 (round them to x's dtype)"))
def rope_keeps_dtype(impl, case):
    """rope(x, positions, base) has x's dtype."""
    inputs = draw_rope_inputs(impl, case, "inputs", max_seq=3)
    assert_keeps_dtype(impl, "rope", (inputs["x"], inputs["positions"], inputs["base"]))


@invariant(requires=("gqa_attention",), hint=_hint("gqa_attention's out or weights are not in q's dtype: a mask or a softmax in float32 kept"))
def gqa_attention_keeps_dtype(impl, case):
    """gqa_attention(q, k, v, causal, key_mask, window) returns out and weights in q's dtype."""
    inputs = draw_gqa_inputs(impl, case)
    parts = ("out", "weights") if returns_weights(impl) else None
    assert_keeps_dtype(impl, "gqa_attention", gqa_args(inputs), parts=parts)


@invariant(requires=("swiglu",), hint=_hint("swiglu's answer is not in x's dtype: SiLU computed in float32 or float64 and kept"))
def swiglu_keeps_dtype(impl, case):
    """swiglu(x, W_gate, W_up, W_down) has x's dtype."""
    inputs = case.draw(swiglu_inputs(max_rows=2), "inputs")
    assert_keeps_dtype(impl, "swiglu", tuple(inputs[n] for n in ("x", "W_gate", "W_up", "W_down")))


@invariant(requires=("llama_block",), hint=_hint("llama_block's answer is not in x's dtype: an RMSNorm upcast to float32 not cast back"))
def llama_block_keeps_dtype(impl, case):
    """llama_block(x, params, n_heads, n_kv_heads, rope_base, window) has x's dtype."""
    config = _llama_config(impl, case)
    x = case.draw(float_arrays((1, 3, config.d_model)), "x")
    params = case.draw(llama_block_params(config), "params")
    assert_keeps_dtype(impl, "llama_block", (x, params, config.n_heads, config.n_kv_heads, config.rope_base, config.window))


@invariant(requires=("llama_logits",), hint=_hint("llama_logits' answer is not in the params' dtype: the final norm or the head upcast"))
def llama_logits_keeps_dtype(impl, case):
    """llama_logits(ids, params, ...) has the params' dtype."""
    config = _llama_config(impl, case)
    params = case.draw(llama_params(config), "params")
    ids = case.draw(token_ids(config.vocab, max_batch=1, max_seq=3), "ids")
    assert_keeps_dtype(impl, "llama_logits", (ids, params, config.n_heads, config.n_kv_heads, config.rope_base, config.window))


@invariant(requires=("llama_decode",), hint=_hint("llama_decode's logits are not in the params' dtype: the cache or the head upcast"))
def llama_decode_keeps_dtype(impl, case):
    """llama_decode(ids, params, ..., chunks) returns logits in the params' dtype."""
    config = _llama_config(impl, case)
    params = case.draw(llama_params(config), "params")
    ids = case.draw(token_ids(config.vocab, max_batch=1, min_seq=2, max_seq=3), "ids")
    chunks = case.draw(schedules_for(impl, ids.shape[1], config.window), "chunks")  # the chunks it declares it takes
    args = (ids, params, config.n_heads, config.n_kv_heads, config.rope_base, config.window, chunks)
    call = _call(impl, "llama_decode", args)
    answer = impl.llama_decode(*args)
    assert_value(len(answer) if isinstance(answer, tuple) else 1, 2, "number of arrays llama_decode returned (logits, cache_sizes)", call)
    logits = assert_dtype(answer[0], answer_dtype(impl), f"{FUNCTIONS['llama_decode'].signature}[0] (logits)", call, why=_why(impl))
    if impl.dtype == "bfloat16":
        assert_where(_on_bfloat16_grid(logits), logits, "logits", "a bfloat16 number (computed or kept in float32)", call)


@invariant(requires=("cross_attention",), hint=_hint("cross_attention's out or weights are not in x's dtype"))
def cross_attention_keeps_dtype(impl, case):
    """cross_attention(x, memory, W_q, W_k, W_v, W_o, n_heads) returns out and weights in x's dtype."""
    inputs = case.draw(cross_inputs(max_seq=2, max_memory=2), "inputs")
    assert_keeps_dtype(impl, "cross_attention", cross_args(inputs), parts=("out", "weights") if returns_weights(impl) else None)


@invariant(requires=("decoder_block",), hint=_hint("decoder_block's answer is not in x's dtype"))
def decoder_block_keeps_dtype(impl, case):
    """decoder_block(x, memory, params, n_heads) has x's dtype."""
    inputs = case.draw(cross_inputs(max_seq=2, max_memory=2), "inputs")
    params = case.draw(biases_as_declared(impl, decoder_block_params(inputs["x"].shape[-1], d_ff=d_ff_for(impl, inputs["x"].shape[-1]))), "params")
    assert_keeps_dtype(impl, "decoder_block", (inputs["x"], inputs["memory"], params, inputs["n_heads"]))
