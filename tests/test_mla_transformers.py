"""The MLA laws held to code nobody here wrote: transformers' DeepseekV3Attention (DeepSeek-V2/V3, Kimi K2's attention).

The attention is built from a config whose widths are read from the suite's drawn params (the published DeepSeek-V3 widths
scaled down: d 7168, r_q 1536, r_kv 512, D_n 128, D_r 64, D_v 128, 128 heads), its weights copied in; mscale reaches it as
YaRN's does (a yarn config with factor e and mscale_all_dim = 10·(m - 1), so transformers' own yarn_apply_mscale folds m² into
its scaling), and the cos/sin come from its own rotary embedding at the suite's positions. mla_decode runs it chunk by chunk on
a DynamicCache, which holds the normalised latent and the rotated RoPE key. DeepSeek's RoPE pairs are interleaved
(rope_interleave = True, the default: ROPE_PAIRING = "interleaved"); rope_interleave = False is half-split. The ci profile,
float32: zero false alarms. The adapters are namespaces of this file (`--impl tests/test_mla_transformers.py:DeepseekV3MLA`).
"""

import math

import pytest

pytest.importorskip("transformers", reason="the attention is transformers' own")

import torch  # noqa: E402
from transformers import DynamicCache  # noqa: E402
from transformers.models.deepseek_v3.modeling_deepseek_v3 import (  # noqa: E402
    DeepseekV3Attention,
    DeepseekV3Config,
    DeepseekV3RotaryEmbedding,
)

import invariants.reference.numpy as ref  # noqa: E402
from invariants import REGISTRY, Implementation, all_invariants, run_invariant  # noqa: E402
from invariants.profiles import profile_settings  # noqa: E402
from invariants.strategies.mla import yarn_mscale  # noqa: E402

all_invariants()
CI = profile_settings("ci")

# The published attention settings of DeepSeek-V3 (config.json)
DEEPSEEK_V3 = dict(hidden_size=7168, num_attention_heads=128, q_lora_rank=1536, kv_lora_rank=512, qk_nope_head_dim=128, qk_rope_head_dim=64,
                   v_head_dim=128, rms_norm_eps=1e-6,
                   rope_parameters=dict(rope_type="yarn", rope_theta=10_000.0, factor=40.0, original_max_position_embeddings=4096,
                                        beta_fast=32, beta_slow=1, mscale=1.0, mscale_all_dim=1.0))
# transformers 5.24 builds q_a_layernorm and kv_a_layernorm without config.rms_norm_eps, so they keep the class default 1e-6
# (huggingface/transformers#44261, found here by mla.latent_rescaling_invariant when the adapter declared 1e-5): DeepSeek's
# published eps is 1e-6 too, so the adapters declare it and pass it to the config.
EPS = 1e-6


def _attention(params, n_heads, rope_base, mscale, interleave, dtype):
    """DeepseekV3Attention with the suite's params copied in, and its rotary embedding, both for these widths."""
    p = {name: torch.as_tensor(value) for name, value in params.items()}
    D_n, D_r, D_v = ref.mla_widths(params, n_heads)
    d, r_kv = p["W_dkv"].shape
    config = DeepseekV3Config(hidden_size=d, num_attention_heads=n_heads, num_key_value_heads=n_heads,
                              q_lora_rank=None if "W_q" in p else p["W_dq"].shape[1], kv_lora_rank=r_kv, qk_nope_head_dim=D_n,
                              qk_rope_head_dim=D_r, v_head_dim=D_v, rope_interleave=interleave, rms_norm_eps=EPS, attention_bias=False,
                              rope_parameters={"rope_type": "default", "rope_theta": float(rope_base)})
    config._attn_implementation = "eager"
    rotary = DeepseekV3RotaryEmbedding(config)
    if mscale != 1.0:  # YaRN's softmax factor as transformers reads it (the rotary embedding above stays the default one)
        config.rope_parameters = {"rope_type": "yarn", "rope_theta": float(rope_base), "factor": math.e, "mscale_all_dim": 10 * (mscale - 1.0)}
    attention = DeepseekV3Attention(config, layer_idx=0).to(dtype).eval()
    with torch.no_grad():
        if "W_q" in p:
            attention.q_proj.weight.copy_(p["W_q"].T)
        else:
            attention.q_a_proj.weight.copy_(p["W_dq"].T)
            attention.q_a_layernorm.weight.copy_(p["q_norm"])
            attention.q_b_proj.weight.copy_(p["W_uq"].T)
        attention.kv_a_proj_with_mqa.weight.copy_(torch.cat([p["W_dkv"], p["W_kr"]], dim=1).T)  # (r_kv + D_r, d)
        attention.kv_a_layernorm.weight.copy_(p["kv_norm"])
        per_head = torch.cat([p["W_uk"].reshape(r_kv, n_heads, D_n), p["W_uv"].reshape(r_kv, n_heads, D_v)], dim=-1)  # [k_nope_h, v_h]
        attention.kv_b_proj.weight.copy_(per_head.reshape(r_kv, -1).T)
        attention.o_proj.weight.copy_(p["W_o"].T)
    return attention, rotary


def _causal_mask(T, S, dtype):
    """(1, 1, T, S) additive mask: the T queries are the last T of S positions."""
    query = torch.arange(S - T, S)[:, None]
    return torch.zeros(T, S, dtype=dtype).masked_fill(torch.arange(S)[None, :] > query, float("-inf"))[None, None]


def _call(attention, rotary, x, positions, mask, cache=None):
    position_ids = torch.as_tensor(positions)[None].expand(x.shape[0], -1)
    cos, sin = rotary(x, position_ids)
    with torch.no_grad():
        return attention(x, (cos.to(x.dtype), sin.to(x.dtype)), mask, cache=cache)


class DeepseekV3MLA:
    """DeepseekV3Attention (rope_interleave = True, DeepSeek's layout) behind mla_attention and mla_decode; RMSNorm, RoPE's
    angles and the softmax in float32 (COMPUTE_DTYPE)."""

    BACKEND, COMPUTE_DTYPE, ROPE_PAIRING, RMS_NORM_EPS = "torch", "float32", "interleaved", EPS
    INTERLEAVE = True

    @classmethod
    def mla_attention(cls, x, params, n_heads, positions, rope_base, mscale):
        attention, rotary = _attention(params, n_heads, rope_base, float(mscale), cls.INTERLEAVE, x.dtype)
        T = x.shape[1]
        return _call(attention, rotary, x, positions, _causal_mask(T, T, x.dtype))

    @classmethod
    def mla_decode(cls, x, params, n_heads, positions, rope_base, mscale, chunks):
        attention, rotary = _attention(params, n_heads, rope_base, float(mscale), cls.INTERLEAVE, x.dtype)
        cache, outs, start = DynamicCache(), [], 0
        for n in (int(c) for c in chunks):
            out, _ = _call(attention, rotary, x[:, start : start + n], positions[start : start + n], _causal_mask(n, start + n, x.dtype), cache)
            outs.append(out)
            start += n
        latent, k_rope = cache.layers[0].keys, cache.layers[0].values  # (B, 1, T, r_kv), (B, 1, T, D_r): one "head" each
        return torch.cat(outs, dim=1), torch.cat([latent[:, 0], k_rope[:, 0]], dim=-1)


class DeepseekV3MLAHalfSplit(DeepseekV3MLA):
    """The same with rope_interleave = False: RoPE on half-split pairs (i, i + D_r/2), for weights permuted at conversion."""

    ROPE_PAIRING, INTERLEAVE = "half_split", False


LAWS = [name for name in REGISTRY if name.startswith("mla.")]
ADAPTERS = ("DeepseekV3MLA", "DeepseekV3MLAHalfSplit")
CASES = [(adapter, name) for adapter in ADAPTERS for name in LAWS]


@pytest.mark.parametrize(("adapter", "name"), CASES, ids=[f"{a}-{n}" for a, n in CASES])
def test_transformers_mla_passes_the_mla_laws_at_ci(adapter, name):
    outcome = run_invariant(REGISTRY[name], Implementation(globals()[adapter], label=adapter, backend="torch", dtype="float32"), settings=CI)
    assert outcome.status in ("passed", "skipped"), outcome.report or outcome.reason


def test_every_law_runs_on_the_adapters():
    assert len(LAWS) >= 9, LAWS


def test_the_published_deepseek_v3_attention_scales_and_caches_as_the_protocol_says():
    """DeepSeek-V3's published config: transformers' softmax scale is m²/√(128 + 64) with YaRN's m = 0.1·ln 40 + 1, and a token's
    cache is 512 + 64 = 576 numbers where per-head keys and values would be 128·(192 + 128) = 40,960."""
    config = DeepseekV3Config(**DEEPSEEK_V3)
    m = yarn_mscale(40.0, 1.0)
    with torch.device("meta"):  # the published widths without allocating them
        attention = DeepseekV3Attention(config, layer_idx=0)
    assert attention.scaling == pytest.approx(ref.mla_softmax_scale(128, 64, m), rel=1e-12)
    assert attention.kv_a_proj_with_mqa.out_features == 512 + 64  # what the cache takes per token: latent, then the RoPE key
    assert config.num_attention_heads * (config.qk_nope_head_dim + config.qk_rope_head_dim + config.v_head_dim) == 40_960
