"""Inputs for StreamingLLM's rolling cache: a stream of queries, keys and values before RoPE, the sinks kept and the cache's slots.

n_sink is 0 (the plain sliding window) to 4 (the paper's choice), the window cache_size - n_sink 1 to 4 slots, and the stream
runs up to 4 tokens past the cache, where eviction and the positions within the cache start to matter: with min_past >= 1 every
draw does. q and k are standard normal (scores q·k/√D of size 1: no weight a query gives a key it sees underflows, even in
float16, so "seen" and "weighted non-zero" mean the same), v standard normal, heads of even width for RoPE's pairs.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from hypothesis import strategies as st
from hypothesis.strategies import SearchStrategy

from invariants.strategies._validation import InvalidArgument, check_float, check_int, check_int_range
from invariants.strategies.core import cached_strategy, integers, sampled_from, seeds
from invariants.strategies.decoder import ROPE_BASES

__all__ = ["streaming_inputs"]

MAX_SINKS = 4  # StreamingLLM keeps 4 initial tokens (§3.2, Table 2: 4 suffice, 1 or 2 do not)


@cached_strategy
def streaming_inputs(*, min_sinks: int = 0, max_sinks: int = MAX_SINKS, max_window: int = 4, min_past: int | None = None,
                     max_past: int = 4, bases: tuple[float, ...] = ROPE_BASES) -> SearchStrategy[dict[str, Any]]:
    """dicts {q (B, H, T, D), k and v (B, H_kv, T, D), n_sink, cache_size, rope_base}, in the order streaming_attention takes them.

    n_sink in [min_sinks, max_sinks], cache_size = n_sink + a window of 1 to max_window slots; the stream's length T ends at most
    max_past tokens past the cache, and at least min_past past it where given (any length from 1 otherwise). D is even, H a
    multiple of H_kv (up to 2 kv heads, 2 queries each), B up to 2; shrinks towards no sinks, one slot, one token, one head.
    """
    check_int_range("sinks", min_sinks, max_sinks, low=0)
    check_int("max_window", max_window, low=1)
    check_int_range("past", 0 if min_past is None else min_past, max_past, low=0)
    bases = tuple(bases)
    if not bases:
        raise InvalidArgument("bases=() is empty; give at least one RoPE base, e.g. (10000.0,)")
    for base in bases:
        check_float("base", base, low=1.0000001)

    @st.composite
    def inputs(draw):
        n_sink = draw(integers(min_sinks, max_sinks))
        cache_size = n_sink + draw(integers(1, max_window))
        T = draw(integers(1, cache_size + max_past)) if min_past is None else cache_size + draw(integers(min_past, max_past))
        B, H_kv, group, D = draw(integers(1, 2)), draw(integers(1, 2)), draw(integers(1, 2)), 2 * draw(integers(1, 2))
        rng = np.random.default_rng(draw(seeds()))
        return {
            "q": rng.standard_normal((B, H_kv * group, T, D)),  # (B, H, T, D)
            "k": rng.standard_normal((B, H_kv, T, D)),  # (B, H_kv, T, D)
            "v": rng.standard_normal((B, H_kv, T, D)),  # (B, H_kv, T, D)
            "n_sink": n_sink,
            "cache_size": cache_size,
            "rope_base": draw(sampled_from(bases)),
        }

    return inputs()
