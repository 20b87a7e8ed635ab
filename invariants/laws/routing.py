"""Invariants of MoE routing as shipped: DeepSeek-V3's grouped sigmoid router and its balancing bias, Qwen3-MoE's softmax router.

Mixtral's and gpt-oss's router (top-k on the logits, then a softmax over the chosen) is top_k_gates, whose laws are in
moe.py; here softmax_top_k_gates with norm_topk_prob is held equal to it. The gate sums, stated for each router: 1 for a
normalised softmax router, at most 1 for an unnormalised one, routed_scaling_factor for DeepSeek-V3's normalised sigmoid
gates. A softmax router's gates do not change when every logit of a token moves by the same constant; a sigmoid router's
do (grouped_top_k_gates_known_values pins σ). The sources: the DeepSeek-V3 report (§2.1.2), DeepSeek-V3's inference code,
transformers' modeling_deepseek_v3.py and modeling_qwen3_moe.py; invariants/reference/numpy.py cites them.

A sigmoid router's biased scores σ(r) + b are not on a grid, so two of them that differ in float64 may tie once rounded:
the laws of grouped_top_k_gates accept any choice that is best to the rounding of the implementation's dtype, and hold the
gates' values to the reference on the experts the implementation chose.
"""

from __future__ import annotations

import numpy as np
from hypothesis import strategies as st

import invariants.reference.numpy as ref
from invariants.asserts import assert_close, assert_shape, assert_where
from invariants.conventions import declared
from invariants.inputs import valid_inputs
from invariants.laws.reference_check import assert_agrees_with_reference, reference_tolerance
from invariants.protocol import FUNCTIONS
from invariants.registry import invariant
from invariants.strategies.core import integers
from invariants.strategies.moe import LOGIT_STEP
from invariants.strategies.routing import (
    bias_update_inputs,
    grouped_routing_inputs,
    grouped_routing_shapes,
    softmax_routing_inputs,
)

LESSON = 83  # where a lesson meets this component: the registry's order (test ids, the kill matrix's first failure)
HOLDS = ("grouped_top_k_gates", "softmax_top_k_gates", "expert_bias_update")  # the protocol functions whose laws it holds

FORCING_BIAS = 2.0  # σ ∈ (0, 1): a bias of +2 on a set of experts and -2 on the rest makes that set the choice, groups included


def _args(name, inputs, **changes):
    """The positional arguments of protocol function `name` from a dict of drawn inputs, with `changes` swapped in."""
    return FUNCTIONS[name].arguments_of({**inputs, **changes})


def _grouped_call(inputs, note=""):
    return FUNCTIONS["grouped_top_k_gates"].describe(inputs, note.strip())


def _grouped_gates(impl, inputs, call, **changes):
    """impl's grouped_top_k_gates on `inputs` (with `changes`), as float64 (N, E)."""
    args = _args("grouped_top_k_gates", inputs, **changes)
    return assert_shape(impl.grouped_top_k_gates(*args), args[0].shape, "grouped_top_k_gates(...)", call).astype(np.float64)


def _choice_scores(impl, inputs):
    """The float64 biased scores σ(r) + b (N, E) and group scores (N, G) of the values impl receives."""
    choice = ref.sigmoid(impl.as_seen(inputs["router_logits"])) + impl.as_seen(inputs["bias"])
    return choice, ref.group_scores(choice, inputs["n_group"])


def _slack(impl, inputs):
    """How far apart two biased or group scores may be and still tie once rounded to impl's dtype: a few roundings of a group score."""
    size = 2 * (1 + float(np.abs(impl.as_seen(inputs["bias"])).max(initial=0.0)))  # |σ + b| summed over a group's top two
    return 4 * impl.tolerance.at_scale(size).atol


def _kth_largest(values, k):
    """(N,) the k-th largest of each row (k >= 1); -inf where a row has fewer than k values."""
    ordered = -np.sort(-values, axis=-1)
    return ordered[:, k - 1] if k <= values.shape[-1] else np.full(len(values), -np.inf)


def _grouped_reference_on(impl, inputs, chosen):
    """The reference's gates on the experts `chosen` (N, E bool): their σ(r), normalised where norm_topk_prob, times the scaling."""
    affinity = np.where(chosen, ref.sigmoid(impl.as_seen(inputs["router_logits"])), 0.0)  # (N, E)
    if inputs["norm_topk_prob"]:
        affinity = affinity / np.maximum(affinity.sum(axis=-1, keepdims=True), np.finfo(np.float64).tiny)
    return affinity * inputs["routed_scaling_factor"]


@valid_inputs("grouped_top_k_gates")
def grouped_top_k_gates_arguments(impl, case):
    """Router logits (N, E), a balancing bias, group shapes with at least two experts a group, either norm_topk_prob, a scaling."""
    inputs = case.draw(grouped_routing_inputs(grouped_routing_shapes(max_tokens=4, max_groups=3, max_group_size=3)), "grouped router call")
    return _args("grouped_top_k_gates", inputs)


@valid_inputs("softmax_top_k_gates")
def softmax_top_k_gates_arguments(impl, case):
    """Router logits (N, E) of moderate values, a k from 1 to E and either norm_topk_prob."""
    return _args("softmax_top_k_gates", case.draw(softmax_routing_inputs(max_tokens=4, max_experts=4), "softmax router call"))


@valid_inputs("expert_bias_update")
def expert_bias_update_arguments(impl, case):
    """A bias (E,), loads of 0 to 16 tokens per expert and an update rate."""
    return _args("expert_bias_update", case.draw(bias_update_inputs(max_experts=4), "bias update"))


# ---------------------------------------------------------------------------
# DeepSeek-V3's router: grouped_top_k_gates
# ---------------------------------------------------------------------------


@invariant(
    requires=("grouped_top_k_gates",),
    hint=(
        "the gates are not the chosen affinities normalised and scaled: routed_scaling_factor is left out (or applied twice), "
        "or norm_topk_prob is ignored (torchtitan#1448: DeepSeek-V3's top-k weights never normalised)"
    ),
)
def grouped_top_k_gates_sum(impl, case):
    """Each token's gates are >= 0 and sum to routed_scaling_factor where norm_topk_prob; otherwise each is at most routed_scaling_factor."""
    inputs = case.draw(grouped_routing_inputs(), "grouped router call")
    call = _grouped_call(inputs)
    g = _grouped_gates(impl, inputs, call)
    scale = inputs["routed_scaling_factor"]
    assert_where(g >= 0, g, "grouped_top_k_gates(...)", ">= 0", call)
    if inputs["norm_topk_prob"]:
        assert_close(g.sum(axis=-1), scale, "sum of each token's gates", impl.tolerance.at_scale(scale), call)
    else:
        tol = impl.tolerance.at_scale(scale)
        assert_where(g <= scale + tol.atol, g, "grouped_top_k_gates(...) with norm_topk_prob=False",
                     f"<= routed_scaling_factor = {scale} (σ < 1)", call)


@invariant(
    requires=("grouped_top_k_gates",),
    hint="top-k returns fewer than k distinct experts (an index repeated, or a chosen expert gated 0), or more than k",
)
def grouped_top_k_gates_choose_k(impl, case):
    """Exactly k of each token's gates are non-zero (every affinity σ(r) is positive)."""
    inputs = case.draw(grouped_routing_inputs(), "grouped router call")
    call = _grouped_call(inputs)
    chosen = (_grouped_gates(impl, inputs, call) != 0).sum(axis=-1)
    assert_where(chosen == inputs["k"], chosen, "number of non-zero gates per token", f"exactly k={inputs['k']}", call)


@invariant(
    requires=("grouped_top_k_gates",),
    hint=(
        "the group limit is broken: a group is scored by its largest biased score instead of the sum of its top two, or the "
        "experts of dropped groups are masked with 0 instead of -inf, so one beats a kept expert whose σ(r) + b is negative "
        "(both vllm#13474); or the groups are not consecutive experts, or not limited at all"
    ),
)
def grouped_top_k_gates_within_top_groups(impl, case):
    """The chosen experts lie in at most topk_group groups, each among the topk_group best by the sum of its two largest
    biased scores σ(r) + b (any of them where group scores tie to rounding)."""
    inputs = case.draw(grouped_routing_inputs(), "grouped router call")
    call = _grouped_call(inputs)
    chosen = _grouped_gates(impl, inputs, call) != 0  # (N, E)
    N, E = chosen.shape
    G, kept = inputs["n_group"], inputs["topk_group"]
    groups_used = chosen.reshape(N, G, E // G).any(axis=-1)  # (N, G)
    assert_where(groups_used.sum(axis=-1) <= kept, groups_used.sum(axis=-1), "number of groups a token's chosen experts lie in",
                 f"<= topk_group={kept}", call)
    _, group = _choice_scores(impl, inputs)  # (N, G)
    worst_used = np.where(groups_used, group, np.inf).min(axis=-1)  # (N,)
    threshold = _kth_largest(group, kept)  # (N,): the score a kept group needs
    assert_where(worst_used >= threshold - _slack(impl, inputs), worst_used,
                 "lowest group score (sum of its two largest σ(r) + b) among the groups a token's experts were chosen from",
                 f"at least the {kept}-th best group score (one of the topk_group best groups)", call)


@invariant(
    requires=("grouped_top_k_gates",),
    hint=(
        "the choice is not the top k of σ(r) + b within the kept groups: the bias is left out of the choice (DeepSeek-V3 run "
        "on an older unbiased path: NVIDIA/TensorRT-Model-Connect#669), or the choice is made on a softmax's probabilities plus the bias"
    ),
)
def grouped_top_k_gates_choose_top_biased(impl, case):
    """Within the groups it keeps, a token's chosen experts have the largest biased scores σ(r) + b (any of them where
    scores tie to rounding): no expert left out of a kept group scores above a chosen one."""
    inputs = case.draw(grouped_routing_inputs(), "grouped router call")
    call = _grouped_call(inputs)
    chosen = _grouped_gates(impl, inputs, call) != 0  # (N, E)
    N, E = chosen.shape
    G, size = inputs["n_group"], E // inputs["n_group"]
    choice, group = _choice_scores(impl, inputs)
    slack = _slack(impl, inputs)
    # kept for sure: the groups the chosen experts lie in, and those above the (topk_group + 1)-th best group score
    certain = chosen.reshape(N, G, size).any(axis=-1) | (group > _kth_largest(group, inputs["topk_group"] + 1)[:, None] + slack)  # (N, G)
    pool = np.repeat(certain, size, axis=-1)  # (N, E)
    lowest_chosen = np.where(chosen, choice, np.inf).min(axis=-1)  # (N,)
    highest_left = np.where(pool & ~chosen, choice, -np.inf).max(axis=-1)  # (N,)
    assert_where(lowest_chosen >= highest_left - slack, lowest_chosen, "lowest biased score σ(r) + b among a token's chosen experts",
                 "at least every biased score left out in a kept group", call)


@invariant(
    requires=("grouped_top_k_gates",),
    hint=(
        "the bias enters the gating values: they are read from σ(r) + b, not σ(r) (transformers#41647, which undid "
        "transformers#40132; vllm#12002), so moving the bias changes the weights of experts that stay chosen"
    ),
)
def grouped_top_k_gates_bias_steers_choice_only(impl, case):
    """The bias changes which experts are chosen, never their gates: a bias that forces the same chosen set (+2 on it, -2
    elsewhere) gives the same gates."""
    inputs = case.draw(grouped_routing_inputs(), "grouped router call")
    call = _grouped_call(inputs, " vs the same with a bias of +2 on the chosen experts and -2 elsewhere")
    g = _grouped_gates(impl, inputs, call)
    forcing = np.where(g != 0, FORCING_BIAS, -FORCING_BIAS)  # (N, E): one bias per token, so one call per token
    forced = np.concatenate([_grouped_gates(impl, inputs, call, router_logits=inputs["router_logits"][i : i + 1], bias=forcing[i])
                             for i in range(len(g))])
    assert_close(forced, g, "grouped_top_k_gates(router_logits, forcing bias)", impl.tolerance.at_scale(inputs["routed_scaling_factor"]), call)


@invariant(
    requires=("grouped_top_k_gates",),
    hint=(
        "the gates differ from the chosen affinities σ(r) (no bias), normalised where norm_topk_prob, times "
        "routed_scaling_factor: a softmax in place of the sigmoid, the bias in the weights (transformers#40132), the scaling "
        "left out where norm_topk_prob is False (sglang-jax#1282) or applied twice (vllm#24119)"
    ),
)
def grouped_top_k_gates_agrees_with_reference(impl, case):
    """On the experts it chose, grouped_top_k_gates agrees with the float64 reference: σ(r), divided by their sum where
    norm_topk_prob, times routed_scaling_factor (which experts is the other laws' business)."""
    inputs = case.draw(grouped_routing_inputs(), "grouped router call")
    call = _grouped_call(inputs)
    g = _grouped_gates(impl, inputs, call)
    tol = reference_tolerance(impl).at_scale(inputs["routed_scaling_factor"])
    assert_close(g, _grouped_reference_on(impl, inputs, g != 0), "grouped_top_k_gates(...)", tol, call)


KNOWN_GROUPED = (  # (router_logits, bias, k, n_group, topk_group, norm_topk_prob, routed_scaling_factor), what it shows
    (((2.0, 1.0, 0.5, -1.0),), (0.0, 0.0, 0.0, 0.0), 2, 1, 1, False, 1.0, "σ(2), σ(1): sigmoid affinities, not a softmax"),
    (((2.0, 1.0, 0.5, -1.0),), (0.0, 0.0, 0.0, 1.0), 2, 1, 1, True, 1.0, "experts 3 and 0 gated σ(-1), σ(2) normalised: the bias chose, σ weighs"),
    (((1.0, -1.0, 0.5, 0.5),), (0.0, 0.0, 0.0, 0.0), 2, 2, 1, True, 2.5, "group 1 (σ(.5) + σ(.5) = 1.245 > σ(1) + σ(-1) = 1): 1.25 each"),
)


@invariant(
    requires=("grouped_top_k_gates",),
    hint=(
        "r = (2, 1, 0.5, -1), k = 2 gives (0.881, 0.731, 0, 0): σ, not a softmax (0.731, 0.269); a bias of +1 on expert 3 "
        "chooses experts 0 and 3 gated (0.766, 0, 0, 0.234), not by σ + b; r = (1, -1, 0.5, 0.5) in two groups keeps group 1 "
        "(a group scored by its maximum keeps group 0)"
    ),
)
def grouped_top_k_gates_known_values(impl, case):
    """grouped_top_k_gates on three small rows: sigmoid affinities, the bias in the choice only, a group scored by its top two."""
    for logits, bias, k, n_group, topk_group, norm, scale, shows in KNOWN_GROUPED:
        inputs = {"router_logits": np.array(logits), "bias": np.array(bias), "k": k, "n_group": n_group, "topk_group": topk_group,
                  "norm_topk_prob": norm, "routed_scaling_factor": scale}
        call = _grouped_call(inputs, f" on {list(logits[0])} with bias {list(bias)}: {shows}")
        expected = ref.grouped_top_k_gates(*_args("grouped_top_k_gates", inputs))
        assert_close(_grouped_gates(impl, inputs, call), expected, "grouped_top_k_gates(...)", impl.tolerance.at_scale(scale), call)


# ---------------------------------------------------------------------------
# Qwen3-MoE's router: softmax_top_k_gates
# ---------------------------------------------------------------------------


def _follows_tie_rule(impl):
    return declared(impl, "TOP_K_TIES") != "any"


def _softmax_call(inputs, note=""):
    return FUNCTIONS["softmax_top_k_gates"].describe(inputs, note.strip())


def _softmax_gates(impl, inputs, call, **changes):
    args = _args("softmax_top_k_gates", inputs, **changes)
    return assert_shape(impl.softmax_top_k_gates(*args), args[0].shape, "softmax_top_k_gates(...)", call).astype(np.float64)


@invariant(
    requires=("softmax_top_k_gates",),
    hint="norm_topk_prob is ignored: the kept probabilities are not divided by their sum where it is True (Qwen2-MoE's setting in a Qwen3-MoE port)",
)
def softmax_top_k_gates_sum(impl, case):
    """Each token's gates are >= 0 and sum to 1 where norm_topk_prob, to at most 1 otherwise."""
    inputs = case.draw(softmax_routing_inputs(), "softmax router call")
    call = _softmax_call(inputs)
    g = _softmax_gates(impl, inputs, call)
    assert_where(g >= 0, g, "softmax_top_k_gates(...)", ">= 0", call)
    total = g.sum(axis=-1)
    if inputs["norm_topk_prob"]:
        assert_close(total, 1.0, "sum of each token's gates", impl.tolerance.at_scale(1.0), call)
    else:
        assert_where(total <= 1 + impl.tolerance.at_scale(1.0).atol, total, "sum of each token's gates (norm_topk_prob=False)", "<= 1", call)


@invariant(
    requires=("softmax_top_k_gates",),
    hint=(
        "with norm_topk_prob=False the gates are not the kept experts' softmax probabilities over all E experts: the raw "
        "logits (sglang#35160), or probabilities renormalised over the kept ones anyway (QwenLM/Qwen3#687: Qwen2-MoE "
        "weights converted from Megatron, which renormalises)"
    ),
)
def softmax_top_k_gates_unnormalised_are_probabilities(impl, case):
    """With norm_topk_prob=False each non-zero gate is its expert's softmax probability over all E experts."""
    inputs = case.draw(softmax_routing_inputs(), "softmax router call")
    inputs["norm_topk_prob"] = False
    call = _softmax_call(inputs)
    g = _softmax_gates(impl, inputs, call)
    expected = np.where(g != 0, ref.softmax(impl.as_seen(inputs["router_logits"])), 0.0)  # (N, E)
    assert_close(g, expected, "softmax_top_k_gates(..., norm_topk_prob=False)", impl.tolerance, call)


@invariant(
    requires=("softmax_top_k_gates",),
    hint="the router keeps the wrong experts (an ascending sort, dropped experts masked with 0), or fewer or more than k",
)
def softmax_top_k_gates_select_top_k(impl, case):
    """Exactly k of each token's gates are non-zero, at k of its largest logits (any of them where logits tie)."""
    inputs = case.draw(softmax_routing_inputs(), "softmax router call")
    call = _softmax_call(inputs)
    kept = _softmax_gates(impl, inputs, call) != 0  # (N, E)
    scores = impl.as_seen(inputs["router_logits"])  # on the grid: exactly the drawn logits
    assert_where(kept.sum(axis=-1) == inputs["k"], kept.sum(axis=-1), "number of non-zero gates per token", f"exactly k={inputs['k']}", call)
    lowest_kept = np.where(kept, scores, np.inf).min(axis=-1)
    highest_dropped = np.where(kept, -np.inf, scores).max(axis=-1)
    assert_where(lowest_kept >= highest_dropped, lowest_kept, "lowest logit with a non-zero gate, per token",
                 "at least every dropped expert's logit", call)


@invariant(
    requires=("softmax_top_k_gates",),
    hint="the gates depend on the logits' absolute size: a sigmoid in place of the softmax, or logits divided by their sum",
)
def softmax_top_k_gates_shift_invariance(impl, case):
    """Adding a constant to every logit of a token leaves its gates unchanged (a softmax router; a sigmoid router's would change)."""
    inputs = case.draw(softmax_routing_inputs(ties=_follows_tie_rule(impl)), "softmax router call")
    logits = inputs["router_logits"]
    steps = case.draw(st.lists(integers(-32, 32), min_size=len(logits), max_size=len(logits)), "shift per token (units of 1/8)")
    shifted = logits + np.array(steps, dtype=float)[:, None] * LOGIT_STEP  # (N, E), still on the grid
    call = _softmax_call(inputs, " with router_logits + c vs without")
    assert_close(_softmax_gates(impl, inputs, call, router_logits=shifted), _softmax_gates(impl, inputs, call),
                 "softmax_top_k_gates(router_logits + c, ...)", impl.tolerance, call)


@invariant(
    requires=("softmax_top_k_gates", "top_k_gates"),
    hint=(
        "softmax then top-k then renormalise (Qwen3-MoE, transformers' Mixtral) must equal top-k then a softmax over the "
        "chosen (gpt-oss, the protocol's top_k_gates): one of the two is not a softmax over the kept scores"
    ),
)
def softmax_top_k_gates_normalised_is_top_k_gates(impl, case):
    """With norm_topk_prob, softmax_top_k_gates equals top_k_gates: renormalising the kept probabilities is a softmax over the kept logits."""
    inputs = case.draw(softmax_routing_inputs(ties=_follows_tie_rule(impl)), "softmax router call")  # one tie rule for both, or no ties
    inputs["norm_topk_prob"] = True
    call = _softmax_call(inputs, f" vs top_k_gates(router_logits, k={inputs['k']})")
    expected = impl.top_k_gates(inputs["router_logits"], inputs["k"]).astype(np.float64)
    assert_close(_softmax_gates(impl, inputs, call), expected, "softmax_top_k_gates(..., norm_topk_prob=True)", impl.tolerance, call)


@invariant(
    requires=("softmax_top_k_gates",),
    hint="a convention differs from the reference's: softmax over all experts, the k largest kept (ties to the lower index), renormalised "
    "where norm_topk_prob",
)
def softmax_top_k_gates_agrees_with_reference(impl, case):
    """softmax_top_k_gates agrees with the float64 reference (to 1e-10 in float64, the dtype tolerance otherwise)."""
    inputs = case.draw(softmax_routing_inputs(ties=_follows_tie_rule(impl)), "softmax router call")  # TOP_K_TIES = "any": tie-free
    args = _args("softmax_top_k_gates", inputs)
    assert_agrees_with_reference(impl, "softmax_top_k_gates", args, impl.softmax_top_k_gates(*args), "softmax_top_k_gates(...)",
                                 call=_softmax_call(inputs))


@invariant(
    requires=("softmax_top_k_gates",),
    hint="a token with fewer than k finite router scores has a kept expert twice: an iterative top-k that excludes the chosen "
    "expert by setting its score to -inf picks one again once only -inf is left (vllm-project/vllm-omni#7175), and the "
    "renormalised gates halve; or a masked expert gets a gate",
)
def softmax_top_k_gates_masked_experts(impl, case):
    """With experts masked to -inf, a token's gates are its softmax probabilities (0 at the masked experts) at its k largest finite
    scores, or at all m of them where m < k (divided by their sum where norm_topk_prob), and 0 at every masked expert: the top-k
    returns k distinct experts, so none is kept twice. Tie-free scores, m >= 1."""
    inputs = case.draw(softmax_routing_inputs(masked=True), "softmax router call (-inf: masked experts)")
    call = _softmax_call(inputs, f"with {int(np.isinf(inputs['router_logits']).sum())} experts masked to -inf")
    args = _args("softmax_top_k_gates", inputs)
    g = _softmax_gates(impl, inputs, call)
    assert_close(np.where(np.isfinite(inputs["router_logits"]), 0.0, g), np.zeros_like(g), "gates of the masked (-inf) experts",
                 impl.tolerance, call)
    assert_agrees_with_reference(impl, "softmax_top_k_gates", args, g, "softmax_top_k_gates(...) (the min(k, m) largest finite kept)",
                                 call=call)


# ---------------------------------------------------------------------------
# The auxiliary-loss-free bias update: expert_bias_update
# ---------------------------------------------------------------------------


def _bias_call(inputs, note=""):
    return FUNCTIONS["expert_bias_update"].describe(inputs, note.strip())


def _updated(impl, inputs, call, **changes):
    args = _args("expert_bias_update", inputs, **changes)
    return assert_shape(impl.expert_bias_update(*args), args[0].shape, "expert_bias_update(...)", call).astype(np.float64)


@invariant(
    requires=("expert_bias_update",),
    hint=(
        "the update has the wrong sign or size: an overloaded expert's bias must go down by the rate and an underloaded one's "
        "up (DeepSeek-V3 §2.1.2: sign(mean - load), not sign(load - mean)), unchanged at the mean load, by exactly the rate"
    ),
)
def expert_bias_update_moves_against_load(impl, case):
    """An expert with more than the mean load has its bias lowered by exactly `rate`, one with less raised by `rate`, one at the mean unchanged."""
    inputs = case.draw(bias_update_inputs(), "bias update")
    call = _bias_call(inputs)
    loads = inputs["tokens_per_expert"]
    bias = impl.as_seen(inputs["bias"])
    direction = np.sign(loads.sum() - loads * loads.size)  # sign(mean - load), exact
    tol = impl.tolerance.at_scale(float(np.abs(bias).max()) + inputs["rate"])
    assert_close(_updated(impl, inputs, call) - bias, direction * inputs["rate"], "expert_bias_update(...) - bias", tol, call)


@invariant(
    requires=("expert_bias_update",),
    hint="the update depends on the loads' size, not on which side of the mean each lies: it is proportional to mean - load, not its sign",
)
def expert_bias_update_relative_load(impl, case):
    """Multiplying every expert's load by the same positive integer leaves the update unchanged: only above or below the mean counts."""
    inputs = case.draw(bias_update_inputs(), "bias update")
    factor = case.draw(integers(2, 8), "load factor")
    call = _bias_call(inputs, f" vs the same with every load × {factor}")
    expected = _updated(impl, inputs, call)
    assert_close(_updated(impl, inputs, call, tokens_per_expert=inputs["tokens_per_expert"] * factor), expected,
                 "expert_bias_update(bias, tokens_per_expert × c, rate)", impl.tolerance, call)
