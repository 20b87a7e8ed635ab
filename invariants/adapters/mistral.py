"""transformers' Mistral (MistralForCausalLM with its sliding window) behind the protocol's modern decoder.

    pytest --pyargs invariants --impl invariants.adapters.mistral --impl-dtype float32

The machinery and the shared conversions are in invariants/adapters/hf_decoder.py. Mistral's conventions,
stated: the window is config.sliding_window, and its definition is the protocol's (the library's
mask keeps kv_idx > q_idx - sliding_window: exactly min(p + 1, w) keys), so it is passed as it is;
its DynamicCache keeps the last w - 1 positions of a sliding layer, within the size law; RoPE is
rotate_half (ROPE_PAIRING = "half_split"); no attention biases (QKV_BIASES left False). Run in float32.

A library bug the suite finds (transformers 5.24): with sliding_window = 1 the sliding cache layer keeps every
position (DynamicSlidingWindowLayer slices [-sliding_window + 1:], which is [0:] for w = 1), so decoding
with a window of 1 attends to the whole cache and misses the full forward, and decoding.decode_matches_full_forward
fails (the full forward is right). The adapter decodes w = 1 on full cache layers (hf_decoder.decode_cache), so
that the rest of the library is checked at every window; tests/test_decoder_adapters.py keeps the bug on record.
"""

from __future__ import annotations

from transformers import MistralConfig
from transformers.models.mistral import modeling_mistral as mistral

from invariants.adapters.hf_decoder import Family, functions

BACKEND = "torch"
PROTOCOL_VERSION = 2
ROPE_PAIRING = "half_split"

FAMILY = Family("mistral", MistralConfig, mistral.MistralModel, mistral.MistralForCausalLM, mistral.MistralMLP,
                mistral.MistralRotaryEmbedding, mistral.apply_rotary_pos_emb, lambda window: {"sliding_window": window}, {})
globals().update(functions(FAMILY))  # rope, swiglu, llama_block, llama_logits, llama_decode
