"""Inputs for multi-head latent attention (DeepSeek-V2/V3, Kimi K2): shapes, the latent projections, positions, YaRN's factor, chunks.

Valid by construction: the RoPE width D_r is 2 × pairs (even), every other width (D_n, D_v, r_q, r_kv, d) at least 1 and
drawn apart from the others (DeepSeek-V3: d 7168, r_q 1536, r_kv 512, D_n 128, D_r 64, D_v 128, 128 heads), the queries come
compressed (W_dq, q_norm, W_uq) or not (W_q: DeepSeek-V2-Lite), and decode chunks are compositions of T. Positions are
drawn as code meets them (strategies/decoder.py's position_runs: gaps, resets, left padding), so code that counts 0..T-1
is told apart. As everywhere, every array of a draw comes from one drawn seed.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
from hypothesis import strategies as st
from hypothesis.strategies import SearchStrategy

from invariants.strategies._validation import check_float, check_int, check_int_range, check_order
from invariants.strategies.core import cached_strategy, integers, sampled_from, scales, seeds
from invariants.strategies.decoder import ROPE_BASES, decode_schedules, position_runs

__all__ = ["MSCALES", "mla_decode_inputs", "mla_inputs", "yarn_mscale"]


def yarn_mscale(factor, mscale_all_dim):
    """YaRN's attention factor m = 0.1·mscale_all_dim·ln(factor) + 1 (1 for factor <= 1): MLA's softmax scale is m²/√(D_n + D_r)."""
    return 1.0 if factor <= 1 else 0.1 * mscale_all_dim * math.log(factor) + 1.0


# mscale: none (no YaRN), DeepSeek-V2's (factor 40, mscale_all_dim 0.707) and DeepSeek-V3's (factor 40, mscale_all_dim 1)
MSCALES = (1.0, yarn_mscale(40, 0.707), yarn_mscale(40, 1.0))
QUERY_COMPRESSION = (True, False)  # W_dq, q_norm, W_uq (DeepSeek-V2, V3, Kimi K2), or W_q (DeepSeek-V2-Lite: q_lora_rank None)


@cached_strategy
def mla_inputs(*, min_batch=1, max_batch=2, min_seq=1, max_seq=5, max_heads=3, max_width=3, max_pairs=2, max_rank=4, max_d_model=6,
               max_start=64, bases=ROPE_BASES, mscales=MSCALES, query_compression=QUERY_COMPRESSION, min_latent_scale=1.0,
               max_latent_scale=1.0) -> SearchStrategy[dict[str, Any]]:
    """dicts {x (B, T, d), params, n_heads, positions (T,), rope_base, mscale}, in the order mla_attention takes them.

    params: W_dkv (d, r_kv), kv_norm (r_kv,), W_kr (d, D_r), W_uk (r_kv, H·D_n), W_uv (r_kv, H·D_v), W_o (H·D_v, d), and W_dq (d,
    r_q), q_norm (r_q,), W_uq (r_q, H·(D_n + D_r)) or W_q (d, H·(D_n + D_r)), as `query_compression` allows; standard normal /
    √fan_in, W_dq and W_dkv times a scale from [min_latent_scale, max_latent_scale] (the latents are normalised, so their scale
    cancels; large ones overflow a 16-bit square); the gains uniform in [0.5, 1.5]. D_n, D_v in [1, max_width], D_r = 2·pairs.
    """
    for prefix, low, high in (("batch", min_batch, max_batch), ("seq", min_seq, max_seq)):
        check_int_range(prefix, low, high, low=1)
    for name, value in (("max_heads", max_heads), ("max_width", max_width), ("max_pairs", max_pairs), ("max_rank", max_rank),
                        ("max_d_model", max_d_model)):
        check_int(name, value, low=1)
    check_int("max_start", max_start, low=0)
    check_float("min_latent_scale", min_latent_scale, positive=True)
    check_float("max_latent_scale", max_latent_scale, positive=True)
    check_order("min_latent_scale", min_latent_scale, "max_latent_scale", max_latent_scale)
    for base in bases:
        check_float("base", base, low=1.0000001)
    for m in mscales:
        check_float("mscale", m, positive=True)
    bases, mscales, query_compression = tuple(bases), tuple(mscales), tuple(query_compression)
    latent_scales = scales(min_latent_scale, max_latent_scale)

    @st.composite
    def inputs(draw):
        B, T, H = draw(integers(min_batch, max_batch)), draw(integers(min_seq, max_seq)), draw(integers(1, max_heads))
        D_n, D_r, D_v = draw(integers(1, max_width)), 2 * draw(integers(1, max_pairs)), draw(integers(1, max_width))
        r_q, r_kv, d = draw(integers(1, max_rank)), draw(integers(1, max_rank)), draw(integers(1, max_d_model))
        compressed, base, mscale = draw(sampled_from(query_compression)), draw(sampled_from(bases)), draw(sampled_from(mscales))
        latent_scale = draw(latent_scales)
        positions = draw(position_runs(T, max_start=max_start))
        rng = np.random.default_rng(draw(seeds()))

        def matrix(fan_in, fan_out, gain=1.0):
            return gain * rng.standard_normal((fan_in, fan_out)) / np.sqrt(fan_in)

        params = {"W_dkv": matrix(d, r_kv, latent_scale), "kv_norm": rng.uniform(0.5, 1.5, r_kv), "W_kr": matrix(d, D_r),
                  "W_uk": matrix(r_kv, H * D_n), "W_uv": matrix(r_kv, H * D_v), "W_o": matrix(H * D_v, d)}
        if compressed:
            params.update(W_dq=matrix(d, r_q, latent_scale), q_norm=rng.uniform(0.5, 1.5, r_q), W_uq=matrix(r_q, H * (D_n + D_r)))
        else:
            params["W_q"] = matrix(d, H * (D_n + D_r))
        return {"x": rng.standard_normal((B, T, d)), "params": params, "n_heads": H, "positions": positions, "rope_base": base,
                "mscale": mscale}

    return inputs()


@cached_strategy
def mla_decode_inputs(*, min_chunks=1, **options) -> SearchStrategy[dict[str, Any]]:
    """mla_inputs(**options) with chunks: a composition of T into at least min_chunks positive chunks (decode_schedules), in the
    order mla_decode takes them (a prefill, then the chunks decoded on the cache)."""
    check_int("min_chunks", min_chunks, low=1)
    options.setdefault("min_seq", min_chunks)

    @st.composite
    def inputs(draw):
        drawn = draw(mla_inputs(**options))
        return {**drawn, "chunks": draw(decode_schedules(drawn["x"].shape[1], min_chunks=min_chunks))}

    return inputs()
