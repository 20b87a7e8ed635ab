"""Inputs for per-layer attention types: Llama configs whose layers are local (sliding) or global (full), as transformers'
`layer_types` lists them, and the RoPE base of each type.

The patterns are the shipped ones (Gemma 2 and gpt-oss alternate from a sliding layer 0, Gemma 3 has five local layers to
one global, Qwen2 has its first max_window_layers layers full) besides one type everywhere and any mix; the window is always
set (a sliding layer needs one) and small, so that sequences of up to 7 tokens cross it; the two bases are drawn apart or
equal (only equal for a model with one rope_theta: one_base). Shrinks towards one layer, all sliding, one base.
"""

from __future__ import annotations

from dataclasses import dataclass

from hypothesis import strategies as st
from hypothesis.strategies import SearchStrategy

from invariants.strategies._validation import check_choice, check_int, check_int_range
from invariants.strategies.core import cached_strategy, integers, sampled_from
from invariants.strategies.decoder import ROPE_BASES, LlamaConfig, llama_configs

__all__ = ["HybridConfig", "gemma_layer_types", "hybrid_configs", "qwen2_layer_types"]

SLIDING, FULL = "sliding_attention", "full_attention"  # transformers' names
LAYER_PATTERNS = ("all sliding", "all full", "gemma2", "gemma3", "qwen2", "any")


def gemma_layer_types(n_layers, sliding_window_pattern):
    """Gemma 2 (pattern 2), gpt-oss (2) and Gemma 3 (6): layer i is full where (i + 1) % pattern == 0, else sliding."""
    return tuple(FULL if (i + 1) % sliding_window_pattern == 0 else SLIDING for i in range(n_layers))


def qwen2_layer_types(n_layers, max_window_layers):
    """Qwen2 with use_sliding_window: the first max_window_layers layers full, the rest sliding (transformers' Qwen2Config)."""
    return tuple(SLIDING if i >= max_window_layers else FULL for i in range(n_layers))


@dataclass(frozen=True)
class HybridConfig:
    """A Llama-shaped model (config.window is the sliding layers' window) with a type per layer and a RoPE base per type."""

    config: LlamaConfig
    layer_types: tuple[str, ...]
    rope_bases: dict

    @property
    def sizes(self):
        """hybrid_logits' arguments after params: (n_heads, n_kv_heads, layer_types, window, rope_bases)."""
        return self.config.n_heads, self.config.n_kv_heads, self.layer_types, self.config.window, self.rope_bases


def _layer_types(pattern, n_layers, draw):
    if pattern in ("all sliding", "all full"):
        return (SLIDING if pattern == "all sliding" else FULL,) * n_layers
    if pattern == "gemma2":
        return gemma_layer_types(n_layers, 2)
    if pattern == "gemma3":
        return gemma_layer_types(n_layers, draw(integers(2, 3)))  # Gemma 3's 6, scaled to these few layers
    if pattern == "qwen2":
        return qwen2_layer_types(n_layers, draw(integers(0, n_layers)))
    return tuple(draw(st.lists(sampled_from((SLIDING, FULL)), min_size=n_layers, max_size=n_layers)))


@cached_strategy
def hybrid_configs(*, min_layers=1, max_layers=3, patterns=LAYER_PATTERNS, min_window=1, max_window=3, qkv_bias=None,
                   bases=ROPE_BASES, one_base=False) -> SearchStrategy[HybridConfig]:
    """HybridConfig: a llama_configs draw with a window in [min_window, max_window], layer types from one of `patterns`, and
    {"sliding_attention": base, "full_attention": base} drawn from `bases` (equal or apart, as Gemma 2's or Gemma 3's; equal
    where one_base)."""
    check_int_range("layers", min_layers, max_layers, low=1)
    check_int_range("window", min_window, max_window, low=1)
    check_int("patterns", len(patterns), low=1)
    check_choice("one_base", one_base, (True, False))

    @st.composite
    def configs(draw):
        config = draw(llama_configs(min_layers=min_layers, max_layers=max_layers, windowed=True, min_window=min_window, max_window=max_window,
                                    qkv_bias=qkv_bias, bases=bases))
        layer_types = _layer_types(draw(sampled_from(tuple(patterns))), config.n_layers, draw)
        full_base = config.rope_base if one_base else draw(sampled_from(tuple(bases)))
        return HybridConfig(config, layer_types, {SLIDING: config.rope_base, FULL: full_base})

    return configs()
