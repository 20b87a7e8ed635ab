"""Broken mixture of experts: the gate, tie, counting, balance-loss and dispatch bugs of routing code."""

import numpy as np

from invariants.mutants import mutant
from invariants.reference.numpy import feed_forward, softmax, tokens_per_expert, top_k_gates, top_k_indices


@mutant(replaces="top_k_gates", killed_by="moe.top_k_gates_sum_to_one", bug="softmax over all experts, the dropped ones zeroed, not renormalised")
def unnormalised_top_k_gates(router_logits, k):
    top = top_k_indices(router_logits, k)  # (N, k)
    probs = softmax(router_logits)  # (N, E): over all experts
    gates = np.zeros_like(router_logits)
    np.put_along_axis(gates, top, np.take_along_axis(probs, top, axis=-1), axis=-1)
    return gates


@mutant(
    replaces="top_k_gates",
    killed_by="moe.top_k_gates_kept_ratios",
    bug="softmax over all experts, then a second softmax over the kept probabilities",
)
def double_softmax_top_k_gates(router_logits, k):
    top = top_k_indices(router_logits, k)  # (N, k)
    kept = np.take_along_axis(softmax(router_logits), top, axis=-1)  # (N, k): probabilities, not scores
    gates = np.zeros_like(router_logits)
    np.put_along_axis(gates, top, softmax(kept), axis=-1)
    return gates


@mutant(
    also_named_by=("moe.top_k_gates_known_values",),
    replaces="top_k_gates",
    killed_by="moe.top_k_gates_select_top_k",
    bug="dropped experts masked with 0 instead of -inf before a softmax over all experts",
)
def zero_masked_top_k_gates(router_logits, k):
    keep = np.zeros(router_logits.shape, dtype=bool)
    np.put_along_axis(keep, top_k_indices(router_logits, k), True, axis=-1)
    return softmax(np.where(keep, router_logits, 0.0))  # exp(0) is not 0


@mutant(also_named_by=("moe.top_k_gates_known_values",),
        replaces="top_k_indices", killed_by="moe.top_k_gates_select_top_k", bug="an ascending sort keeps the k smallest scores")
def ascending_top_k_indices(router_logits, k):
    return np.argsort(router_logits, axis=-1, kind="stable")[..., :k]


@mutant(replaces="top_k_indices", killed_by="moe.top_k_gates_tie_rule", bug="descending by reversing an ascending sort: ties go to the higher index")
def reversed_argsort_top_k_indices(router_logits, k):
    return np.argsort(router_logits, axis=-1, kind="stable")[..., ::-1][..., :k]


@mutant(
    replaces="top_k_indices",
    killed_by="moe.top_k_gates_tie_rule",
    bug="torch.topk, whose tie order is undocumented (all-equal scores over 4 experts keep 2, 3, 0)",
    backend="torch",
)
def torch_topk_indices(router_logits, k):
    import torch

    return torch.topk(router_logits, k, dim=-1).indices


@mutant(replaces="tokens_per_expert", killed_by="moe.tokens_per_expert_sum", bug="counts only each token's first choice")
def first_choice_tokens_per_expert(router_logits, k):
    return np.bincount(top_k_indices(router_logits, 1).ravel(), minlength=router_logits.shape[-1])


@mutant(
    replaces="tokens_per_expert",
    killed_by="moe.tokens_per_expert_matches_gates",
    bug="counts with another tie rule than the gates (a reversed ascending sort)",
)
def other_tie_rule_tokens_per_expert(router_logits, k):
    top = np.argsort(router_logits, axis=-1, kind="stable")[..., ::-1][..., :k]  # (N, k)
    return np.bincount(top.ravel(), minlength=router_logits.shape[-1])


@mutant(
    replaces="load_balancing_loss",
    killed_by="moe.load_balancing_loss_bounds",
    bug="soft counts: f is the mean probability, not the hard top-k share",
)
def soft_count_load_balancing_loss(router_logits, k):
    P = softmax(router_logits).mean(axis=0)  # (E,)
    return router_logits.shape[-1] * np.sum(P * P)


@mutant(
    replaces="load_balancing_loss",
    killed_by="moe.load_balancing_loss_uniform_mean_is_one",
    bug="f normalised over the N tokens, not the N·k slots (Mixtral's convention, k × the loss)",
)
def per_token_load_balancing_loss(router_logits, k):
    N, E = router_logits.shape
    f = tokens_per_expert(router_logits, k) / N  # (E,), sums to k
    return E * np.sum(f * softmax(router_logits).mean(axis=0))


@mutant(replaces="moe", killed_by="moe.moe_dense_when_k_equals_n", bug="expert outputs summed without their gates")
def ungated_moe(x, router, experts, k):
    gates = top_k_gates(x @ router, k)  # (N, E)
    out = np.zeros_like(x)
    for e, expert in enumerate(experts):
        chosen = gates[:, e] > 0
        if chosen.any():
            out[chosen] += feed_forward(x[chosen], **expert)
    return out


@mutant(replaces="moe", killed_by="moe.moe_top_1_is_chosen_expert", bug="the j-th choice runs experts[j], not experts[top[j]]")
def rank_indexed_moe(x, router, experts, k):
    scores = x @ router  # (N, E)
    top = top_k_indices(scores, k)  # (N, k)
    weights = softmax(np.take_along_axis(scores, top, axis=-1))  # (N, k)
    out = np.zeros_like(x)
    for j in range(k):
        out += weights[:, j : j + 1] * feed_forward(x, **experts[j])
    return out


@mutant(
    replaces="moe",
    killed_by="moe.moe_token_permutation_equivariance",
    bug="slots listed token-major but their tokens expert-major (np.tile where np.repeat is meant)",
)
def tiled_dispatch_moe(x, router, experts, k):
    N = x.shape[0]
    scores = x @ router  # (N, E)
    top = top_k_indices(scores, k)  # (N, k)
    weights = softmax(np.take_along_axis(scores, top, axis=-1))  # (N, k)
    tokens = np.tile(np.arange(N), k)  # should be np.repeat(np.arange(N), k) to match top.ravel()
    out = np.zeros_like(x)
    for t, e, w in zip(tokens, top.ravel(), weights.ravel(), strict=True):
        out[t] += w * feed_forward(x[t], **experts[e])
    return out


def _routes_by_repeated_max(router_logits, k):
    """(N, k) routes of an iterative top-k that excludes each chosen expert by setting its score to -inf."""
    N = router_logits.shape[0]
    selection = router_logits.copy()  # (N, E)
    routes = np.empty((N, k), dtype=np.int64)
    for j in range(k):
        best = selection.max(axis=-1, keepdims=True)  # (N, 1)
        routes[:, j] = np.argmax(selection == best, axis=-1)  # the lowest index at the max: any -inf one once the max is -inf
        selection[np.arange(N), routes[:, j]] = -np.inf  # BUG: excluded by score, so a chosen expert ties with the masked ones
    return routes


@mutant(replaces="top_k_gates", killed_by="moe.top_k_gates_masked_experts",
        bug="an iterative top-k that excludes each chosen expert by setting its score to -inf: once only -inf scores are left it "
        "picks an expert again (vllm-project/vllm-omni#7175: routes [2, 0, 0] for one finite score and top_k = 3)")
def top_k_by_repeated_max(router_logits, k):
    N = router_logits.shape[0]
    routes = _routes_by_repeated_max(router_logits, k)  # (N, k)
    gates = np.zeros_like(router_logits)
    np.add.at(gates, (np.arange(N)[:, None], routes), softmax(np.take_along_axis(router_logits, routes, axis=-1)))
    return gates


@mutant(replaces="tokens_per_expert", killed_by="moe.tokens_per_expert_masked_experts",
        bug="tokens counted from an iterative top-k that excludes each chosen expert by setting its score to -inf: a token with fewer "
        "than k finite scores counts one expert twice (vllm-project/vllm-omni#7175: routes [2, 0, 0] for one finite score, top_k = 3)")
def tokens_counted_by_repeated_max(router_logits, k):
    return np.bincount(_routes_by_repeated_max(router_logits, k).ravel(), minlength=router_logits.shape[-1])
