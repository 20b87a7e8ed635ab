"""transformers' decoder-only families (Llama, Mistral, Qwen2) behind the protocol's modern-decoder functions: the shared machinery.

invariants/adapters/llama.py, invariants/adapters/mistral.py and invariants/adapters/qwen2.py each call `functions(family)` and state
their family's conventions; this module builds tiny models from local configs (nothing is
downloaded) and runs the library's own code with the suite's weights (through invariants/adapters/toolkit.py:
functional_call, so nothing is copied and the module's own weights, NaN-filled, are never used):

- rope: the family's RotaryEmbedding (cos and sin from its inv_freq, computed in float32) and its
  apply_rotary_pos_emb (rotate_half: the half-split pairing, HF's layout).
- swiglu: the family's MLP, down(act(gate(x)) * up(x)) with act SiLU.
- llama_block: the family's base model with one decoder layer, fed inputs_embeds=x, so that the
  library builds its own causal (and sliding-window) mask and rotary embeddings; the layer's output
  is read with a forward hook (the model's final norm runs too, and is discarded).
- llama_logits: the family's ForCausalLM on the ids.
- llama_decode: the same model called once per chunk with the library's own DynamicCache
  (built from the model's config, so a sliding-window model gets sliding cache layers, which keep
  the last w - 1 positions; full layers at w = 1, see decode_cache); positions come from the
  cache's length, as in generation.

Conventions every family shares, converted here: nn.Linear stores (out, in), the protocol's weights
are (in, out), hence the transposes; the config's rms_norm_eps is the protocol's 1e-5; the
config's rope_parameters carry rope_base as rope_theta; bos/eos/pad ids are unset (tiny vocabularies);
ids outside [0, V) are refused with the protocol's ValueError before the call (nn.Embedding raises
IndexError, and the ids are checked, not guessed). The library computes RMSNorm and RoPE in
float32 whatever the input dtype (LlamaRMSNorm casts to float32, the rotary embedding's angles are
float32): float32 is the dtype these adapters are honestly compared in, and a float64 run misses
the 1e-10 agreement by float32 rounding.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch

from invariants.adapters import toolkit
from invariants.adapters.toolkit import T, each

PROTOCOL_RMS_EPS = 1e-5


@dataclass(frozen=True)
class Family:
    """One transformers model family: its config and model classes, its rotary helpers, and how a window and biases are configured."""

    name: str
    config_class: type
    base_model: type  # e.g. LlamaModel
    causal_lm: type  # e.g. LlamaForCausalLM
    mlp: type  # e.g. LlamaMLP
    rotary: type  # e.g. LlamaRotaryEmbedding
    apply_rotary: object  # the module's apply_rotary_pos_emb
    window_options: object  # window -> config kwargs (a family without windows raises for window != None)
    qkv_bias_options: dict  # config kwargs that give q, k, v (and maybe o) biases, or None if they are always there
    has_o_bias_with_qkv: bool = False  # Llama's attention_bias adds an o_proj bias too (fed zeros: the protocol has none)


def _config(family, *, vocab=1, d_model, n_layers=1, n_heads=1, n_kv_heads=1, d_head=None, d_ff=1, rope_base=10_000.0, window=None,
            qkv_bias=False):
    options = dict(
        vocab_size=vocab, hidden_size=d_model, intermediate_size=d_ff, num_hidden_layers=n_layers, num_attention_heads=n_heads,
        num_key_value_heads=n_kv_heads, rms_norm_eps=PROTOCOL_RMS_EPS, hidden_act="silu", tie_word_embeddings=False,
        rope_parameters={"rope_type": "default", "rope_theta": float(rope_base)}, bos_token_id=None, eos_token_id=None, pad_token_id=None,
        max_position_embeddings=4096, **family.window_options(window),
    )
    if d_head is not None and "head_dim" in family.config_class.__dataclass_fields__:
        options["head_dim"] = d_head
    if qkv_bias and family.qkv_bias_options:
        options.update(family.qkv_bias_options)
    config = family.config_class(**options)
    config._attn_implementation = "sdpa"  # the library's default attention on the CPU (torch's SDPA with its own masks)
    return config


def _block_layout(qkv_bias, o_bias):
    layout = {
        "input_layernorm.weight": "attn_norm",
        "self_attn.q_proj.weight": T("W_q"), "self_attn.k_proj.weight": T("W_k"), "self_attn.v_proj.weight": T("W_v"),
        "self_attn.o_proj.weight": T("W_o"),
        "post_attention_layernorm.weight": "ffn_norm",
        "mlp.gate_proj.weight": T("W_gate"), "mlp.up_proj.weight": T("W_up"), "mlp.down_proj.weight": T("W_down"),
    }
    if qkv_bias:  # a bias the suite did not draw reads as zeros (toolkit.OPTIONAL_BIASES)
        layout.update({"self_attn.q_proj.bias": "b_q", "self_attn.k_proj.bias": "b_k", "self_attn.v_proj.bias": "b_v"})
    if o_bias:
        layout["self_attn.o_proj.bias"] = "b_o"
    return layout


def _biases(family, params):
    """(q/k/v biases in the module, an o_proj bias in the module) for params (a block's) under family."""
    if family.qkv_bias_options is None:  # always there (Qwen2: q, k, v)
        return True, False
    drawn = "b_q" in params
    return drawn, drawn and family.has_o_bias_with_qkv


def _sizes(params, n_heads, n_kv_heads):
    d, q_width = params["W_q"].shape
    return {"d_model": d, "n_heads": n_heads, "n_kv_heads": n_kv_heads, "d_head": q_width // n_heads, "d_ff": params["W_gate"].shape[1]}


def _check_ids(ids, vocab):
    if ids.ndim != 2:
        raise ValueError(f"ids must be (batch, seq), got shape {tuple(ids.shape)}")
    if ids.numel() and (int(ids.min()) < 0 or int(ids.max()) >= vocab):
        raise ValueError(f"token ids must lie in [0, {vocab}): got {int(ids.min())} .. {int(ids.max())}")


def decode_cache(config, window):
    """The library's DynamicCache for `config` (sliding layers where it has a window), or full layers at window 1.

    At w = 1 transformers' sliding layer (5.24) keeps every position, as its slice [-w + 1:] is [0:], and
    decoding then attends to the whole cache: full layers, which hold every position as the size law allows
    and which the library's own sliding mask reads right, decode correctly. tests/test_decoder_adapters.py
    shows the suite finding the library's own cache at w = 1.
    """
    from transformers import DynamicCache

    return DynamicCache() if window == 1 else DynamicCache(config=config)


def functions(family):
    """The protocol functions rope, swiglu, llama_block, llama_logits and llama_decode for one transformers family."""

    def build_model(*, base=False, qkv_bias=False, dtype=None, device=None, **sizes):  # the toolkit moves it to dtype and device
        config = _config(family, qkv_bias=qkv_bias, **sizes)
        return (family.base_model if base else family.causal_lm)(config)

    def build_mlp(d_model, d_ff):
        config = _config(family, d_model=2, d_ff=1)  # a valid config (RoPE needs an even head width), then the MLP's own sizes:
        config.hidden_size, config.intermediate_size = d_model, d_ff  # the MLP reads only these two
        return family.mlp(config)

    @functools.lru_cache(maxsize=64)
    def rotary(d_head, base, device):
        return family.rotary(_config(family, d_model=d_head, d_head=d_head, rope_base=base)).to(device)

    def rope(x, positions, base):
        """(..., T, D) -> (..., T, D) through the family's rotary embedding and apply_rotary_pos_emb (half-split pairs)."""
        T_, D = x.shape[-2:]
        flat = x.reshape(-1, 1, T_, D)  # (N, 1, T, D): apply_rotary_pos_emb's (batch, heads, seq, head_dim)
        cos, sin = rotary(D, float(base), x.device)(flat, positions.reshape(1, -1).to(x.device))  # (1, T, D) each, in x's dtype
        rotated, _ = family.apply_rotary(flat, flat, cos, sin)
        return rotated.reshape(x.shape)

    def swiglu(x, W_gate, W_up, W_down):
        """(..., d) -> (..., d) through the family's MLP: down_proj(SiLU(gate_proj(x)) * up_proj(x))."""
        target = toolkit.module(build_mlp, like=x, d_model=x.shape[-1], d_ff=W_gate.shape[1])
        values = {"gate_proj.weight": W_gate.T, "up_proj.weight": W_up.T, "down_proj.weight": W_down.T}
        return toolkit.call(target, values, x)

    def llama_block(x, params, n_heads, n_kv_heads, rope_base, window):
        """(B, T, d) -> (B, T, d): one decoder layer of the family's base model, which builds its own mask and rotary embeddings."""
        qkv_bias, o_bias = _biases(family, params)
        target = toolkit.module(build_model, like=x, base=True, qkv_bias=qkv_bias, rope_base=float(rope_base), window=window,
                                **_sizes(params, n_heads, n_kv_heads))
        values = toolkit.weights(toolkit.under("layers.0.", _block_layout(qkv_bias, o_bias)), params)
        values["norm.weight"] = torch.ones_like(params["attn_norm"])  # the final norm, whose output is discarded
        with toolkit.capture(target, "layers.0") as seen:
            toolkit.call(target, values, x, forward=lambda model, embeds: model(inputs_embeds=embeds).last_hidden_state)
        return seen[-1][0] if isinstance(seen[-1], tuple) else seen[-1]

    def _model(params, n_heads, n_kv_heads, rope_base, window, like):
        blocks = params["blocks"]
        qkv_bias, o_bias = _biases(family, blocks[0]) if blocks else (False, False)
        (vocab, _), sizes = params["embed"].shape, _sizes(blocks[0], n_heads, n_kv_heads)
        target = toolkit.module(build_model, like=like, qkv_bias=qkv_bias, rope_base=float(rope_base), window=window, vocab=vocab,
                                n_layers=len(blocks), **sizes)
        layout = {"model.embed_tokens.weight": "embed", "model.layers.{}.": each("blocks", _block_layout(qkv_bias, o_bias)),
                  "model.norm.weight": "norm", "lm_head.weight": T("W_out")}
        return target, toolkit.weights(layout, params), vocab

    def llama_logits(ids, params, n_heads, n_kv_heads, rope_base, window):
        """(B, T) ids -> (B, T, V) through the family's ForCausalLM."""
        target, values, vocab = _model(params, n_heads, n_kv_heads, rope_base, window, params["embed"])
        _check_ids(ids, vocab)
        return toolkit.call(target, values, ids, forward=lambda model, i: model(input_ids=i).logits)

    def llama_decode(ids, params, n_heads, n_kv_heads, rope_base, window, chunks):
        """A prefill of chunks[0] tokens, then each chunk on the library's DynamicCache: (logits (B, T, V), cache sizes (n,))."""
        target, values, vocab = _model(params, n_heads, n_kv_heads, rope_base, window, params["embed"])
        _check_ids(ids, vocab)
        cache = decode_cache(target.config, window)
        logits, sizes, start = [], [], 0
        for n in (int(c) for c in chunks):
            chunk = ids[:, start : start + n]
            logits.append(toolkit.call(target, values, chunk, forward=lambda model, i: model(input_ids=i, cache=cache, use_cache=True).logits))
            sizes.append(sum(layer.keys.numel() + layer.values.numel() for layer in cache.layers))
            start += n
        return torch.cat(logits, dim=1), torch.tensor(sizes, dtype=torch.int64)

    return {"rope": rope, "swiglu": swiglu, "llama_block": llama_block, "llama_logits": llama_logits, "llama_decode": llama_decode}
