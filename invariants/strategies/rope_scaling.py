"""Inputs for RoPE scaling and partial rotary: scaling configs of every rope_type at lengths around the trained one, and
heads whose leading part turns.

Settings come from the published configs (Llama 3.1: llama3, s = 8, low 1, high 4, L_0 = 8192; Llama 3.2: s = 32;
DeepSeek-V3: YaRN s = 40, β 32 and 1, mscale = mscale_all_dim = 1, L_0 = 4096; DeepSeek-V2: mscale 0.707; gpt-oss: YaRN
s = 32 without truncation; Phi-3: LongRoPE, L_0 = 4096 to 131072) and smaller trained lengths, so that a few pairs of a
small head fall in each band. Sequence lengths are drawn at L_0, one past it, and on either side, where the short and long
branches meet. Partial rotary heads are drawn so that int(D · factor) is even and at least 2, exactly (0.4 · 5m rounds up).
"""

from __future__ import annotations

from typing import Any

import numpy as np
from hypothesis import strategies as st
from hypothesis.strategies import SearchStrategy

from invariants.strategies.core import byte_arrays, cached_strategy, float_arrays, integers, sampled_from
from invariants.strategies.decoder import rope_inputs

__all__ = ["partial_rope_inputs", "rope_frequency_inputs", "rope_scalings"]

BASES = (10_000.0, 500_000.0, 50_000.0)  # Llama 2, Llama 3, a base between
TRAINED_LENGTHS = (64, 2048, 4096, 8192)  # original_max_position_embeddings
LINEAR_FACTORS = (2.0, 4.0, 1.5)
DYNAMIC_FACTORS = (2.0, 4.0, 8.0)
LLAMA3_SETTINGS = ((8.0, 1.0, 4.0), (32.0, 1.0, 4.0), (4.0, 2.0, 8.0))  # (factor, low_freq_factor, high_freq_factor)
YARN_FACTORS = (40.0, 32.0, 4.0)
YARN_MSCALES = ((None, None), (1.0, 1.0), (0.707, 0.707), (1.0, 0.707), (0.707, 1.0))  # (mscale, mscale_all_dim): none, V3, V2, unequal
LONGROPE_LENGTHS = (4, 32)  # max_position_embeddings / original_max_position_embeddings: Phi-3-mini-128k's 32
MAX_LONG_FACTOR = 64.0  # Phi-3's long factors run from 1 to about 64; its short ones stay near 1
PARTIAL_FACTORS = {0.25: 8, 0.4: 5, 0.5: 4, 0.75: 8, 1.0: 2}  # partial_rotary_factor: the head-width unit that makes int(D·f) even
ROPE_SCALING_TYPES = ("default", "linear", "dynamic", "llama3", "yarn", "longrope")


def _lengths(original):
    """seq_len around the trained length: L_0, L_0 + 1, below it, or up to 4·L_0 past it."""
    return st.one_of(st.just(original), st.just(original + 1), integers(1, original), integers(original + 1, 4 * original))


@cached_strategy
def rope_scalings(d_head: int = 8, rope_type: str | None = None) -> SearchStrategy[dict[str, Any]]:
    """A scaling dict for rope_frequencies(d_head, ...): {"rope_type", and that type's settings under transformers' names};
    one of ROPE_SCALING_TYPES, or `rope_type` alone. LongRoPE's factor lists have d_head/2 values, floats >= 1."""
    kinds = ROPE_SCALING_TYPES if rope_type is None else (rope_type,)

    @st.composite
    def scaling(draw):
        kind = draw(sampled_from(kinds))
        original = draw(sampled_from(TRAINED_LENGTHS))
        if kind == "linear":
            return {"rope_type": kind, "factor": draw(sampled_from(LINEAR_FACTORS))}
        if kind == "dynamic":
            return {"rope_type": kind, "factor": draw(sampled_from(DYNAMIC_FACTORS)), "original_max_position_embeddings": original}
        if kind == "llama3":
            factor, low, high = draw(sampled_from(LLAMA3_SETTINGS))
            return {"rope_type": kind, "factor": factor, "low_freq_factor": low, "high_freq_factor": high,
                    "original_max_position_embeddings": original}
        if kind == "yarn":
            mscale, mscale_all_dim = draw(sampled_from(YARN_MSCALES))
            found = {"rope_type": kind, "factor": draw(sampled_from(YARN_FACTORS)), "beta_fast": 32.0, "beta_slow": 1.0,
                     "original_max_position_embeddings": original, "truncate": draw(st.booleans())}
            return found | ({"mscale": mscale, "mscale_all_dim": mscale_all_dim} if mscale else {})
        if kind == "longrope":
            short = 1.0 + (draw(byte_arrays((d_head // 2,))) % 8) / 64  # near 1, as Phi-3's
            long = np.sort(1.0 + draw(byte_arrays((d_head // 2,))) / 255 * (MAX_LONG_FACTOR - 1))  # growing with the wavelength
            return {"rope_type": kind, "short_factor": short.tolist(), "long_factor": long.tolist(),
                    "original_max_position_embeddings": original, "max_position_embeddings": original * draw(sampled_from(LONGROPE_LENGTHS))}
        return {"rope_type": "default"}

    return scaling()


@cached_strategy
def rope_frequency_inputs(*, rope_type: str | None = None, max_pairs: int = 8) -> SearchStrategy[dict[str, Any]]:
    """{d_head, base, scaling, seq_len}: one call of rope_frequencies, d_head = 2·pairs with 2 to max_pairs pairs (dynamic NTK's
    exponent d/(d−2) needs d > 2), seq_len around the scaling's trained length (1 to 16,384 where it has none)."""

    @st.composite
    def inputs(draw):
        d_head = 2 * draw(integers(2, max_pairs))
        scaling = draw(rope_scalings(d_head, rope_type))
        original = scaling.get("original_max_position_embeddings", 4096)
        return {"d_head": d_head, "base": draw(sampled_from(BASES)), "scaling": scaling, "seq_len": draw(_lengths(original))}

    return inputs()


@cached_strategy
def partial_rope_inputs(*, max_units: int = 3, max_seq: int = 6, max_position: int = 64,
                        bases: tuple[float, ...] = BASES) -> SearchStrategy[dict[str, Any]]:
    """{x (B, H, T, D), positions (T,), base, partial_rotary_factor}: one call of partial_rope, D a multiple of the factor's unit
    (PARTIAL_FACTORS) so that int(D · factor) is even; positions distinct, in any order (rope_inputs)."""

    @st.composite
    def inputs(draw):
        factor = draw(sampled_from(tuple(PARTIAL_FACTORS)))
        D = PARTIAL_FACTORS[factor] * draw(integers(1, max_units))
        rotated = draw(rope_inputs(max_seq=max_seq, max_position=max_position, bases=bases))
        x = draw(float_arrays(rotated["x"].shape[:-1] + (D,)))
        return {"x": x, "positions": rotated["positions"], "base": rotated["base"], "partial_rotary_factor": factor}

    return inputs()
