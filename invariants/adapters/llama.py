"""transformers' Llama (LlamaForCausalLM, LlamaDecoderLayer, LlamaMLP, its rotary embedding) behind the protocol's modern decoder.

    pytest --pyargs invariants --impl invariants.adapters.llama --impl-dtype float32

The machinery and the conversions every family shares are in invariants/adapters/hf_decoder.py. Llama's own
conventions, stated: RoPE pairs (i, i + D/2) (rotate_half; HF permutes Meta's interleaved
checkpoints at conversion), hence ROPE_PAIRING = "half_split"; attention_bias=True gives q, k, v
and o biases, so QKV_BIASES = True and the o_proj bias is fed zeros (the protocol has none); Llama
has no sliding window, hence SLIDING_WINDOW = False. Run in float32: Llama computes RMSNorm and the
RoPE angles in float32 whatever the input dtype (see invariants/adapters/hf_decoder.py).
"""

from __future__ import annotations

from transformers import LlamaConfig
from transformers.models.llama import modeling_llama as llama

from invariants.adapters.hf_decoder import Family, functions


def _no_window(window):
    if window is not None:
        raise ValueError(f"transformers' Llama has no sliding window (window={window}); this adapter declares SLIDING_WINDOW = False")
    return {}


BACKEND = "torch"
PROTOCOL_VERSION = 2
ROPE_PAIRING = "half_split"
QKV_BIASES = True
SLIDING_WINDOW = False

FAMILY = Family("llama", LlamaConfig, llama.LlamaModel, llama.LlamaForCausalLM, llama.LlamaMLP, llama.LlamaRotaryEmbedding,
                llama.apply_rotary_pos_emb, _no_window, {"attention_bias": True}, has_o_bias_with_qkv=True)
globals().update(functions(FAMILY))  # rope, swiglu, llama_block, llama_logits, llama_decode
