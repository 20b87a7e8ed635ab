"""Hypothesis strategies for transformer components: shapes, weights, well-posed inputs, dtypes.

Importable by anyone testing their own implementation; every strategy validates its
arguments (InvalidArgument names the argument, its value and the fix) and says in its
docstring where it keeps a property well-posed. Values shrink towards simple numbers (0, 1, -1,
1/2, ...: see strategies/core.py), so a shrunk counterexample reads like x = [[1.], [0.]].
One module per component:

    core          grid_values, byte_arrays, float_arrays, weights, attention_shapes (long sequences), swept_lengths, dtypes, devices
    softmax       logits (row patterns: uniform, tied max, dominant, masked), large_logits, shifts, targets
    norms         norm_rows (row spread bounded away from 0), scale_factors, gains_and_biases, loud_rows (float16 overflow)
    activation    activation_inputs, paddings
    attention     attention_inputs (long sequences, scores up to 1e4, degenerate rows)
    feed_forward  hidden_states, feed_forward_weights
    params        block_params, gpt_configs, gpt_params, token_ids (+ init_* builders from a seed)
    moe           moe_shapes, router_logits (ties, all-zero rows), masked_router_logits (-inf experts), uniform_mean_router_logits,
                  moe_tokens, moe_params
    routing       grouped_routing_shapes, routing_biases, grouped_routing_inputs (DeepSeek-V3), softmax_routing_inputs (Qwen3-MoE),
                  bias_update_inputs (the auxiliary-loss-free update)
    scores        head_counts, alibi_slope_arrays, alibi_inputs (ALiBi), capped_logits, softcapped_inputs (softcapping),
                  sink_logits, sink_inputs (attention sinks)
    streaming     streaming_inputs (StreamingLLM: sinks kept in a rolling cache, streams past its end)
    gemma         gemma_norm_weights, gemma_norm_inputs (Gemma's (1 + w) RMSNorm), embedding_widths, scaled_embedding_inputs
    mla           mla_inputs, mla_decode_inputs (DeepSeek-V2/V3's latent attention: compressed or plain queries, YaRN's mscale), yarn_mscale
    rope_scaling  rope_scalings (every rope_type), rope_frequency_inputs (lengths around L_0), partial_rope_inputs
    text          corpora, token_streams, window_lengths
    decoder       the modern decoder (protocol version 2): rope_inputs, gqa_shapes, gqa_inputs (key masks, windows, a
                  cache's offset), swiglu_inputs, llama_configs, llama_block_params, llama_params, decode_schedules (chunk
                  splits, a window's edge), cross_inputs, decoder_block_params, qk_norm_inputs (+ init_* builders)

Each *_inputs strategy draws a dict in the order its protocol function takes it; attention_args, gqa_args,
cross_args and qk_norm_args turn one into the call's positional arguments.
"""

from invariants.strategies._validation import InvalidArgument
from invariants.strategies.activation import activation_inputs, paddings
from invariants.strategies.attention import attention_args, attention_inputs
from invariants.strategies.core import (
    EITHER_SIDE,
    GRID,
    LONG_LENGTHS,
    TILE_LENGTHS,
    AttentionShape,
    attention_shapes,
    byte_arrays,
    devices,
    dtypes,
    float_arrays,
    grid_values,
    seeds,
    swept_lengths,
    weights,
)
from invariants.strategies.decoder import (
    GQAShape,
    LlamaConfig,
    cross_args,
    cross_inputs,
    decode_schedules,
    decoder_block_params,
    gqa_args,
    gqa_inputs,
    gqa_shapes,
    init_decoder_block_params,
    init_llama_block_params,
    init_llama_params,
    llama_block_params,
    llama_configs,
    llama_params,
    position_runs,
    qk_norm_args,
    qk_norm_inputs,
    rope_inputs,
    swiglu_inputs,
)
from invariants.strategies.feed_forward import feed_forward_weights, hidden_states
from invariants.strategies.gemma import GEMMA_WIDTHS, embedding_widths, gemma_norm_inputs, gemma_norm_weights, scaled_embedding_inputs
from invariants.strategies.layer_types import HybridConfig, gemma_layer_types, hybrid_configs, qwen2_layer_types
from invariants.strategies.mla import MSCALES, mla_decode_inputs, mla_inputs, yarn_mscale
from invariants.strategies.moe import MoEShape, masked_router_logits, moe_params, moe_shapes, moe_tokens, router_logits, uniform_mean_router_logits
from invariants.strategies.norms import gains_and_biases, loud_rows, norm_rows, scale_factors
from invariants.strategies.params import GPTConfig, block_params, gpt_configs, gpt_params, init_block_params, init_gpt_params, token_ids
from invariants.strategies.rope_scaling import partial_rope_inputs, rope_frequency_inputs, rope_scalings
from invariants.strategies.routing import (
    GroupedRoutingShape,
    bias_update_inputs,
    grouped_routing_inputs,
    grouped_routing_shapes,
    routing_biases,
    softmax_routing_inputs,
)
from invariants.strategies.scores import alibi_inputs, alibi_slope_arrays, capped_logits, head_counts, sink_inputs, sink_logits, softcapped_inputs
from invariants.strategies.softmax import large_logits, logits, shifts, targets
from invariants.strategies.streaming import streaming_inputs
from invariants.strategies.text import corpora, token_streams, window_lengths

__all__ = [
    "EITHER_SIDE", "GRID", "LONG_LENGTHS", "TILE_LENGTHS", "AttentionShape", "GPTConfig", "InvalidArgument", "MoEShape",
    "activation_inputs", "attention_inputs", "attention_shapes", "block_params", "byte_arrays", "corpora", "devices", "dtypes",
    "feed_forward_weights", "float_arrays", "gains_and_biases", "gpt_configs", "gpt_params", "grid_values", "hidden_states",
    "init_block_params", "init_gpt_params", "large_logits", "logits", "moe_params", "moe_shapes", "moe_tokens",
    "norm_rows", "paddings", "router_logits", "scale_factors", "seeds", "shifts", "swept_lengths", "targets", "token_ids",
    "token_streams", "uniform_mean_router_logits", "weights", "window_lengths",
    # the modern decoder (protocol version 2)
    "GQAShape", "LlamaConfig", "attention_args", "cross_args", "cross_inputs", "decode_schedules", "decoder_block_params", "gqa_args",
    "gqa_inputs", "gqa_shapes", "init_decoder_block_params", "init_llama_block_params", "init_llama_params", "llama_block_params",
    "llama_configs", "llama_params", "position_runs", "qk_norm_args", "qk_norm_inputs", "rope_inputs", "swiglu_inputs",
    "loud_rows", "masked_router_logits",
    # Gemma's details (the (1 + w) norm, the scaled embedding)
    "GEMMA_WIDTHS", "embedding_widths", "gemma_norm_inputs", "gemma_norm_weights", "scaled_embedding_inputs",
    # MoE routing as shipped (DeepSeek-V3, Qwen3-MoE)
    "GroupedRoutingShape", "bias_update_inputs", "grouped_routing_inputs", "grouped_routing_shapes", "routing_biases", "softmax_routing_inputs",
    # RoPE scaling and partial rotary
    "partial_rope_inputs", "rope_frequency_inputs", "rope_scalings",
    # multi-head latent attention (DeepSeek-V2/V3, Kimi K2)
    "MSCALES", "mla_decode_inputs", "mla_inputs", "yarn_mscale",
    # attention scores as shipped (ALiBi, softcapping, attention sinks)
    "alibi_inputs", "alibi_slope_arrays", "capped_logits", "head_counts", "sink_inputs", "sink_logits", "softcapped_inputs",
    # per-layer attention types (Gemma 2 and 3, gpt-oss, Qwen2)
    "HybridConfig", "gemma_layer_types", "hybrid_configs", "qwen2_layer_types",
    # StreamingLLM's attention sinks (a rolling cache of sinks and a window)
    "streaming_inputs",
]
