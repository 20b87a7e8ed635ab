"""A model's card from its config: parameters by part, the weights' bytes, 2N and 6ND compute, the KV cache per token.

The compute rules are Kaplan et al. (2020): a forward pass costs about 2 FLOPs per parameter
per token (a multiply and an add) and training about 6 (the backward pass costs twice the
forward), with N the parameters a token uses (a mixture's active count). The KV cache holds a
key and a value per layer, key/value head and head dimension: 2·L·H_kv·D values per token;
DeepSeek's multi-head latent attention caches one latent and one shared rotary key instead,
L·(kv_lora_rank + qk_rope_head_dim) values (transformers 5 caches that latent too).
"""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Mapping
from typing import Any

from invariants.accounting.config import ConfigError, ConfigSource, Model, read_config, read_model
from invariants.accounting.count import PARTS, count
from invariants.reference.counts import inference_flops_per_token, training_flops

BITS = {"float32": 32, "bfloat16": 16, "int8": 8, "4-bit": 4}  # per weight or cached value


def weight_bytes(n_params: int, dtype: str) -> int:
    """Bytes of n_params weights stored in dtype, the weights alone (no quantisation scales, no optimiser state); 4-bit rounds up."""
    return -(-n_params * BITS[dtype] // 8)


def kv_values_per_token(m: Model) -> int:
    """Values the KV cache stores per token of context: 2·L·H_kv·D, or L·(kv_lora_rank + qk_rope_head_dim) for MLA."""
    if m.style == "mla":
        return m.n_layers * (m.kv_lora_rank + m.qk_rope_dim)
    return 2 * m.n_layers * m.n_kv_heads * m.d_head


def kv_formula(m):
    if m.style == "mla":
        return f"L·(kv_lora_rank + qk_rope_head_dim)·bytes = {m.n_layers}·({m.kv_lora_rank} + {m.qk_rope_dim})·bytes"
    return f"2·L·H_kv·D·bytes = 2·{m.n_layers}·{m.n_kv_heads}·{m.d_head}·bytes"


def card(source: ConfigSource, *, overrides: Mapping[str, Any] | None = None, tokens: float | None = None) -> dict[str, Any]:
    """Everything the card shows, as plain JSON-ready values, for a known model's name, a config path or a mapping.

    overrides replace config keys first ({"tie_word_embeddings": False}, or an alias: num_hidden_layers
    for GPT-2's n_layer), and the card lists them as applied; tokens, a training set's size D, adds
    6·N·D. Raises invariants.accounting.ConfigError (one line) on input it cannot count or an override it does not read.
    """
    config = read_config(source)
    overrides = dict(overrides or {})
    try:
        model, applied = read_model(config, overrides)
    except ConfigError as exc:
        raise ConfigError(f"{source}: {exc}") if isinstance(source, (str, os.PathLike)) else exc from None
    c = count(model)
    n = c.active
    values = kv_values_per_token(model)
    kv = {dtype: weight_bytes(values, dtype) for dtype in BITS}
    return {
        "model": str(source) if isinstance(source, (str, os.PathLike)) else config.get("_name_or_path") or model.model_type,
        "model_type": model.model_type,
        "overrides": [{"set": key, "as": applied.get(key, key), "value": value} for key, value in overrides.items()],
        "architecture": {key: list(value) if isinstance(value, tuple) else value for key, value in dataclasses.asdict(model).items()},
        "parameters": {
            "total": c.total,
            "active": c.active,
            "non_embedding": c.non_embedding,
            "by_part": c.parts,
            "active_by_part": c.active_parts,
        },
        "weights_bytes": {dtype: weight_bytes(c.total, dtype) for dtype in BITS},
        "flops": {
            "per_generated_token": inference_flops_per_token(n),
            "per_training_token": training_flops(n, 1),
            "training_tokens": tokens,
            "training": training_flops(n, tokens) if tokens is not None else None,
        },
        "kv_cache": {
            "values_per_token": values,
            "bytes_per_token": kv,
            "formula": kv_formula(model),
            "context": model.context,
            "bytes_at_context": {dtype: b * model.context for dtype, b in kv.items()} if model.context else None,
        },
    }


# -- the table -----------------------------------------------------------------------------


def _size(n_bytes):
    return f"{n_bytes / 1e9:,.2f} GB ({n_bytes / 2**30:,.2f} GiB)"


def _shape_line(a):
    heads = f"H {a['n_heads']:,}" + (f", H_kv {a['n_kv_heads']:,}" if a["style"] != "mla" else "") + f", D {a['d_head']:,}"
    bits = [a["model_type"], f"V {a['vocab']:,}", f"d {a['d_model']:,}", f"L {a['n_layers']:,}", heads]
    if a["d_ff"]:
        bits.append(f"F {a['d_ff']:,}")
    if a["n_experts"]:
        moe = f"E {a['n_experts']:,}, k {a['experts_per_token']:,}, F_e {a['d_expert']:,}"
        if a["n_shared"]:
            moe += f", S {a['n_shared']:,} shared"
        dense = a["dense_layers"]
        if dense and dense == list(range(len(dense))):
            moe += f", first {len(dense):,} dense"
        elif dense:
            moe += f", dense layers {', '.join(map(str, dense))}"
        bits.append(moe)
    if a["style"] == "mla":
        q = f"r_q {a['q_lora_rank']:,}" if a["q_lora_rank"] else "full q"
        bits.append(f"MLA r_kv {a['kv_lora_rank']:,}, {q}, rope {a['qk_rope_dim']:,}, v {a['v_head_dim']:,}")
    extras = [name for name, on in (("QK-norm", a["qk_norm"]), ("4 norms per layer", a["norms_per_layer"] == 4),
                                    ("attention sinks", a["sinks"]), ("router and expert biases", a["moe_bias"])) if on]
    bits += extras
    bits.append("tied head" if a["tied"] else "untied head")
    if a["model_type"] == "gemma3":
        bits.append("the text model only: the vision tower and its projector are not counted")
    return " · ".join(bits)


def format_card(data: Mapping[str, Any]) -> str:
    """The card as a terminal table."""
    p, a = data["parameters"], data["architecture"]
    total = p["total"]
    lines = [f"{data['model']}: {_shape_line(a)}"]
    lines += [f"  with {o['as']} = {json.dumps(o['value'])}" + (f" (set as {o['set']})" if o["set"] != o["as"] else "")
              for o in data.get("overrides", ())]
    lines += ["", f"{'part':<16}{'parameters':>18}{'active per token':>20}{'share':>8}"]
    for part in PARTS:
        n, active = p["by_part"][part], p["active_by_part"][part]
        if n or active:
            lines.append(f"{part:<16}{n:>18,}{active:>20,}{n / total:>8.1%}")
    lines.append(f"{'total':<16}{total:>18,}{p['active']:>20,}{1:>8.0%}")
    lines.append(f"{'non-embedding':<16}{p['non_embedding']:>18,}")
    lines += ["", "weights (the parameters alone: no activations, optimiser state or quantisation scales)"]
    lines += [f"  {dtype:<10}{_size(b):>28}" for dtype, b in data["weights_bytes"].items()]
    f = data["flops"]
    n_label = "N active" if a["n_experts"] else "N"
    lines += ["", f"compute ({n_label} = {p['active']:,})",
              f"  2N  = {f['per_generated_token']:.3g} FLOPs per generated token",
              f"  6N  = {f['per_training_token']:.3g} FLOPs per training token"]
    if f["training"] is not None:
        lines.append(f"  6ND = {f['training']:.3g} FLOPs to train on D = {f['training_tokens']:,} tokens")
    kv = data["kv_cache"]
    lines += ["", f"KV cache per token: {kv['formula']}"]
    for dtype in ("bfloat16", "float32"):
        at = f"; {_size(kv['bytes_at_context'][dtype])} for {kv['context']:,} tokens" if kv["context"] else ""
        lines.append(f"  {dtype:<10}{kv['bytes_per_token'][dtype]:>12,} bytes{at}")
    return "\n".join(lines)
