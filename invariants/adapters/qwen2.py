"""transformers' Qwen2 (Qwen2ForCausalLM: grouped-query attention with q, k, v biases) behind the protocol's modern decoder.

    pytest --pyargs invariants --impl invariants.adapters.qwen2 --impl-dtype float32

The machinery and the shared conversions are in invariants/adapters/hf_decoder.py. Qwen2's conventions,
stated: q_proj, k_proj and v_proj always have biases (QKV_BIASES = True; params drawn without them
are fed zeros), o_proj has none; the head width is hidden_size / num_attention_heads (Qwen2's config
has no head_dim), as the suite draws it; the sliding window is use_sliding_window=True with
max_window_layers=0 (every layer sliding), its definition the protocol's; RoPE is rotate_half
(ROPE_PAIRING = "half_split"). Run in float32.

At w = 1 the library's sliding cache layer keeps every position and decodes wrong (transformers 5.24; see
invariants/adapters/mistral.py): the adapter decodes w = 1 on full cache layers (hf_decoder.decode_cache).
"""

from __future__ import annotations

from transformers import Qwen2Config
from transformers.models.qwen2 import modeling_qwen2 as qwen2

from invariants.adapters.hf_decoder import Family, functions

BACKEND = "torch"
PROTOCOL_VERSION = 2
ROPE_PAIRING = "half_split"
QKV_BIASES = True


def _window(window):
    return {"use_sliding_window": False} if window is None else {"use_sliding_window": True, "sliding_window": window, "max_window_layers": 0}


FAMILY = Family("qwen2", Qwen2Config, qwen2.Qwen2Model, qwen2.Qwen2ForCausalLM, qwen2.Qwen2MLP, qwen2.Qwen2RotaryEmbedding,
                qwen2.apply_rotary_pos_emb, _window, None)
globals().update(functions(FAMILY))  # rope, swiglu, llama_block, llama_logits, llama_decode
