"""Valid inputs for each protocol function, drawn to honour what an implementation declares: the inputs part of its entry.

    args = VALID_INPUTS["layer_norm"](impl, case)   # (x, gain, bias, eps), in protocol order

Each drawer takes the Implementation (its declarations: LAYER_NORM_EPS, ATTENTION_BIASES, SLIDING_WINDOW, ...) and
the Case to draw from, and returns the arguments of one call. A component added since registers its own drawer from its
laws module (`@valid_inputs("qk_norm_attention")` in invariants/qk_norm.py). The laws written once over every entry
(invariants.dtypes) call them; tests/test_dtypes.py checks that every floating function of invariants.protocol.FUNCTIONS
has one. Sizes are small: these inputs are for laws that hold at any size.
"""

from __future__ import annotations

from invariants.block import block_params_for
from invariants.conventions import attention_biases, biases_as_declared, causal_modes, d_ff_for, declared, layer_norm_eps, rms_norm_eps
from invariants.decoding import schedules_for
from invariants.gqa import draw_gqa_inputs
from invariants.llama import draw_config
from invariants.moe import moe_params_for
from invariants.norms import gains_and_biases_for
from invariants.rope import draw_rope_inputs
from strategies.activation import activation_inputs
from strategies.attention import attention_args, attention_inputs
from strategies.core import attention_shapes, float_arrays, integers, sampled_from
from strategies.decoder import cross_args, cross_inputs, decoder_block_params, gqa_args, llama_block_params, llama_params, swiglu_inputs
from strategies.feed_forward import feed_forward_weights, hidden_states
from strategies.moe import moe_shapes, moe_tokens, router_logits
from strategies.norms import gains_and_biases, norm_rows
from strategies.params import gpt_configs, gpt_params, token_ids
from strategies.softmax import logits, targets


def softmax(impl, case):
    x = case.draw(logits(max_ndim=2, max_vocab=8), "x")
    return x, case.draw(integers(-x.ndim, x.ndim - 1), "axis")


def layer_norm(impl, case):
    x = case.draw(norm_rows(max_rows=3, max_d=8), "x")
    g, b = case.draw(gains_and_biases_for(impl, x.shape[-1]), "gain, bias")
    return x, g, b, layer_norm_eps(impl)  # a Python float, as the suite always passes eps


def rms_norm(impl, case):
    x = case.draw(norm_rows(max_rows=3, max_d=8), "x")
    g, _ = case.draw(gains_and_biases(x.shape[-1]), "gain, bias")
    return x, g, rms_norm_eps(impl)


def gelu(impl, case):
    return (case.draw(activation_inputs(max_ndim=2, max_side=4), "x"),)


def cross_entropy(impl, case):
    x = case.draw(logits(min_ndim=2, max_ndim=2, max_side=4, max_vocab=8), "logits")  # (N, V)
    return x, case.draw(targets(x), "targets")


def attention(impl, case):
    causal = case.draw(sampled_from(causal_modes(impl)), "causal")
    return attention_args(case.draw(attention_inputs(max_batch=2, max_seq=4, max_heads=2, max_d_head=3, causal=causal), "inputs"))


def feed_forward(impl, case):
    x = case.draw(hidden_states(max_batch=2, max_seq=3, max_d=6), "x")  # (B, T, d)
    d_ff = d_ff_for(impl, x.shape[-1])  # None unless FEED_FORWARD_RATIO is declared
    widths = dict(min_hidden=1, max_hidden=8) if d_ff is None else dict(min_hidden=d_ff, max_hidden=d_ff)
    p = case.draw(biases_as_declared(impl, feed_forward_weights(x.shape[-1], **widths)), "W1, b1, W2, b2")
    return x, p["W1"], p["b1"], p["W2"], p["b2"]


def transformer_block(impl, case):
    shape = case.draw(attention_shapes(max_batch=2, max_seq=4, max_heads=2, max_d_head=3), "shape")
    x = case.draw(float_arrays((shape.batch, shape.seq, shape.d_model)), "x")  # (B, T, d)
    params = case.draw(block_params_for(impl, shape.d_model), "params")
    return x, params, shape.n_heads, case.draw(sampled_from(causal_modes(impl)), "causal")


def gpt_logits(impl, case):
    sizes = dict(max_vocab=6, max_max_len=4, max_layers=1, max_heads=2, max_d_head=3)
    config = case.draw(gpt_configs(**sizes, attn_bias=attention_biases(impl)), "config")
    params = case.draw(biases_as_declared(impl, gpt_params(config)), "params")
    return case.draw(token_ids(config.vocab, max_batch=2, max_seq=config.max_len), "ids"), params, config.n_heads


def top_k_gates(impl, case):
    shape = case.draw(moe_shapes(max_tokens=4, max_experts=4), "shape")
    return case.draw(router_logits(shape.tokens, shape.experts), "router_logits"), shape.k  # (N, E)


def load_balancing_loss(impl, case):
    return top_k_gates(impl, case)  # the same router logits and k


def moe(impl, case):
    shape = case.draw(moe_shapes(max_tokens=4, max_experts=3, max_d=4), "shape")
    x = case.draw(moe_tokens(shape.tokens, shape.d_model), "x")  # (N, d)
    p = case.draw(moe_params_for(impl, shape.d_model, shape.experts, 4), "router, experts")
    return x, p["router"], p["experts"], shape.k


def rope(impl, case):
    inputs = draw_rope_inputs(impl, case, "inputs", max_seq=3)
    return inputs["x"], inputs["positions"], inputs["base"]


def gqa_attention(impl, case):
    return gqa_args(draw_gqa_inputs(impl, case))


def swiglu(impl, case):
    inputs = case.draw(swiglu_inputs(max_rows=2), "inputs")
    return tuple(inputs[n] for n in ("x", "W_gate", "W_up", "W_down"))


def _llama_config(impl, case):
    """A one-layer LlamaConfig impl can take (invariants.llama.draw_config), whose window, where CHUNKS_WITHIN_WINDOW is declared,
    takes the 3 tokens drawn here in one forward."""
    return draw_config(impl, case, max_layers=1, **({"min_window": 3} if declared(impl, "CHUNKS_WITHIN_WINDOW") else {}))


def llama_block(impl, case):
    config = _llama_config(impl, case)
    x = case.draw(float_arrays((1, 3, config.d_model)), "x")
    params = case.draw(llama_block_params(config), "params")
    return x, params, config.n_heads, config.n_kv_heads, config.rope_base, config.window


def llama_logits(impl, case):
    config = _llama_config(impl, case)
    params = case.draw(llama_params(config), "params")
    ids = case.draw(token_ids(config.vocab, max_batch=1, max_seq=3), "ids")
    return ids, params, config.n_heads, config.n_kv_heads, config.rope_base, config.window


def llama_decode(impl, case):
    config = _llama_config(impl, case)
    params = case.draw(llama_params(config), "params")
    ids = case.draw(token_ids(config.vocab, max_batch=1, min_seq=2, max_seq=3), "ids")
    chunks = case.draw(schedules_for(impl, ids.shape[1], config.window), "chunks")  # the chunks it declares it takes
    return ids, params, config.n_heads, config.n_kv_heads, config.rope_base, config.window, chunks


def cross_attention(impl, case):
    return cross_args(case.draw(cross_inputs(max_seq=2, max_memory=2), "inputs"))


def decoder_block(impl, case):
    inputs = case.draw(cross_inputs(max_seq=2, max_memory=2), "inputs")
    d = inputs["x"].shape[-1]
    params = case.draw(biases_as_declared(impl, decoder_block_params(d, d_ff=d_ff_for(impl, d))), "params")
    return inputs["x"], inputs["memory"], params, inputs["n_heads"]


# protocol function -> drawer(impl, case) of its arguments; every function with a floating answer has one. Those above are
# the components' before this table's register; a new component registers its own from its laws module (valid_inputs),
# so the table is complete once registry.all_invariants() has imported every component.
VALID_INPUTS = {
    drawer.__name__: drawer
    for drawer in (softmax, layer_norm, rms_norm, gelu, cross_entropy, attention, feed_forward, transformer_block, gpt_logits, top_k_gates,
                   moe, load_balancing_loss, rope, gqa_attention, swiglu, llama_block, llama_logits, llama_decode, cross_attention,
                   decoder_block)
}


def valid_inputs(function):
    """Register the decorated drawer(impl, case) as the valid inputs of the protocol function named `function`."""

    def register(drawer):
        if function in VALID_INPUTS:
            raise ValueError(f"the valid inputs of {function} are registered twice")
        VALID_INPUTS[function] = drawer
        return drawer

    return register
