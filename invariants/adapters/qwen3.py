"""transformers' Qwen3 attention (Qwen3Attention: an RMSNorm on each head's q and k before RoPE) behind the protocol's qk_norm_attention.

    pytest --pyargs invariants --impl invariants.adapters.qwen3 --impl-dtype float32 -k qk_norm

The library's own module runs with the suite's weights (invariants/adapters/toolkit.py: functional_call, its
own weights NaN-filled and never used), built from a local config (nothing is downloaded). Qwen3's
conventions, stated and converted: nn.Linear stores (out, in), the protocol's weights are (in, out),
hence the transposes; no projection biases (attention_bias=False, Qwen3's default); head_dim is
its own config field, so d need not be H·D (the suite draws both); q_norm and k_norm are
Qwen3RMSNorm(head_dim) weights, one gain per head coordinate shared by the heads, applied before
apply_rotary_pos_emb (rotate_half: ROPE_PAIRING = "half_split"); rms_norm_eps is set to the
protocol's 1e-5 (Qwen3's checkpoints use 1e-6); cos and sin come from the library's
Qwen3RotaryEmbedding at the suite's positions. The attention is the "eager" implementation, the
one that returns the weights, given the causal mask as an additive (1, 1, T, T) plane of 0 and
-inf, as the library's decoder would pass it. Qwen3RMSNorm computes in float32 and the rotary
angles are float32 whatever the input dtype: COMPUTE_DTYPE = "float32", so a float64 run holds the
laws held to rounding to float32's; float32 is the dtype this adapter is honestly compared in.
"""

from __future__ import annotations

import functools

from transformers import Qwen3Config
from transformers.models.qwen3 import modeling_qwen3 as qwen3

from invariants.adapters import toolkit
from invariants.adapters.toolkit import T

BACKEND = "torch"
PROTOCOL_VERSION = 2
ROPE_PAIRING = "half_split"
COMPUTE_DTYPE = "float32"

PROTOCOL_RMS_EPS = 1e-5
LAYOUT = {"q_proj.weight": T("W_q"), "k_proj.weight": T("W_k"), "v_proj.weight": T("W_v"), "o_proj.weight": T("W_o"),
          "q_norm.weight": "q_norm", "k_norm.weight": "k_norm"}


def _config(*, d_model, n_heads, n_kv_heads, d_head, rope_base):
    config = Qwen3Config(vocab_size=1, hidden_size=d_model, intermediate_size=1, num_hidden_layers=1, num_attention_heads=n_heads,
                         num_key_value_heads=n_kv_heads, head_dim=d_head, rms_norm_eps=PROTOCOL_RMS_EPS, attention_bias=False,
                         rope_parameters={"rope_type": "default", "rope_theta": float(rope_base)}, max_position_embeddings=4096)
    config._attn_implementation = "eager"  # the implementation that returns the weights
    return config


def _build(*, d_model, n_heads, n_kv_heads, d_head, rope_base):
    return qwen3.Qwen3Attention(_config(d_model=d_model, n_heads=n_heads, n_kv_heads=n_kv_heads, d_head=d_head, rope_base=rope_base), 0)


@functools.lru_cache(maxsize=64)
def _rotary(d_head, rope_base, device):
    config = _config(d_model=d_head, n_heads=1, n_kv_heads=1, d_head=d_head, rope_base=rope_base)
    return qwen3.Qwen3RotaryEmbedding(config).to(device)


def qk_norm_attention(x, params, n_heads, n_kv_heads, positions, rope_base):
    """(B, T, d) -> (out (B, T, d), weights (B, H, T, T)) through Qwen3Attention with the library's cos and sin at `positions`."""
    d_head = params["q_norm"].shape[0]
    target = toolkit.module(_build, like=x, d_model=x.shape[-1], n_heads=n_heads, n_kv_heads=n_kv_heads, d_head=d_head,
                            rope_base=float(rope_base))
    cos, sin = _rotary(d_head, float(rope_base), x.device)(x, positions.reshape(1, -1).to(x.device))  # (1, T, D) each, in x's dtype
    mask = toolkit.causal_mask(x, additive=True)[None, None]  # (1, 1, T, T): 0 where a query may look, -inf after it
    return toolkit.call(target, toolkit.weights(LAYOUT, params), x, forward=lambda attn, h: attn(h, (cos, sin), mask))
