"""Exact parameter counts of a Model, by part: closed-form formulas, and the tensor shapes they must sum to.

`count(model)` writes each part as the formula a reader can check by hand (a Llama layer:
2·d·H·D + 2·d·H_kv·D + 3·d·F + 2·d); `tensor_shapes(model)` lists every weight under the name and
shape transformers 5 gives it, written separately from the formulas, so that the two checking each
other (tests/test_accounting.py) and the shapes checking transformers itself
(tests/test_accounting_external.py, on the meta device) pin the count. A tied head is one table,
counted once, as `sum(p.numel() for p in model.parameters())` counts it; buffers (rotary
frequencies, DeepSeek-V3's e_score_correction_bias, Gemma's embed_scale) are not parameters and are not counted.
Letters as in invariants.accounting.config.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from invariants.accounting.config import Model

# The breakdown, in the order a token meets the parts.
PARTS = ("embeddings", "attention", "feed_forward", "shared_experts", "experts", "router", "norms", "head")


@dataclass(frozen=True)
class Count:
    """Parameters by part: all of them (`parts`), and those one token's forward pass uses (`active_parts`)."""

    parts: dict  # part -> parameters, every part of PARTS
    active_parts: dict  # the same with k of the E routed experts per mixture layer

    @property
    def total(self):
        return sum(self.parts.values())

    @property
    def active(self):
        """Parameters one token uses: everything but the routed experts it is not sent to (embeddings and head included)."""
        return sum(self.active_parts.values())

    @property
    def non_embedding(self):
        """Kaplan et al.'s N: all but the token and position tables and an untied head."""
        return self.total - self.parts["embeddings"] - self.parts["head"]


def attention_params(m):
    """One layer's attention weights and biases (its norms are in norms_params)."""
    d, H, D = m.d_model, m.n_heads, m.d_head
    if m.style == "mla":  # DeepSeek-V2: queries (optionally through a bottleneck); keys and values from a cached latent
        r_q, r_kv, rope, v = m.q_lora_rank, m.kv_lora_rank, m.qk_rope_dim, m.v_head_dim
        nope = D - rope
        bias = m.qkv_bias  # attention_bias: on q_a_proj, kv_a_proj_with_mqa and o_proj
        queries = (d * r_q + (r_q if bias else 0) + r_q * H * D) if r_q else d * H * D  # d -> r_q -> H·D, or d -> H·D
        latent = d * (r_kv + rope) + ((r_kv + rope) if bias else 0)  # d -> the latent and the shared rotary key
        expand = r_kv * H * (nope + v)  # the latent -> every head's non-rotary key and its value
        return queries + latent + expand + H * v * d + (d if bias else 0)
    weights = d * H * D + 2 * d * m.n_kv_heads * D + H * D * d  # W_q, W_k, W_v (grouped-query: H_kv heads), W_o
    sinks = H if m.sinks else 0  # gpt-oss: a learned logit per head that joins the softmax's denominator
    return weights + ((H + 2 * m.n_kv_heads) * D if m.qkv_bias else 0) + (d if m.o_bias else 0) + sinks


def mlp_params(m, width):
    """One MLP of width F: GPT-2's W1, b1, W2, b2 (2·d·F + F + d), or SwiGLU's gate, up and down (3·d·F, + 2F + d with biases)."""
    d = m.d_model
    if m.style == "gpt2":
        return 2 * d * width + width + d
    return 3 * d * width + ((2 * width + d) if m.mlp_bias else 0)


def expert_params(m):
    """One routed expert: a gated MLP of width F_e without biases (3·d·F_e), or with gpt-oss's (+ 2·F_e + d)."""
    d, F_e = m.d_model, m.d_expert
    return 3 * d * F_e + ((2 * F_e + d) if m.moe_bias else 0)


def norms_params(m):
    """Every norm: 2 (Gemma 3: 4) of width d per layer and a final one, QK-norm's 2 of width D, MLA's of its latents; LayerNorm has a bias."""
    d = m.d_model
    if m.style == "gpt2":
        return m.n_layers * 2 * 2 * d + 2 * d
    latents = m.kv_lora_rank + m.q_lora_rank if m.style == "mla" else 0
    qk = 2 * m.d_head if m.qk_norm else 0
    return m.n_layers * (m.norms_per_layer * d + qk + latents) + d


def count(m: Model) -> Count:
    """The Count of Model m: each part in closed form."""
    V, d, L = m.vocab, m.d_model, m.n_layers
    E, k, moe = m.n_experts, m.experts_per_token, m.moe_layers
    expert = expert_params(m)
    parts = {
        "embeddings": V * d + m.positions * d,  # the token table (also the head, when tied) and GPT-2's position table
        "attention": L * attention_params(m),
        "feed_forward": (L - moe) * mlp_params(m, m.d_ff),  # the dense layers' MLPs
        "shared_experts": moe * mlp_params(m, m.n_shared * m.d_expert) if moe else 0,  # S shared experts, built as one MLP of width S·F_e
        "experts": moe * E * expert,
        "router": moe * E * (d + (1 if m.moe_bias else 0)),  # a (d, E) linear map; gpt-oss's has a bias
        "norms": norms_params(m),
        "head": 0 if m.tied else V * d,
    }
    active = dict(parts, experts=moe * k * expert)
    return Count(parts, active)


# -- the same model as a list of tensors ---------------------------------------------------


@dataclass(frozen=True)
class Tensor:
    name: str  # as in transformers' model.named_parameters()
    part: str  # one of PARTS
    shape: tuple

    @property
    def size(self):
        return math.prod(self.shape)


def _linear(prefix, part, n_out, n_in, bias):
    """nn.Linear(n_in, n_out): weight (n_out, n_in), bias (n_out,)."""
    yield Tensor(f"{prefix}.weight", part, (n_out, n_in))
    if bias:
        yield Tensor(f"{prefix}.bias", part, (n_out,))


def _gpt2_tensors(m):
    d, F, bias = m.d_model, m.d_ff, m.qkv_bias
    yield Tensor("transformer.wte.weight", "embeddings", (m.vocab, d))
    yield Tensor("transformer.wpe.weight", "embeddings", (m.positions, d))
    for i in range(m.n_layers):
        h = f"transformer.h.{i}"
        # GPT-2's Conv1D stores (in, out): c_attn holds W_q, W_k, W_v side by side.
        for name, n_in, n_out, part, has_bias in (
            ("attn.c_attn", d, 3 * d, "attention", bias), ("attn.c_proj", d, d, "attention", bias),
            ("mlp.c_fc", d, F, "feed_forward", True), ("mlp.c_proj", F, d, "feed_forward", True),
        ):
            yield Tensor(f"{h}.{name}.weight", part, (n_in, n_out))
            if has_bias:
                yield Tensor(f"{h}.{name}.bias", part, (n_out,))
        for norm in ("ln_1", "ln_2"):
            yield Tensor(f"{h}.{norm}.weight", "norms", (d,))
            yield Tensor(f"{h}.{norm}.bias", "norms", (d,))
    yield Tensor("transformer.ln_f.weight", "norms", (d,))
    yield Tensor("transformer.ln_f.bias", "norms", (d,))


def _attention_tensors(m, a):
    d, H, D = m.d_model, m.n_heads, m.d_head
    if m.style != "mla":
        yield from _linear(f"{a}.q_proj", "attention", H * D, d, m.qkv_bias)
        yield from _linear(f"{a}.k_proj", "attention", m.n_kv_heads * D, d, m.qkv_bias)
        yield from _linear(f"{a}.v_proj", "attention", m.n_kv_heads * D, d, m.qkv_bias)
        yield from _linear(f"{a}.o_proj", "attention", d, H * D, m.o_bias)
        if m.sinks:
            yield Tensor(f"{a}.sinks", "attention", (H,))
        if m.qk_norm:
            yield Tensor(f"{a}.q_norm.weight", "norms", (D,))
            yield Tensor(f"{a}.k_norm.weight", "norms", (D,))
        return
    r_q, r_kv, rope, v, bias = m.q_lora_rank, m.kv_lora_rank, m.qk_rope_dim, m.v_head_dim, m.qkv_bias
    if r_q:
        yield from _linear(f"{a}.q_a_proj", "attention", r_q, d, bias)
        yield Tensor(f"{a}.q_a_layernorm.weight", "norms", (r_q,))
        yield from _linear(f"{a}.q_b_proj", "attention", H * D, r_q, False)
    else:
        yield from _linear(f"{a}.q_proj", "attention", H * D, d, False)
    yield from _linear(f"{a}.kv_a_proj_with_mqa", "attention", r_kv + rope, d, bias)
    yield Tensor(f"{a}.kv_a_layernorm.weight", "norms", (r_kv,))
    yield from _linear(f"{a}.kv_b_proj", "attention", H * (D - rope + v), r_kv, False)
    yield from _linear(f"{a}.o_proj", "attention", d, H * v, bias)


def _swiglu_tensors(m, prefix, part, width):
    yield from _linear(f"{prefix}.gate_proj", part, width, m.d_model, m.mlp_bias)
    yield from _linear(f"{prefix}.up_proj", part, width, m.d_model, m.mlp_bias)
    yield from _linear(f"{prefix}.down_proj", part, m.d_model, width, m.mlp_bias)


def _mixture_tensors(m, mlp):
    """A mixture layer's router and experts: transformers 5 stores a layer's experts as stacked tensors."""
    d, E, F_e = m.d_model, m.n_experts, m.d_expert
    if m.moe_bias:  # gpt-oss: the router is mlp.router, and its experts store (in, out), with biases
        yield from _linear(f"{mlp}.router", "router", E, d, True)
        yield Tensor(f"{mlp}.experts.gate_up_proj", "experts", (E, d, 2 * F_e))
        yield Tensor(f"{mlp}.experts.gate_up_proj_bias", "experts", (E, 2 * F_e))
        yield Tensor(f"{mlp}.experts.down_proj", "experts", (E, F_e, d))
        yield Tensor(f"{mlp}.experts.down_proj_bias", "experts", (E, d))
        return
    yield Tensor(f"{mlp}.gate.weight", "router", (E, d))
    yield Tensor(f"{mlp}.experts.gate_up_proj", "experts", (E, 2 * F_e, d))
    yield Tensor(f"{mlp}.experts.down_proj", "experts", (E, d, F_e))
    if m.style == "mla":
        yield from _swiglu_tensors(m, f"{mlp}.shared_experts", "shared_experts", m.n_shared * F_e)


# The RMSNorms of a layer: before attention and before the MLP; Gemma 3 also normalises each one's output.
LAYER_NORMS = {2: ("input_layernorm", "post_attention_layernorm"),
               4: ("input_layernorm", "post_attention_layernorm", "pre_feedforward_layernorm", "post_feedforward_layernorm")}


def _llama_tensors(m):
    d = m.d_model
    yield Tensor("model.embed_tokens.weight", "embeddings", (m.vocab, d))
    for i in range(m.n_layers):
        layer = f"model.layers.{i}"
        yield from _attention_tensors(m, f"{layer}.self_attn")
        if m.is_dense(i):
            yield from _swiglu_tensors(m, f"{layer}.mlp", "feed_forward", m.d_ff)
        else:
            yield from _mixture_tensors(m, f"{layer}.mlp")
        for norm in LAYER_NORMS[m.norms_per_layer]:
            yield Tensor(f"{layer}.{norm}.weight", "norms", (d,))
    yield Tensor("model.norm.weight", "norms", (d,))


def tensor_shapes(m: Model) -> list[Tensor]:
    """Every parameter tensor of Model m, named and shaped as transformers 5 builds it (a tied head appears once, as the embedding)."""
    tensors = list(_gpt2_tensors(m) if m.style == "gpt2" else _llama_tensors(m))
    if not m.tied:
        tensors.append(Tensor("lm_head.weight", "head", (m.vocab, m.d_model)))
    return tensors
