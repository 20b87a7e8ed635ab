"""The RoPE scaling laws held to code nobody here wrote: transformers' rotary embeddings of Llama 3.1 (llama3, and linear and
dynamic NTK), Phi-3 (LongRoPE), DeepSeek-V3 (YaRN and its softmax scale) and GPT-NeoX (partial rotary).

Each adapter builds the model's own rotary module from a small config (the published settings, scaled down; no download) and
runs it forward at the suite's sequence length, so transformers' dynamic_rope_update (the growing and resetting cache, the
switch between LongRoPE's factor lists) is what the laws see. The adapters are namespaces of this file (an --impl target too:
`--impl tests/test_rope_scaling_transformers.py:TransformersRope`). The ci profile, float32: zero false alarms.
"""

import json

import pytest

pytest.importorskip("transformers", reason="the rotary embeddings are transformers' own")

import torch  # noqa: E402
from transformers.models.deepseek_v3.modeling_deepseek_v3 import DeepseekV3Attention, DeepseekV3Config, DeepseekV3RotaryEmbedding  # noqa: E402
from transformers.models.gpt_neox.modeling_gpt_neox import GPTNeoXConfig, GPTNeoXRotaryEmbedding, apply_rotary_pos_emb  # noqa: E402
from transformers.models.llama.modeling_llama import LlamaConfig, LlamaRotaryEmbedding  # noqa: E402
from transformers.models.phi3.modeling_phi3 import Phi3Config, Phi3RotaryEmbedding  # noqa: E402

from invariants import REGISTRY, Implementation, all_invariants, run_invariant  # noqa: E402
from invariants.profiles import profile_settings  # noqa: E402

all_invariants()
CI = profile_settings("ci")

# The published settings (config.json of each model); the tests draw these and smaller trained lengths.
LLAMA_3_1 = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}
DEEPSEEK_V3 = {"rope_type": "yarn", "factor": 40.0, "beta_fast": 32, "beta_slow": 1, "mscale": 1.0, "mscale_all_dim": 1.0,
               "original_max_position_embeddings": 4096}
PHI_3_MINI_128K = {"rope_type": "longrope", "original_max_position_embeddings": 4096, "max_position_embeddings": 131072}
GPT_NEOX_20B = {"rotary_pct": 0.25, "rotary_emb_base": 10000}


def _key(scaling):
    return json.dumps(scaling, sort_keys=True)


def _rotary(d_head, base, key):
    """The model's own rotary module for a rope_type: Llama's (default, linear, dynamic, llama3), Phi-3's, DeepSeek-V3's."""
    scaling = json.loads(key)
    kind = scaling["rope_type"]
    dropped = ("max_position_embeddings", "original_max_position_embeddings") if kind == "dynamic" else ("max_position_embeddings",)
    parameters = {k: v for k, v in scaling.items() if k not in dropped} | {"rope_theta": base}
    if kind == "longrope":
        config = Phi3Config(hidden_size=d_head, num_attention_heads=1, num_key_value_heads=1, rope_parameters=parameters,
                            max_position_embeddings=scaling["max_position_embeddings"],
                            original_max_position_embeddings=scaling["original_max_position_embeddings"])
        return Phi3RotaryEmbedding(config)
    if kind == "yarn":
        config = DeepseekV3Config(hidden_size=16, num_attention_heads=1, num_key_value_heads=1, qk_rope_head_dim=d_head, qk_nope_head_dim=d_head,
                                  v_head_dim=d_head, q_lora_rank=None, kv_lora_rank=8, rope_parameters=parameters,
                                  max_position_embeddings=scaling["original_max_position_embeddings"] * int(scaling["factor"]))
        return DeepseekV3RotaryEmbedding(config)
    # dynamic NTK grows past transformers' max_position_embeddings: the trained length
    length = scaling.get("original_max_position_embeddings", 4096)
    config = LlamaConfig(hidden_size=d_head, num_attention_heads=1, num_key_value_heads=1, head_dim=d_head, rope_parameters=parameters,
                         max_position_embeddings=length)
    return LlamaRotaryEmbedding(config)


class TransformersRope:
    """transformers' rotary modules behind rope_frequencies (run forward at seq_len: its inv_freq and attention_scaling after
    dynamic_rope_update), DeepseekV3Attention's `scaling` behind softmax_scale, GPT-NeoX's rotary and apply_rotary_pos_emb
    behind partial_rope. All compute in float32."""

    BACKEND, COMPUTE_DTYPE = "torch", "float32"
    rotary = staticmethod(_rotary)  # a fresh module per call: what ROPE_INIT_FUNCTIONS answers at seq_len

    @staticmethod
    def rope_frequencies(d_head, base, scaling, seq_len):
        rotary = TransformersRope.rotary(int(d_head), float(base), _key(scaling))
        with torch.no_grad():
            rotary(torch.zeros(1, 1, d_head), torch.tensor([[int(seq_len) - 1]]))
        return rotary.inv_freq.clone(), float(rotary.attention_scaling)

    @staticmethod
    def softmax_scale(d_head, scaling):
        if scaling["rope_type"] != "yarn":
            return d_head**-0.5  # transformers' attention modules: head_dim ** -0.5
        half = 2  # a qk_head_dim of d_head: a rope part of 2, the rest nope
        parameters = {k: v for k, v in scaling.items() if k != "max_position_embeddings"} | {"rope_theta": 10000.0}
        config = DeepseekV3Config(hidden_size=16, num_attention_heads=1, num_key_value_heads=1, qk_rope_head_dim=half,
                                  qk_nope_head_dim=d_head - half, v_head_dim=4, q_lora_rank=None, kv_lora_rank=8, rope_parameters=parameters,
                                  max_position_embeddings=scaling["original_max_position_embeddings"] * int(scaling["factor"]))
        return DeepseekV3Attention(config, layer_idx=0).scaling

    @staticmethod
    def partial_rope(x, positions, base, partial_rotary_factor):
        D = x.shape[-1]
        parameters = {"rope_type": "default", "rope_theta": float(base), "partial_rotary_factor": float(partial_rotary_factor)}
        config = GPTNeoXConfig(hidden_size=D, num_attention_heads=1, rope_parameters=parameters)
        with torch.no_grad():
            cos, sin = GPTNeoXRotaryEmbedding(config)(x, positions[None])  # (1, T, rotary)
            rotated, _ = apply_rotary_pos_emb(x, x, cos.to(x.dtype), sin.to(x.dtype))
        return rotated


LAWS = [name for name in REGISTRY if name.startswith("rope_scaling.")]


@pytest.mark.parametrize("name", LAWS)
def test_transformers_rotary_embeddings_pass_the_rope_scaling_laws_at_ci(name):
    impl = Implementation(TransformersRope, label="TransformersRope", backend="torch", dtype="float32")
    outcome = run_invariant(REGISTRY[name], impl, settings=CI)
    assert outcome.status == "passed", outcome.report or outcome.reason


def test_the_published_configs_give_the_published_frequencies():
    """Llama 3.1's, DeepSeek-V3's and Phi-3's published settings at head width 64 to 128: transformers equals the reference."""
    import numpy as np

    import invariants.reference.numpy as ref

    phi3 = PHI_3_MINI_128K | {"short_factor": [1.0 + i / 100 for i in range(48)], "long_factor": [1.0 + i for i in range(48)]}
    for d_head, base, scaling, seq_len in ((128, 500000.0, LLAMA_3_1, 8192), (64, 10000.0, DEEPSEEK_V3, 100), (96, 10000.0, phi3, 4096),
                                           (96, 10000.0, phi3, 4097)):
        inv_freq, factor = TransformersRope.rope_frequencies(d_head, base, scaling, seq_len)
        expected, expected_factor = ref.rope_frequencies(d_head, base, scaling, seq_len)
        np.testing.assert_allclose(inv_freq.numpy(), expected, rtol=2e-6)
        assert abs(factor - expected_factor) < 1e-6

