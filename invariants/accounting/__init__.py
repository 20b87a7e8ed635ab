"""Exact accounting from a config: parameters (total, active, by part), weight bytes, 2N and 6ND, the KV cache per token.

    from invariants.accounting import card, param_count
    param_count("llama-3-8b").total                  # 8,030,261,248, as transformers counts it on the meta device
    param_count({"model_type": "mixtral", ...}).active
    card("path/to/config.json")["kv_cache"]["bytes_per_token"]["bfloat16"]

The command line: `python -m invariants.accounting llama-3-8b` or `invariants-card path/config.json [--json]`.
Families: GPT-2, Llama (tied and untied heads), Mistral, Qwen2, Mixtral, DeepSeek-V2/V3, Qwen3-MoE, Gemma 3 (the
text model), gpt-oss (docs/accounting.md).
"""

from __future__ import annotations

from invariants.accounting.card import BITS, card, format_card, kv_values_per_token, weight_bytes
from invariants.accounting.config import STYLES, ConfigError, ConfigSource, Model, known_models, model_from_config, read_config
from invariants.accounting.count import PARTS, Count, Tensor, count, tensor_shapes


def param_count(source: ConfigSource) -> Count:
    """The Count (total, active, non_embedding, parts, active_parts) of a known model's name, a config.json path or a mapping."""
    return count(model_from_config(read_config(source)))


__all__ = [
    "BITS", "PARTS", "STYLES", "ConfigError", "Count", "Model", "Tensor", "card", "count", "format_card", "known_models",
    "kv_values_per_token", "model_from_config", "param_count", "read_config", "tensor_shapes", "weight_bytes",
]
