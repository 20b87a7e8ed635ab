"""Inputs for the mixture of experts: (tokens, experts, k) shapes, router logits and moe params on exact grids.

Router logits and router scores live on binary grids small enough that every dtype, bfloat16
included, holds them exactly: the implementation sees exactly the drawn scores, so ties stay
ties, distinct scores stay distinct, and the top-k choice is the same for every correct
implementation in every dtype. Ties, all-zero rows and whole batches of fully tied scores are
generated on purpose. Values are read from drawn bytes (strategies/core.py), so an example shrinks
towards zero scores, zero inputs and the identity order.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from functools import cache
from typing import Any

import numpy as np
from hypothesis import strategies as st
from hypothesis.strategies import SearchStrategy

from invariants.strategies._validation import InvalidArgument, check_choice, check_float, check_int, check_int_range, check_order
from invariants.strategies.core import GRID, byte_arrays, cached_strategy, integers, nearest_power_of_two, permutation_of, sampled_from, small_ints

__all__ = ["MoEShape", "masked_router_logits", "moe_params", "moe_shapes", "moe_tokens", "router_logits", "uniform_mean_router_logits"]

LOGIT_STEP = 1 / 8  # router logits are multiples of this
MAX_LOGIT = 8.0  # |logit| <= 8 and a shift by as much stay within 16: multiples of 1/8 there are exact in bfloat16
TOKEN_STEP, MAX_TOKEN = 1 / 4, 1.0  # moe inputs x: multiples of 1/4 in [-1, 1]
ROUTER_STEP, MAX_ROUTER = 1 / 8, 0.5  # router weights: multiples of 1/8 in [-1/2, 1/2]
MAX_MOE_D = 16  # router scores x·W_r are then multiples of 1/32 no larger than 8: exact in bfloat16
EXPERT_FFNS = ("gelu", "swiglu")  # an expert is a GELU feed-forward network with biases, or a SwiGLU one without (Mixtral's)

ROW_PATTERNS = ("zero", "tied", "leaning", "confident", "spread")  # shrinks towards all-zero rows
TIE_FREE_PATTERNS = ("spread", "leaning", "confident")


@dataclass(frozen=True)
class MoEShape:
    """N tokens routed to k of E experts (1 <= k <= E), model width d."""

    tokens: int
    experts: int
    k: int
    d_model: int


@cached_strategy
def moe_shapes(*, min_tokens: int = 1, max_tokens: int = 8, min_experts: int = 1, max_experts: int = 8, min_k: int = 1, max_k: int | None = None,
               min_d: int = 1, max_d: int = 8) -> SearchStrategy[MoEShape]:
    """MoEShape(tokens, experts, k, d_model) with min_k <= k <= min(max_k, experts), valid by construction.

    max_k=None lets k go up to the number of experts. The edge cases come on purpose: k is drawn
    as its smallest value, as E (k = n, the dense mixture) or in between, each a third of the time,
    and experts shrink to min_experts (one expert by default). max_d <= 16 keeps moe's router
    scores exact in every dtype (see moe_params).
    """
    check_int_range("tokens", min_tokens, max_tokens, low=1)
    check_int_range("experts", min_experts, max_experts, low=1)
    check_int("min_k", min_k, low=1)
    if max_k is not None:
        check_int_range("k", min_k, max_k, low=1)
    if min_k > max_experts:
        raise InvalidArgument(
            f"min_k={min_k!r} is larger than max_experts={max_experts!r}: k experts per token need k <= E; lower min_k or raise max_experts"
        )
    check_int_range("d", min_d, max_d, low=1)
    _check_moe_width("max_d", max_d)

    @st.composite
    def shapes(draw):
        experts = draw(integers(max(min_experts, min_k), max_experts))
        top = experts if max_k is None else min(max_k, experts)
        k = draw(_ks(min_k, top))
        return MoEShape(draw(integers(min_tokens, max_tokens)), experts, k, draw(integers(min_d, max_d)))

    return shapes()


@cached_strategy
def _ks(low, top):
    """k in [low, top]: low, top or between, a third each (three branches even where low = top: one_of draws a shared strategy once)."""
    return st.one_of(st.just(low), st.just(top), integers(low, top))


def _check_moe_width(name, d):
    if d > MAX_MOE_D:
        raise InvalidArgument(f"{name}={d!r} is above {MAX_MOE_D}: router scores are exact in bfloat16 only up to d = {MAX_MOE_D}; lower {name}")


def _check_router_shape(n_tokens, n_experts):
    check_int("n_tokens", n_tokens, low=1)
    check_int("n_experts", n_experts, low=1)


def _check_max_logit(max_logit):
    check_float("max_logit", max_logit, positive=True)
    if not LOGIT_STEP <= max_logit <= MAX_LOGIT:
        raise InvalidArgument(
            f"max_logit={max_logit!r} must lie in [{LOGIT_STEP}, {MAX_LOGIT}]: the grid of 1/8 is exact in bfloat16 up to 16 in size, shifts included"
        )


def _row(b, pattern, n_experts, target, top, ties):
    """One token's logits (E,) in grid steps, within ±top, from bytes b (2·top + 1,); `target` is the expert a leaning or confident row favours."""
    E = n_experts
    if pattern == "zero":
        return np.zeros(E)  # every expert ties
    if pattern == "tied":
        return small_ints(b[:E], 1).astype(float) * min(4, top)  # three values: ties almost surely
    if pattern == "spread":
        if ties:
            return small_ints(b[:E], top).astype(float)
        return small_ints(permutation_of(b)[:E], top).astype(float)  # E distinct grid values
    if pattern == "leaning":  # near-uniform, the target one step ahead
        lead, rest = (1, np.zeros(E - 1)) if ties else (top, top - 1 - permutation_of(b[: E - 1]))
    else:  # "confident": the target at +top, the rest at (or just above) -top
        lead, rest = (top, np.full(E - 1, -top)) if ties else (top, -top + permutation_of(b[: E - 1]))
    return np.insert(rest.astype(float), target, lead)


@cached_strategy
def router_logits(n_tokens: int, n_experts: int, *, max_logit: float = 4.0, ties: bool = True,
                  patterns: Sequence[str] | None = None) -> SearchStrategy[np.ndarray]:
    """float64 router scores (n_tokens, n_experts): multiples of 1/8 in [-max_logit, max_logit], row by row a pattern.

    Bounded on purpose: the smallest kept gate is at least exp(-2·max_logit)/k, so with the default
    4 it stays far above float16's smallest subnormal (6e-8) and "exactly k gates are non-zero"
    holds in every dtype; logits of ±20 would underflow it. On the grid (max_logit <= 8) every value
    and every per-token shift by up to max_logit is exact in bfloat16, so ties stay ties.
    Row patterns: "zero" (every expert ties), "tied" (three values), "leaning" (near-uniform, the
    batch's favourite expert one step of 1/8 ahead), "confident" (one expert other than the
    favourite at +max_logit, the rest near -max_logit) and "spread" (anywhere on the grid).
    One draw in eight (where "zero" is allowed) is fully tied: every row zero. Leaning and
    confident rows together make the lopsided batches where the balance loss drops
    below 1; patterns=("leaning", "confident") draws only those. ties=False gives tie-free rows
    (each row's values distinct, at least 1/8 apart; no "zero" or "tied" rows) for laws that need
    a unique top-k set: it needs 2·⌊8·max_logit⌋ + 1 >= n_experts grid values.
    """
    _check_router_shape(n_tokens, n_experts)
    _check_max_logit(max_logit)
    if not isinstance(ties, bool):
        raise InvalidArgument(f"ties={ties!r} must be True or False")
    allowed = ROW_PATTERNS if ties else TIE_FREE_PATTERNS
    if patterns is None:
        patterns = allowed
    elif isinstance(patterns, str) or not patterns or any(p not in allowed for p in patterns):
        raise InvalidArgument(f"patterns={patterns!r} must be a non-empty tuple of names from {allowed!r}" + ("" if ties else " (ties=False)"))
    top = int(np.floor(max_logit / LOGIT_STEP))  # the largest grid value, in steps
    if not ties and 2 * top + 1 < n_experts:
        raise InvalidArgument(
            f"max_logit={max_logit!r} leaves {2 * top + 1} values on the grid of 1/8, fewer than n_experts={n_experts!r}: "
            "tie-free rows need one per expert; raise max_logit or pass ties=True"
        )
    others = max(n_experts - 2, 0)  # confident rows pick one of the other experts (any, with one expert)

    @st.composite
    def logits(draw):
        if "zero" in patterns and draw(integers(0, 7)) == 7:
            return np.zeros((n_tokens, n_experts))  # fully tied: every expert of every token (one draw in eight)
        rows = draw(st.lists(sampled_from(patterns), min_size=n_tokens, max_size=n_tokens))
        favourite = draw(integers(0, n_experts - 1))
        picks = draw(st.lists(integers(0, others), min_size=n_tokens, max_size=n_tokens))
        confident_of = [c + (c >= favourite and n_experts > 1) for c in picks]
        b = draw(byte_arrays((n_tokens, max(2 * top + 1, n_experts))))
        steps = [_row(b[i], p, n_experts, favourite if p == "leaning" else c, top, ties)
                 for i, (p, c) in enumerate(zip(rows, confident_of, strict=True))]
        return np.stack(steps) * LOGIT_STEP  # (N, E)

    return logits()


@cached_strategy
def masked_router_logits(n_tokens: int, n_experts: int, k: int, *, max_logit: float = 4.0) -> SearchStrategy[np.ndarray]:
    """router_logits (tie-free) with experts masked to -inf per token, as group-limited and capacity-limited routers leave them.

    Each token keeps m >= 1 finite scores: about half the tokens fewer than k (m in [1, k - 1], where a top-k must return the
    masked experts' -inf and no finite expert twice), the others m in [k, E]; the kept experts are a drawn subset, so expert 0
    (where a search that ties the chosen with the masked falls back to) is as often kept as masked. A token with no finite
    score has no gates (a softmax of all -inf) and is not drawn.
    """
    _check_router_shape(n_tokens, n_experts)
    check_int("k", k, low=1)
    check_order("k", k, "n_experts", n_experts)

    @st.composite
    def logits(draw):
        scores = draw(router_logits(n_tokens, n_experts, max_logit=max_logit, ties=False)).copy()  # (N, E)
        for row in scores:
            short = k > 1 and draw(st.booleans())  # fewer finite scores than k
            m = draw(integers(1, k - 1) if short else integers(k, n_experts))
            kept = permutation_of(draw(byte_arrays((n_experts,))))[:m]  # which experts keep their score
            row[np.setdiff1d(np.arange(n_experts), kept)] = -np.inf
        return scores

    return logits()


@cached_strategy
def uniform_mean_router_logits(n_experts: int, *, min_orbits: int = 1, max_orbits: int = 3, max_logit: float = 4.0) -> SearchStrategy[np.ndarray]:
    """Router scores (orbits·E, E) whose mean softmax probability is uniform: every cyclic shift of a few base rows.

    Each base row (from router_logits: ties, all-zero rows, leaning and confident rows alike)
    appears once per expert position, so each expert sees each probability exactly once per
    orbit: the mean probability is exactly 1/E in exact arithmetic. The rows are shuffled.
    """
    check_int("n_experts", n_experts, low=1)
    check_int_range("orbits", min_orbits, max_orbits, low=1)
    _check_max_logit(max_logit)

    @st.composite
    def logits(draw):
        orbits = draw(integers(min_orbits, max_orbits))
        base = draw(router_logits(orbits, n_experts, max_logit=max_logit))  # (orbits, E)
        rows = np.concatenate([np.roll(base, shift, axis=-1) for shift in range(n_experts)])  # (orbits·E, E)
        return rows[permutation_of(draw(byte_arrays((len(rows),))))]

    return logits()


@cached_strategy
def moe_tokens(n_tokens: int, d_model: int) -> SearchStrategy[np.ndarray]:
    """float64 moe inputs x (n_tokens, d_model): multiples of 1/4 in [-1, 1] (see moe_params for why a grid)."""
    check_int("n_tokens", n_tokens, low=1)
    check_int("d_model", d_model, low=1)
    _check_moe_width("d_model", d_model)
    most = round(MAX_TOKEN / TOKEN_STEP)  # 4 steps of 1/4
    return byte_arrays((n_tokens, d_model)).map(lambda b: small_ints(b, most) * TOKEN_STEP)


@cached_strategy
def moe_params(d_model: int, n_experts: int, *, d_ff: int | None = None, min_scale: float = 0.5, max_scale: float = 2.0,
               expert_ffn: str = "gelu") -> SearchStrategy[dict[str, Any]]:
    """{"router": (d, E), "experts": [{W1 (d, F), b1 (F,), W2 (F, d), b2 (d,)}] × E} for moe(x, router, experts, k).

    expert_ffn="swiglu" draws SwiGLU experts instead, [{W_gate (d, F), W_up (d, F), W_down (F, d)}] × E,
    without biases (Mixtral's), in the same way.

    The router's weights are multiples of 1/8 in [-1/2, 1/2]: with inputs from moe_tokens every
    product x·w is a multiple of 1/32 and every partial sum is at most d·1·1/2 <= 8 in size, so
    the router scores are exact in every dtype and summation order (d <= 16); one draw in eight has
    an all-zero router, so every token's scores tie fully. Each expert is a feed-forward network of
    width d_ff (default 4·d_model) with grid weights of std 1/√fan_in (to a power of two) times a
    scale per expert (min_scale, max_scale or 1 where it lies between), and biases of std 1/4 times that scale.
    """
    check_int("d_model", d_model, low=1)
    _check_moe_width("d_model", d_model)
    check_int("n_experts", n_experts, low=1)
    F = 4 * d_model if d_ff is None else d_ff
    check_int("d_ff", F, low=1)
    check_float("min_scale", min_scale, positive=True)
    check_float("max_scale", max_scale, positive=True)
    check_order("min_scale", min_scale, "max_scale", max_scale)
    check_choice("expert_ffn", expert_ffn, EXPERT_FFNS)
    most = round(MAX_ROUTER / ROUTER_STEP)  # 4 steps of 1/8
    return _moe_params(d_model, n_experts, F, float(min_scale), float(max_scale), most, expert_ffn)


@cache
def _moe_params(d, E, F, min_scale, max_scale, most, expert_ffn):
    w1, w2 = nearest_power_of_two(1 / np.sqrt(d)), nearest_power_of_two(1 / np.sqrt(F))
    choices = np.unique(np.clip([1.0, min_scale, max_scale], min_scale, max_scale))  # an expert's scale: 1 (the simplest) or a bound

    def gelu_expert(scale, W1, b1, W2, b2):
        return {
            "W1": scale * GRID[W1] * w1,  # (d, F)
            "b1": 0.25 * scale * GRID[b1],  # (F,)
            "W2": scale * GRID[W2] * w2,  # (F, d)
            "b2": 0.25 * scale * GRID[b2],  # (d,)
        }

    def swiglu_expert(scale, W_gate, W_up, W_down):
        return {"W_gate": scale * GRID[W_gate] * w1, "W_up": scale * GRID[W_up] * w1, "W_down": scale * GRID[W_down] * w2}  # (d, F) ×2, (F, d)

    def build(router, zero_router, scales, *weights):
        router = np.zeros((d, E)) if zero_router == 7 else small_ints(router, most) * ROUTER_STEP  # (d, E); all zero: every score ties
        expert = gelu_expert if expert_ffn == "gelu" else swiglu_expert
        return {"router": router, "experts": [expert(choices[scales[e] % len(choices)], *(w[e] for w in weights)) for e in range(E)]}

    if expert_ffn == "gelu":
        weights = byte_arrays((E, d, F)), byte_arrays((E, F)), byte_arrays((E, F, d)), byte_arrays((E, d))  # W1, b1, W2, b2
    else:
        weights = byte_arrays((E, d, F)), byte_arrays((E, d, F)), byte_arrays((E, F, d))  # W_gate, W_up, W_down
    return st.builds(build, byte_arrays((d, E)), integers(0, 7), byte_arrays((E,)), *weights)
