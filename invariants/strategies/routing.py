"""Inputs for MoE routing as shipped: DeepSeek-V3's grouped router (shapes, balancing biases), Qwen3-MoE's softmax router and
the auxiliary-loss-free bias update.

Router logits come from strategies/moe.py's router_logits (multiples of 1/8, ties, all-zero rows, lopsided rows), so a
softmax router sees exact scores whose order is the same in every dtype. A sigmoid router's biased scores σ(r) + b are not
on a grid: distinct ones may round into a tie, so the laws of grouped_top_k_gates accept any choice that is best to the
dtype's rounding. Values are read from drawn bytes (strategies/core.py) and shrink towards zero logits, a zero bias, one
group and k = 1.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
from hypothesis import strategies as st
from hypothesis.strategies import SearchStrategy

from invariants.strategies._validation import check_int, check_int_range
from invariants.strategies.core import byte_arrays, cached_strategy, integers, sampled_from, small_ints
from invariants.strategies.moe import masked_router_logits, moe_shapes, router_logits

__all__ = [
    "GroupedRoutingShape", "bias_update_inputs", "grouped_routing_inputs", "grouped_routing_shapes", "routing_biases", "softmax_routing_inputs",
]

BIAS_STEP, MAX_BIAS = 1 / 4, 2.0  # balancing biases: multiples of 1/4 in [-2, 2], the size of σ's whole range and more
BIAS_PATTERNS = ("zero", "tied", "spread")  # no bias (plain sigmoid top-k), one value for every expert (it cancels), any
SCALING_FACTORS = (1.0, 2.5, 2.827)  # routed_scaling_factor: none, DeepSeek-V3's (and R1's), Kimi K2's
BIAS_RATES = (2**-10, 0.001, 2**-3)  # the bias update speed γ: DeepSeek-V3 trains with 0.001
MAX_LOAD = 16  # tokens_per_expert draws loads of 0 to 16 tokens per expert


@dataclass(frozen=True)
class GroupedRoutingShape:
    """N tokens routed to k of E = n_group · group_size experts, within topk_group of the n_group groups."""

    tokens: int
    experts: int
    n_group: int
    topk_group: int
    k: int

    @property
    def group_size(self):
        return self.experts // self.n_group


def _edges(low, high):
    """An int in [low, high]: low, high or between, a third each."""
    return st.one_of(st.just(low), st.just(high), integers(low, high))


@cached_strategy
def grouped_routing_shapes(*, min_tokens: int = 1, max_tokens: int = 6, max_groups: int = 4,
                           max_group_size: int = 4) -> SearchStrategy[GroupedRoutingShape]:
    """GroupedRoutingShape with 1 <= topk_group <= n_group, 2 <= group_size and 1 <= k <= topk_group · group_size, valid by
    construction: every group has the two experts its score sums, and the kept groups hold at least k experts.

    topk_group and k come as their smallest value, their largest or between, a third each (k = topk_group · group_size chooses
    every expert of the kept groups; topk_group = n_group keeps every group, the plain top-k).
    """
    check_int_range("tokens", min_tokens, max_tokens, low=1)
    check_int("max_groups", max_groups, low=1)
    check_int("max_group_size", max_group_size, low=2)

    @st.composite
    def shapes(draw):
        n_group, group_size = draw(integers(1, max_groups)), draw(integers(2, max_group_size))
        topk_group = draw(_edges(1, n_group))
        k = draw(_edges(1, topk_group * group_size))
        return GroupedRoutingShape(draw(integers(min_tokens, max_tokens)), n_group * group_size, n_group, topk_group, k)

    return shapes()


@cached_strategy
def routing_biases(n_experts: int) -> SearchStrategy[np.ndarray]:
    """float64 balancing biases (E,): multiples of 1/4 in [-2, 2], all zero, all one value, or spread (a pattern each).

    A bias of -1 or less puts a biased score σ(r) + b below 0, where a masked expert scored 0 instead of -inf would win.
    """
    check_int("n_experts", n_experts, low=1)
    top = round(MAX_BIAS / BIAS_STEP)

    def build(pattern, b):
        steps = {"zero": np.zeros(n_experts), "tied": np.full(n_experts, small_ints(b[:1], top)[0]), "spread": small_ints(b, top)}[pattern]
        return steps.astype(float) * BIAS_STEP

    return st.builds(build, sampled_from(BIAS_PATTERNS), byte_arrays((n_experts,)))


@cached_strategy
def grouped_routing_inputs(shapes: SearchStrategy[GroupedRoutingShape] | None = None) -> SearchStrategy[dict[str, Any]]:
    """{router_logits (N, E), bias (E,), k, n_group, topk_group, norm_topk_prob, routed_scaling_factor}: one call of
    grouped_top_k_gates, in its protocol order, on a shape from `shapes` (grouped_routing_shapes() by default)."""
    shapes = grouped_routing_shapes() if shapes is None else shapes

    @st.composite
    def inputs(draw):
        shape = draw(shapes)
        return {"router_logits": draw(router_logits(shape.tokens, shape.experts)), "bias": draw(routing_biases(shape.experts)),
                "k": shape.k, "n_group": shape.n_group, "topk_group": shape.topk_group, "norm_topk_prob": draw(st.booleans()),
                "routed_scaling_factor": draw(sampled_from(SCALING_FACTORS))}

    return inputs()


@cached_strategy
def softmax_routing_inputs(*, ties: bool = True, masked: bool = False, max_tokens: int = 8,
                           max_experts: int = 8) -> SearchStrategy[dict[str, Any]]:
    """{router_logits (N, E), k, norm_topk_prob}: one call of softmax_top_k_gates; ties=False draws tie-free rows, masked=True
    tie-free rows with experts masked to -inf and k >= 2, some tokens keeping fewer than k finite scores (masked_router_logits)."""

    @st.composite
    def inputs(draw):
        shape = draw(moe_shapes(max_tokens=max_tokens, max_experts=max_experts, min_k=2 if masked else 1))
        logits = masked_router_logits(shape.tokens, shape.experts, shape.k) if masked else router_logits(shape.tokens, shape.experts, ties=ties)
        return {"router_logits": draw(logits), "k": shape.k, "norm_topk_prob": draw(st.booleans())}

    return inputs()


@cached_strategy
def bias_update_inputs(*, max_experts: int = 8) -> SearchStrategy[dict[str, Any]]:
    """{bias (E,), tokens_per_expert (E,) int, rate}: one call of expert_bias_update. The loads are 0 to 16 tokens per expert,
    all equal one draw in four (every expert at the mean: no change), so that loads at, above and below the mean all come."""
    check_int("max_experts", max_experts, low=1)

    @st.composite
    def inputs(draw):
        E = draw(integers(1, max_experts))
        loads = draw(byte_arrays((E,))).astype(np.int64) % (MAX_LOAD + 1)
        if draw(integers(0, 3)) == 3:
            loads = np.full(E, loads[0])
        return {"bias": draw(routing_biases(E)), "tokens_per_expert": loads, "rate": draw(sampled_from(BIAS_RATES))}

    return inputs()
