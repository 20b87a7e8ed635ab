"""Invariants of the mixture of experts: top-k gates, tokens per expert, the balance loss and the moe layer.

Router logits and moe inputs come from grids every dtype holds exactly (strategies/moe.py), so
the implementation sees exactly the scores the check reasons about: the top-k set is the same
for every correct implementation in every dtype, and ties are real ties.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np
from hypothesis import strategies as st

import invariants.reference.numpy as ref
from invariants.asserts import assert_close, assert_equal, assert_shape, assert_value, assert_where
from invariants.conventions import Declared, biases_as_declared, d_ff_for, declared, expert_function, rounding_dtype
from invariants.inputs import valid_inputs
from invariants.laws.reference_check import assert_agrees_with_reference, assert_close_to_a_gelu_form, reference_answer, reference_answers
from invariants.registry import invariant
from invariants.strategies.core import integers, permutations
from invariants.strategies.moe import (
    LOGIT_STEP,
    masked_router_logits,
    moe_params,
    moe_shapes,
    moe_tokens,
    router_logits,
    uniform_mean_router_logits,
)
from invariants.tolerance import agreement_tolerance

LESSON = 80  # where a lesson meets this component: the registry's order (test ids, the kill matrix's first failure)
HOLDS = ("top_k_gates", "moe", "load_balancing_loss", "tokens_per_expert")  # the protocol functions whose laws it holds


def _follows_tie_rule(impl):
    """True unless the implementation declares TOP_K_TIES = "any" (no documented tie rule)."""
    return declared(impl, "TOP_K_TIES") != "any"


def _no_tie_rule(impl):
    """The skip reason of the tie-rule invariant for an implementation that documents no tie rule, or None."""
    if _follows_tie_rule(impl):
        return None
    return Declared(f"{impl.label} declares TOP_K_TIES = 'any' (no tie rule); the gates are checked against any valid top-k set instead")


def _routing(case, **logit_options):
    """Draw a shape and router logits for it: (logits (N, E), k)."""
    shape = case.draw(moe_shapes(), "shape")
    logits = case.draw(router_logits(shape.tokens, shape.experts, **logit_options), "router_logits")  # (N, E)
    return logits, shape.k


@valid_inputs("top_k_gates")
def top_k_gates_arguments(impl, case):
    """(N, E) router logits of moderate values and a k from 1 to E."""
    shape = case.draw(moe_shapes(max_tokens=4, max_experts=4), "shape")
    return case.draw(router_logits(shape.tokens, shape.experts), "router_logits"), shape.k  # (N, E)


@valid_inputs("load_balancing_loss")
def load_balancing_loss_arguments(impl, case):
    """The router logits and k of top_k_gates."""
    return top_k_gates_arguments(impl, case)  # the same router logits and k


@valid_inputs("tokens_per_expert")
def tokens_per_expert_arguments(impl, case):
    """The router logits and k of top_k_gates."""
    return top_k_gates_arguments(impl, case)  # the same router logits and k


def _gates(impl, logits, k, call):
    return assert_shape(impl.top_k_gates(logits, k), logits.shape, "top_k_gates(router_logits, k)", call).astype(np.float64)


def _softmax_over(scores, kept):
    """Row-wise softmax of `scores` over the positions where `kept` is True, 0 elsewhere (all 0 where nothing is kept)."""
    masked = np.where(kept, scores, -np.inf)  # (N, E)
    top = np.where(kept.any(axis=-1, keepdims=True), masked.max(axis=-1, keepdims=True), 0.0)  # (N, 1)
    e = np.exp(masked - top)  # (N, E), 0 where dropped
    return e / np.maximum(e.sum(axis=-1, keepdims=True), np.finfo(np.float64).tiny)


def _boundary_tied(scores, k):
    """(N,) True where the k-th and (k+1)-th largest scores tie, so that the tie rule decides the top-k set."""
    if k >= scores.shape[-1]:
        return np.zeros(scores.shape[0], dtype=bool)
    ordered = -np.sort(-scores, axis=-1)  # (N, E), descending
    return ordered[:, k - 1] == ordered[:, k]


# ---------------------------------------------------------------------------
# Top-k gates
# ---------------------------------------------------------------------------


@invariant(
    requires=("top_k_gates",),
    hint="the gates are not renormalised: a softmax over all experts with the dropped ones zeroed leaves rows summing to less than 1",
)
def top_k_gates_sum_to_one(impl, case):
    """Each token's gates are >= 0 and sum to 1."""
    logits, k = _routing(case)
    call = f"top_k_gates(router_logits, k={k})"
    g = _gates(impl, logits, k, call)
    assert_where(g >= 0, g, "top_k_gates(router_logits, k)", ">= 0", call)
    assert_close(g.sum(axis=-1), 1.0, "sum of each token's gates", impl.tolerance, call)


@invariant(
    requires=("top_k_gates",),
    hint=(
        "top-k keeps the wrong experts: an ascending sort keeps the smallest scores, or the dropped experts are masked "
        "with 0 instead of -inf before a softmax over all experts, so they keep a gate"
    ),
)
def top_k_gates_select_top_k(impl, case):
    """Exactly k of each token's gates are non-zero, and they sit at k of its largest router scores (any valid top-k set where scores tie)."""
    logits, k = _routing(case)
    call = f"top_k_gates(router_logits, k={k})"
    kept = _gates(impl, logits, k, call) != 0  # (N, E)
    scores = impl.as_seen(logits)  # the grid makes these the drawn logits exactly
    assert_where(kept.sum(axis=-1) == k, kept.sum(axis=-1), "number of non-zero gates per token", f"exactly k={k}", call)
    lowest_kept = np.where(kept, scores, np.inf).min(axis=-1)  # (N,)
    highest_dropped = np.where(kept, -np.inf, scores).max(axis=-1)  # (N,)
    assert_where(lowest_kept >= highest_dropped, lowest_kept, "lowest router score with a non-zero gate, per token",
                 "at least every dropped expert's score (the gates sit at the k largest scores)", call)


@invariant(
    requires=("top_k_gates",),
    hint=(
        "ties are broken towards the higher index or unpredictably (torch.topk; argsort(...)[::-1] reverses an "
        "ascending sort): use a stable descending sort, or declare TOP_K_TIES = 'any'"
    ),
    applies=_no_tie_rule,
)
def top_k_gates_tie_rule(impl, case):
    """Where router scores tie at the top-k boundary, the lower-index experts are kept (the documented rule; all-equal scores keep experts 0..k-1)."""
    logits, k = _routing(case)
    call = f"top_k_gates(router_logits, k={k})"
    kept = _gates(impl, logits, k, call) != 0  # (N, E)
    scores = impl.as_seen(logits)
    expected = ref.top_k_gates(scores, k) != 0  # (N, E)
    tied = _boundary_tied(scores, k)[:, None]  # (N, 1): other tokens are top_k_gates_select_top_k's business
    assert_where((kept == expected) | ~tied, kept.astype(int), "non-zero gates of tokens with a tie at the top-k boundary (1 = kept)",
                 "1 exactly at the experts a stable descending sort keeps (ties to the lower index)", call)


@invariant(
    requires=("top_k_gates",),
    hint=(
        "the gates are not a softmax over the kept scores: a softmax applied twice (to the kept probabilities instead "
        "of the kept scores), or a temperature on the scores, changes g_i/g_j = exp(r_i - r_j)"
    ),
)
def top_k_gates_kept_ratios(impl, case):
    """Kept gates are in the ratio g_i/g_j = exp(r_i - r_j): a softmax over the kept scores."""
    logits, k = _routing(case)
    call = f"top_k_gates(router_logits, k={k})"
    g = _gates(impl, logits, k, call)
    expected = g.sum(axis=-1, keepdims=True) * _softmax_over(impl.as_seen(logits), g != 0)  # (N, E): same total, exp ratios
    assert_close(g, expected, "top_k_gates(router_logits, k)", impl.tolerance, call)


@invariant(
    requires=("top_k_gates",),
    hint=(
        "the gates depend on the scores' absolute size, not only their differences: a sigmoid gate, or a division by "
        "the score sum instead of a softmax"
    ),
)
def top_k_gates_shift_invariance(impl, case):
    """Adding a constant to one token's router scores leaves its gates unchanged (to rounding: without the row
    maximum subtracted, exp(r + c) does not round like exp(r)·exp(c))."""
    logits, k = _routing(case, ties=_follows_tie_rule(impl))  # an implementation without a tie rule may break ties by value
    steps = case.draw(st.lists(integers(-32, 32), min_size=len(logits), max_size=len(logits)), "shift per token (units of 1/8)")
    shifted = logits + np.array(steps, dtype=float)[:, None] * LOGIT_STEP  # (N, E), still exact in every dtype
    call = f"top_k_gates(router_logits + c, k={k}) vs top_k_gates(router_logits, k={k})"
    assert_close(_gates(impl, shifted, k, call), _gates(impl, logits, k, call), "top_k_gates(router_logits + c)", impl.tolerance, call)


@invariant(
    requires=("top_k_gates",),
    hint=(
        "the gates depend on the experts' positions, not only their scores: a gate is written to the wrong column (the "
        "expert's rank instead of its id)"
    ),
)
def top_k_gates_relabel_experts(impl, case):
    """Permuting the experts (the columns of tie-free router logits) permutes the gates the same way."""
    logits, k = _routing(case, ties=False)  # with ties, relabelling changes which experts the tie rule keeps
    order = np.array(case.draw(permutations(range(logits.shape[-1])), "expert order"))
    call = f"top_k_gates(router_logits[:, order], k={k}) vs top_k_gates(router_logits, k={k})[:, order]"
    expected = _gates(impl, logits, k, call)[:, order]
    assert_close(_gates(impl, logits[:, order], k, call), expected, "top_k_gates(router_logits[:, order])", impl.tolerance, call)


@invariant(
    requires=("top_k_gates",),
    hint="the seed's example r = (2.0, 1.0, 0.5, -1.0), k = 2 gives (0.731, 0.269, 0, 0): a softmax over the two kept scores only "
    "(an ascending sort keeps the two smallest; dropped experts masked with 0 before a softmax over all four keep gates)",
)
def top_k_gates_known_values(impl, case):
    """top_k_gates((2.0, 1.0, 0.5, -1.0), k=2) = (0.731, 0.269, 0, 0): e²/(e² + e¹) and its complement."""
    logits = np.array([[2.0, 1.0, 0.5, -1.0]])
    expected = np.array([[np.exp(2) / (np.exp(2) + np.exp(1)), np.exp(1) / (np.exp(2) + np.exp(1)), 0.0, 0.0]])  # 0.7311, 0.2689
    call = "top_k_gates([[2.0, 1.0, 0.5, -1.0]], k=2)"
    assert_close(_gates(impl, logits, 2, call), expected, "top_k_gates([2.0, 1.0, 0.5, -1.0], 2)", impl.tolerance, call)


@invariant(
    requires=("top_k_gates",),
    hint="a convention differs from the reference's: a softmax over each token's k kept scores, 0 elsewhere, ties to the lower index",
)
def top_k_gates_agrees_with_reference(impl, case):
    """top_k_gates agrees with the float64 reference (to 1e-10 in float64, the dtype tolerance otherwise)."""
    logits, k = _routing(case, ties=_follows_tie_rule(impl))  # with TOP_K_TIES = "any", tie-free logits only
    got = impl.top_k_gates(logits, k)
    assert_agrees_with_reference(impl, "top_k_gates", (logits, k), got, "top_k_gates(router_logits, k)", call=f"top_k_gates(router_logits, k={k})")


def _masked_routing(case):
    """A shape with k >= 2 and router logits with experts masked to -inf, some tokens keeping fewer than k finite scores."""
    shape = case.draw(moe_shapes(min_k=2), "shape")
    return case.draw(masked_router_logits(shape.tokens, shape.experts, shape.k), "router_logits (-inf: masked experts)"), shape.k


@invariant(
    requires=("top_k_gates",),
    hint="a token with fewer than k finite router scores gets a finite expert twice: an iterative top-k that excludes the chosen "
    "expert by setting its score to -inf picks one again once only -inf is left (vllm-project/vllm-omni#7175), or a masked "
    "expert gets a gate",
)
def top_k_gates_masked_experts(impl, case):
    """With experts masked to -inf, a token's gates are the softmax over its k largest finite scores, or over all m of them where
    m < k, and 0 at every masked expert: a top-k returns k distinct experts (torch.topk fills the rest with -inf scores, which the
    softmax weights 0; both references' stable sort too), so no expert is counted twice. Tie-free scores, m >= 1 (a token with no
    finite score has no gates: a softmax of all -inf is NaN)."""
    logits, k = _masked_routing(case)
    call = f"top_k_gates(router_logits, k={k}) with {int(np.isinf(logits).sum())} experts masked to -inf"
    g = _gates(impl, logits, k, call)
    finite = np.isfinite(logits)  # (N, E)
    assert_equal(np.where(finite, 0.0, g), np.zeros_like(g), "gates of the masked (-inf) experts", call)
    expected = ref.top_k_gates(impl.as_seen(logits), k)  # (N, E): a unique top-k among the finite scores, 0 at -inf
    assert_close(g, expected, "top_k_gates(router_logits, k) (softmax over the min(k, m) largest finite scores)", impl.tolerance, call)


# ---------------------------------------------------------------------------
# Tokens per expert
# ---------------------------------------------------------------------------


@invariant(
    requires=("tokens_per_expert",),
    hint="tokens_per_expert counts only each token's first choice (not all k), or drops the experts that got no token (bincount without minlength)",
)
def tokens_per_expert_sum(impl, case):
    """tokens_per_expert gives one count per expert, each >= 0, summing to N·k (every token fills k slots)."""
    logits, k = _routing(case)
    call = f"tokens_per_expert(router_logits, k={k})"
    counts = assert_shape(impl.tokens_per_expert(logits, k), (logits.shape[-1],), "tokens_per_expert(router_logits, k)", call)
    assert_where(counts >= 0, counts, "tokens_per_expert(router_logits, k)", ">= 0", call)
    assert_value(int(counts.sum()), logits.shape[0] * k, f"sum of tokens_per_expert (N={logits.shape[0]}, k={k})", call)


@invariant(
    requires=("tokens_per_expert", "top_k_gates"),
    hint="tokens_per_expert and top_k_gates choose experts differently: another top-k or tie rule in one of them",
)
def tokens_per_expert_matches_gates(impl, case):
    """tokens_per_expert counts, for each expert, the tokens whose gate for it is non-zero."""
    logits, k = _routing(case)
    call = f"tokens_per_expert(router_logits, k={k}) vs top_k_gates(router_logits, k={k}) != 0"
    counts = impl.tokens_per_expert(logits, k)
    assert_equal(counts, np.count_nonzero(_gates(impl, logits, k, call), axis=0), "tokens_per_expert(router_logits, k)", call)


@invariant(
    requires=("tokens_per_expert",),
    hint="a token with fewer than k finite router scores is counted twice for one expert: an iterative top-k that excludes the "
    "chosen expert by setting its score to -inf picks one again once only -inf is left (vllm-project/vllm-omni#7175)",
)
def tokens_per_expert_masked_experts(impl, case):
    """With experts masked to -inf, every token still fills k slots with k distinct experts: an expert's count is at least the
    tokens keeping it among their k largest finite scores (all m of them where m < k) and exceeds that by at most the tokens that
    mask it and keep fewer than k (which masked experts fill the rest is a tie among -inf); the counts sum to N·k."""
    logits, k = _masked_routing(case)
    call = f"tokens_per_expert(router_logits, k={k}) with {int(np.isinf(logits).sum())} experts masked to -inf"
    counts = assert_shape(impl.tokens_per_expert(logits, k), (logits.shape[-1],), "tokens_per_expert(router_logits, k)", call)
    finite = np.isfinite(logits)  # (N, E)
    kept = np.count_nonzero(ref.top_k_gates(logits, k), axis=0)  # (E,): the tokens keeping each expert among their finite best
    fillable = (~finite & (finite.sum(axis=-1, keepdims=True) < k)).sum(axis=0)  # (E,): the tokens whose rest it may fill
    assert_where((counts >= kept) & (counts <= kept + fillable), counts, "tokens_per_expert(router_logits, k)",
                 f"between the tokens keeping each expert among their finite best ({kept.tolist()}) and that plus the tokens "
                 f"short of k finite scores that mask it ({fillable.tolist()})", call)
    assert_value(int(counts.sum()), logits.shape[0] * k, f"sum of tokens_per_expert (N={logits.shape[0]}, k={k})", call)


# ---------------------------------------------------------------------------
# The balance loss L = n·Σ f_i·P_i
# ---------------------------------------------------------------------------


def _balance_loss(impl, logits, k, call):
    return assert_shape(impl.load_balancing_loss(logits, k), (), "load_balancing_loss(router_logits, k)", call).astype(np.float64)


@invariant(
    requires=("load_balancing_loss",),
    hint=(
        "L is outside [1/(k·n), n/k]: f is not the hard top-k share of the N·k routing slots (soft counts f = P give "
        "n·ΣP², which reaches n), or the loss is scaled (Mixtral's convention is k × this loss)"
    ),
)
def load_balancing_loss_bounds(impl, case):
    """The balance loss lies in [1/(k·n), n/k] (n experts); it can fall below 1, so L >= 1 is not a law.

    Upper: f_i <= 1/k and Σ P_i = 1. Lower: each token's first choice a has p_a >= 1/n, and an
    expert that is first choice of m_a tokens gets at least m_a slots, so L >= Σ m_a²/(k·N²) >= 1/(k·n).
    """
    shape = case.draw(moe_shapes(), "shape")
    lopsided = case.draw(st.booleans(), "only leaning and confident rows")
    patterns = ("leaning", "confident") if lopsided else None
    logits = case.draw(router_logits(shape.tokens, shape.experts, patterns=patterns), "router_logits")
    n, k = shape.experts, shape.k
    call = f"load_balancing_loss(router_logits, k={k}) with n={n} experts"
    L = _balance_loss(impl, logits, k, call)
    tol = impl.tolerance
    low, high = 1 / (k * n), n / k
    assert_where(L >= low - tol.atol - tol.rtol * low, L, "load_balancing_loss(router_logits, k)", f">= 1/(k·n) = {low:.6g}", call)
    assert_where(L <= high + tol.atol + tol.rtol * high, L, "load_balancing_loss(router_logits, k)", f"<= n/k = {high:.6g}", call)


@invariant(
    requires=("load_balancing_loss",),
    hint=(
        "L != 1 although the mean router probability is uniform: f is normalised over the N tokens, not the N·k slots "
        "(transformers' Mixtral load_balancing_loss_func is k × this loss), or P is not the mean softmax probability"
    ),
)
def load_balancing_loss_uniform_mean_is_one(impl, case):
    """The balance loss is 1 whenever the mean router probability is uniform (all-equal logits included), for every k."""
    shape = case.draw(moe_shapes(), "shape")
    logits = case.draw(uniform_mean_router_logits(shape.experts), "router_logits (every cyclic shift of a few rows)")
    k = shape.k
    call = f"load_balancing_loss(router_logits, k={k}) with a uniform mean probability"
    assert_close(_balance_loss(impl, logits, k, call), 1.0, "load_balancing_loss(router_logits, k)", impl.tolerance, call)


@invariant(
    requires=("load_balancing_loss",),
    hint=(
        "with k = n every expert gets every token, so f_i = 1/n and L = Σ P_i = 1: f is not the share of the N·k slots "
        "(Mixtral's convention gives n), or P does not sum to 1"
    ),
)
def load_balancing_loss_dense_is_one(impl, case):
    """With k = n the balance loss is 1 for any router logits (f_i = 1/n, so L = Σ P_i)."""
    shape = case.draw(moe_shapes().map(lambda s: replace(s, k=s.experts)), "shape (k = n)")
    logits = case.draw(router_logits(shape.tokens, shape.experts), "router_logits")
    call = f"load_balancing_loss(router_logits, k={shape.k}) with k = n"
    assert_close(_balance_loss(impl, logits, shape.k, call), 1.0, "load_balancing_loss(router_logits, n)", impl.tolerance, call)


@invariant(
    requires=("load_balancing_loss",),
    hint=(
        "a convention differs from Switch's n·Σ f_i·P_i: f the hard top-k share of the N·k slots (ties to the lower "
        "index), P the mean softmax probability"
    ),
)
def load_balancing_loss_agrees_with_reference(impl, case):
    """load_balancing_loss agrees with the float64 reference (to 1e-10 in float64, the dtype tolerance otherwise)."""
    logits, k = _routing(case, ties=_follows_tie_rule(impl))  # another tie rule counts tied tokens elsewhere
    got = impl.load_balancing_loss(logits, k)
    assert_agrees_with_reference(impl, "load_balancing_loss", (logits, k), got, "load_balancing_loss(router_logits, k)",
                                 call=f"load_balancing_loss(router_logits, k={k})")


# ---------------------------------------------------------------------------
# The moe layer
# ---------------------------------------------------------------------------


def moe_params_for(impl, d_model, n_experts, d_ff_default=None):
    """moe_params impl's moe can take: experts of the declared EXPERT_FFN, FEED_FORWARD_RATIO·d wide, without biases where declared."""
    params = moe_params(d_model, n_experts, d_ff=d_ff_for(impl, d_model, d_ff_default), expert_ffn=declared(impl, "EXPERT_FFN"))
    return biases_as_declared(impl, params)


@valid_inputs("moe")
def moe_arguments(impl, case):
    """(N, d) tokens, a router and experts with the biases as declared, and a k from 1 to E."""
    shape = case.draw(moe_shapes(max_tokens=4, max_experts=3, max_d=4), "shape")
    x = case.draw(moe_tokens(shape.tokens, shape.d_model), "x")  # (N, d)
    p = case.draw(moe_params_for(impl, shape.d_model, shape.experts, 4), "router, experts")
    return x, p["router"], p["experts"], shape.k


def _moe_case(impl, case, shapes):
    """Draw (shape, x (N, d), router (d, E), experts) for moe; the experts' width is FEED_FORWARD_RATIO·d where declared, else 4·d."""
    shape = case.draw(shapes, "shape")
    x = case.draw(moe_tokens(shape.tokens, shape.d_model), "x")
    params = case.draw(moe_params_for(impl, shape.d_model, shape.experts), "params")
    return shape, x, params["router"], params["experts"]


def _expert_function_given(impl):
    """The skip reason where impl lacks the function its experts are (feed_forward, or swiglu under EXPERT_FFN = "swiglu")."""
    return impl.missing((expert_function(impl),))


def _expert_outputs(impl, x, experts):
    """(E, N, d): every expert on every token, computed by the implementation's feed_forward (swiglu under EXPERT_FFN = "swiglu")."""
    run = getattr(impl, expert_function(impl))
    return np.stack([run(x, *expert.values()).astype(np.float64) for expert in experts])  # the params in the protocol's order


def _at_expert_scale(tol, impl, x, experts):
    """tol at the size of the experts' terms: max of (|x|·|W1| + |b1|)·|W2| + |b2|, or (|x|·|W_gate| ⊙ |x|·|W_up|)·|W_down| (|SiLU(z)| <= |z|).

    Rounding errors in a dot product are relative to the sum of its terms' sizes, not to its
    value, which cancellation can make tiny (a d = 1 expert's output of 3e-4 carries the
    rounding of terms of size 1).
    """
    x = np.abs(impl.as_seen(x))

    def size(e):
        if "W_gate" in e:
            return ((x @ np.abs(e["W_gate"])) * (x @ np.abs(e["W_up"])) @ np.abs(e["W_down"])).max()
        return ((x @ np.abs(e["W1"]) + np.abs(e["b1"])) @ np.abs(e["W2"]) + np.abs(e["b2"])).max()

    return tol.at_scale(float(max(size(e) for e in impl.as_seen(experts))))


@invariant(
    requires=("moe",),
    applies=_expert_function_given,
    hint="the expert outputs are not weighted by their gates (summed unweighted), or weighted by another token's or expert's gate",
)
def moe_dense_when_k_equals_n(impl, case):
    """With k = n, moe is the dense mixture Σ_i softmax(x·W_r)_i · expert_i(x)."""
    shape, x, router, experts = _moe_case(impl, case, moe_shapes().map(lambda s: replace(s, k=s.experts)))
    call = f"moe(x, router, experts, k={shape.k}) with k = n vs Σ softmax(x·router)·{expert_function(impl)}(x, expert)"
    probs = ref.softmax(impl.as_seen(x) @ impl.as_seen(router))  # (N, E); the scores are exact in every dtype
    expected = np.einsum("ne,end->nd", probs, _expert_outputs(impl, x, experts))  # (N, E) x (E, N, d) -> (N, d)
    out = assert_shape(impl.moe(x, router, experts, shape.k), x.shape, "moe(x, router, experts, k)", call)
    assert_close(out, expected, "moe(x, router, experts, n)", _at_expert_scale(impl.tolerance, impl, x, experts), call)


@invariant(
    requires=("moe",),
    applies=_expert_function_given,
    hint="the expert is looked up by its rank among the token's choices instead of its id, or its output is scaled (a top-1 gate must be exactly 1)",
)
def moe_top_1_is_chosen_expert(impl, case):
    """With k = 1, each token's moe output is the output of the expert with its highest router score (to rounding:
    moe runs an expert on a subset of the tokens, which may take another matmul kernel)."""
    shape, x, router, experts = _moe_case(impl, case, moe_shapes().map(lambda s: replace(s, k=1)))
    call = f"moe(x, router, experts, k=1) vs {expert_function(impl)}(x, expert with the top score)"
    out = assert_shape(impl.moe(x, router, experts, 1), x.shape, "moe(x, router, experts, 1)", call).astype(np.float64)
    scores = impl.as_seen(x) @ impl.as_seen(router)  # (N, E), exact in every dtype
    outputs = _expert_outputs(impl, x, experts)  # (E, N, d)
    tokens = np.arange(len(x))
    if _follows_tie_rule(impl):
        chosen = scores.argmax(axis=-1)  # (N,): the first maximum, ties to the lower index
    else:  # any expert with the top score: compare with the nearest of them
        miss = np.abs(outputs - out[None]).max(axis=-1).T  # (N, E)
        chosen = np.where(scores == scores.max(axis=-1, keepdims=True), miss, np.inf).argmin(axis=-1)
    tol = _at_expert_scale(impl.tolerance, impl, x, experts)
    assert_close(out, outputs[chosen, tokens], "moe(x, router, experts, 1)", tol, call)


@invariant(
    requires=("moe",),
    hint=(
        "tokens are paired with another token's gates or expert outputs (dispatch and combine orders disagree, e.g. "
        "np.tile where np.repeat is meant), or outputs are not scattered back to their tokens"
    ),
)
def moe_token_permutation_equivariance(impl, case):
    """moe is position-wise: permuting the tokens permutes the outputs the same way."""
    shape, x, router, experts = _moe_case(impl, case, moe_shapes(min_tokens=2))
    order = np.array(case.draw(permutations(range(shape.tokens)), "token order"))
    call = f"moe(x[order], router, experts, k={shape.k}) vs moe(x, router, experts, k={shape.k})[order]"
    expected = impl.moe(x, router, experts, shape.k)[order]
    tol = _at_expert_scale(impl.tolerance, impl, x, experts)  # an expert's batch of tokens is reordered
    assert_close(impl.moe(x[order], router, experts, shape.k), expected, "moe(x[order], router, experts, k)", tol, call)


@invariant(
    requires=("moe",),
    hint=(
        "a convention differs from the reference's y = Σ_{i in top-k} g_i·E_i(x): g a softmax over the kept scores of r"
        " = x·W_r (no bias), E_i the GELU feed-forward (one GELU form throughout: the declared GELU_FORM) or, under "
        "EXPERT_FFN = 'swiglu', down(SiLU(x·W_gate) ⊙ x·W_up), ties to the lower index"
    ),
)
def moe_agrees_with_reference(impl, case):
    """moe agrees with the float64 reference (1e-10 in float64, the dtype tolerance otherwise, at the size of the
    experts' terms); without a documented tie rule, on the tokens with no tie at the top-k boundary.

    The reference's GELU experts use the declared GELU_FORM, or either form for the whole call where none is declared.
    """
    shape, x, router, experts = _moe_case(impl, case, moe_shapes())
    k = shape.k
    call = f"moe(x, router, experts, k={k})"
    got = assert_shape(impl.moe(x, router, experts, k), x.shape, "moe(x, router, experts, k)", call)
    compared = np.ones(len(x), dtype=bool)
    if not _follows_tie_rule(impl):
        compared = ~_boundary_tied(impl.as_seen(x) @ impl.as_seen(router), k)  # (N,)
    tol = _at_expert_scale(agreement_tolerance(rounding_dtype(impl)), impl, x, experts)
    if expert_function(impl) == "swiglu":  # no GELU anywhere
        assert_close(got[compared], reference_answer(impl, "moe", x, router, experts, k)[compared], "moe(x, router, experts, k)", tol, call)
        return
    answers = {form: expected[compared] for form, expected in reference_answers(impl, "moe", x, router, experts, k).items()}  # (N', d)
    assert_close_to_a_gelu_form(impl, got[compared], answers, "moe(x, router, experts, k)", tol, call,
                                other_answer=lambda form: reference_answer(impl, "moe", x, router, experts, k, gelu_form=form)[compared])
