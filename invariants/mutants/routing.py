"""Broken MoE routing as shipped: each a bug that reached a release of transformers, vLLM, SGLang or torchtitan (cited)."""

import numpy as np

from invariants.mutants import mutant
from invariants.mutants.moe import _routes_by_repeated_max
from invariants.reference.numpy import group_scores, grouped_top_k_indices, sigmoid, softmax, top_k_indices


def _gates_at(router_logits, top, weights):
    gates = np.zeros_like(router_logits)
    np.put_along_axis(gates, top, weights, axis=-1)
    return gates


@mutant(
    also_named_by=("routing.grouped_top_k_gates_agrees_with_reference", "routing.grouped_top_k_gates_known_values"),
    replaces="grouped_top_k_gates",
    killed_by="routing.grouped_top_k_gates_bias_steers_choice_only",
    bug="the gating values read from the biased scores σ(r) + b (transformers#40132, fixed by transformers#41647; vllm#11971)",
)
def biased_weights_grouped_top_k_gates(router_logits, bias, k, n_group, topk_group, norm_topk_prob, routed_scaling_factor):
    top = grouped_top_k_indices(router_logits, bias, k, n_group, topk_group)  # (N, k)
    weights = np.take_along_axis(sigmoid(router_logits) + bias, top, axis=-1)  # BUG: the bias in the weights
    if norm_topk_prob:
        weights = weights / weights.sum(axis=-1, keepdims=True)
    return _gates_at(router_logits, top, weights * routed_scaling_factor)


@mutant(
    also_named_by=("routing.grouped_top_k_gates_known_values",),
    replaces="group_scores",
    killed_by="routing.grouped_top_k_gates_within_top_groups",
    bug="a group scored by its largest biased score, not the sum of its top two (vllm#13474)",
)
def max_group_scores(choice_scores, n_group):
    N, E = choice_scores.shape
    return choice_scores.reshape(N, n_group, E // n_group).max(axis=-1)


@mutant(
    replaces="grouped_top_k_indices",
    killed_by="routing.grouped_top_k_gates_within_top_groups",
    bug="the experts of dropped groups masked with 0, not -inf: one beats a kept expert whose σ(r) + b is negative (vllm#13474)",
)
def zero_masked_grouped_top_k_indices(router_logits, bias, k, n_group, topk_group):
    N, E = router_logits.shape
    choice = sigmoid(router_logits) + bias
    grouped = choice.reshape(N, n_group, E // n_group)
    group = -np.sort(-grouped, axis=-1)[..., :2].sum(axis=-1)  # (N, G)
    kept = np.zeros((N, n_group), dtype=bool)
    np.put_along_axis(kept, top_k_indices(group, topk_group), True, axis=-1)
    return top_k_indices(np.where(np.repeat(kept, E // n_group, axis=-1), choice, 0.0), k)  # BUG: 0.0, not -inf


@mutant(
    replaces="grouped_top_k_indices",
    killed_by="routing.grouped_top_k_gates_choose_top_biased",
    bug="the choice made on σ(r) without the balancing bias: DeepSeek-V3 run on the older unbiased path (NVIDIA/TensorRT-Model-Connect#669)",
)
def unbiased_choice_grouped_top_k_indices(router_logits, bias, k, n_group, topk_group):
    N, E = router_logits.shape
    choice = sigmoid(router_logits)  # BUG: no + bias
    kept = np.zeros((N, n_group), dtype=bool)
    np.put_along_axis(kept, top_k_indices(group_scores(choice, n_group), topk_group), True, axis=-1)
    return top_k_indices(np.where(np.repeat(kept, E // n_group, axis=-1), choice, -np.inf), k)


@mutant(
    replaces="grouped_top_k_gates",
    killed_by="routing.grouped_top_k_gates_sum",
    bug="DeepSeek-V3's chosen affinities never normalised over the chosen experts: norm_topk_prob ignored (torchtitan#1448)",
)
def unnormalised_grouped_top_k_gates(router_logits, bias, k, n_group, topk_group, norm_topk_prob, routed_scaling_factor):
    top = grouped_top_k_indices(router_logits, bias, k, n_group, topk_group)
    return _gates_at(router_logits, top, np.take_along_axis(sigmoid(router_logits), top, axis=-1) * routed_scaling_factor)


@mutant(
    replaces="grouped_top_k_gates",
    killed_by="routing.grouped_top_k_gates_agrees_with_reference",
    bug="routed_scaling_factor applied only inside the renormalising branch, so skipped where norm_topk_prob is False (sglang-jax#1282)",
)
def nested_scaling_grouped_top_k_gates(router_logits, bias, k, n_group, topk_group, norm_topk_prob, routed_scaling_factor):
    top = grouped_top_k_indices(router_logits, bias, k, n_group, topk_group)
    weights = np.take_along_axis(sigmoid(router_logits), top, axis=-1)
    if norm_topk_prob:
        weights = weights / weights.sum(axis=-1, keepdims=True) * routed_scaling_factor  # BUG: the scaling only here
    return _gates_at(router_logits, top, weights)


@mutant(
    replaces="softmax_top_k_gates",
    killed_by="routing.softmax_top_k_gates_unnormalised_are_probabilities",
    bug="with norm_topk_prob False, the raw top-k logits returned as the weights, not their softmax probabilities (sglang#35160)",
)
def raw_logit_softmax_top_k_gates(router_logits, k, norm_topk_prob):
    top = top_k_indices(router_logits, k)
    kept = np.take_along_axis(router_logits, top, axis=-1)  # (N, k)
    return _gates_at(router_logits, top, softmax(kept) if norm_topk_prob else kept)  # BUG: logits as weights


@mutant(
    replaces="softmax_top_k_gates",
    killed_by="routing.softmax_top_k_gates_sum",
    bug="norm_topk_prob ignored: the kept probabilities over all experts never renormalised (Qwen2-MoE's False in a Qwen3-MoE port)",
)
def never_renormalised_softmax_top_k_gates(router_logits, k, norm_topk_prob):
    top = top_k_indices(router_logits, k)
    return _gates_at(router_logits, top, np.take_along_axis(softmax(router_logits), top, axis=-1))


@mutant(
    replaces="expert_bias_update",
    killed_by="routing.expert_bias_update_moves_against_load",
    bug="the bias update's sign reversed: an overloaded expert's bias goes up, so it draws still more tokens (DeepSeek-V3 §2.1.2 says down)",
)
def reversed_expert_bias_update(bias, tokens_per_expert, rate):
    counts = np.asarray(tokens_per_expert, dtype=np.int64)
    return bias + np.sign(counts * counts.size - counts.sum()).astype(bias.dtype) * rate  # BUG: sign(load - mean)


@mutant(
    replaces="softmax_top_k_gates",
    killed_by="routing.softmax_top_k_gates_masked_experts",
    bug="an iterative top-k that excludes each chosen expert by setting its score to -inf keeps an expert twice once only -inf is "
    "left, and the renormalised gates halve (vllm-project/vllm-omni#7175: routes [2, 0, 0] for one finite score and top_k = 3)",
)
def repeated_max_softmax_top_k_gates(router_logits, k, norm_topk_prob):
    top = _routes_by_repeated_max(router_logits, k)  # (N, k), BUG: a kept expert again where fewer than k scores are finite
    probs = np.take_along_axis(softmax(router_logits), top, axis=-1)  # (N, k)
    if norm_topk_prob:
        probs = probs / probs.sum(axis=-1, keepdims=True)
    return _gates_at(router_logits, top, probs)
