"""Invariants of the parameter and compute arithmetic: exact GPT-2 counts, the params tree, 12·L·d², 2N, 6ND, MoE counts.

The laws of counting that hold for any config (one vocabulary row per token, a mixture's total
minus what a token uses, active = total when k = E) are checked here on an implementation's
gpt_param_count and moe_* functions; the suite's own accounting from config.json files
(Llama, Mistral, Qwen2, Mixtral, DeepSeek: the accounting package) is checked in
tests/test_accounting.py, since no protocol function takes a config.
"""

from __future__ import annotations

import numpy as np
from hypothesis import strategies as st

from invariants.asserts import assert_close, assert_value, assert_where
from invariants.conventions import declared_skip
from invariants.laws.moe import moe_params_for
from invariants.registry import invariant
from invariants.strategies.core import integers
from invariants.strategies.params import gpt_configs, gpt_params
from invariants.tolerance import Tolerance

LESSON = 160  # where a lesson meets this component: the registry's order (test ids, the kill matrix's first failure)
HOLDS = ("gpt_param_count", "moe_n_params", "moe_active_params", "inference_flops_per_token", "training_flops")  # whose laws it holds

GPT2_VOCAB, GPT2_MAX_LEN = 50_257, 1_024
# name: ((vocab, d_model, n_layers, max_len, attn_bias), exact count as transformers reports it, tied head counted once)
KNOWN_COUNTS = {
    "TinyGPT": ((50, 32, 2, 16, False), 27_328),  # the lesson's model
    "GPT-2 small": ((GPT2_VOCAB, 768, 12, GPT2_MAX_LEN, True), 124_439_808),
    "GPT-2 small without attention biases": ((GPT2_VOCAB, 768, 12, GPT2_MAX_LEN, False), 124_402_944),
    "GPT-2 medium": ((GPT2_VOCAB, 1024, 24, GPT2_MAX_LEN, True), 354_823_168),
    "GPT-2 large": ((GPT2_VOCAB, 1280, 36, GPT2_MAX_LEN, True), 774_030_080),
    "GPT-2 XL": ((GPT2_VOCAB, 1600, 48, GPT2_MAX_LEN, True), 1_557_611_200),
}
# Float answers to integer arithmetic: a float implementation rounds 2N or 6ND once or twice, at ~1e-16.
ARITHMETIC = Tolerance(rtol=1e-12, atol=0.0, dtype="float64")
# Drawn every example, so built once (a strategy built afresh is validated afresh): one real size, then any.
_TOKENS_ADDED = st.one_of(st.just(1), integers(1, 50_257))
_INFERENCE_PARAMS = st.one_of(st.just(7e9), integers(1, 10**12))  # N
_TRAINING_RUNS = st.one_of(st.just((175e9, 300e9)), st.tuples(integers(1, 10**9), integers(1, 10**9)))  # (N, D)


def _signature(args):
    return f"gpt_param_count({', '.join(map(repr, args))})"


@invariant(
    requires=("gpt_param_count",),
    hint="a part is missing or counted twice: the attention biases (4d per block, which GPT-2 has), the position table "
         "(max_len·d), the final LayerNorm (2d), or the tied head (V·d, counted once: it is wte)",
)
def gpt2_exact_counts(impl, case):
    """gpt_param_count is exact: TinyGPT 27,328; GPT-2 small 124,439,808 (124,402,944 without attention biases),
    medium 354,823,168, large 774,030,080 and XL 1,557,611,200."""
    for name, (args, count) in KNOWN_COUNTS.items():
        assert_value(impl.gpt_param_count(*args), count, f"parameter count of {name}", _signature(args))


def _tree_sizes(params):
    """Array sizes of a params tree, by part."""
    return {
        "wte": params["wte"].size,
        "wpe": params["wpe"].size,
        "blocks": sum(array.size for block in params["blocks"] for array in block.values()),
        "final norm": params["lnf_g"].size + params["lnf_b"].size,
    }


@invariant(
    requires=("gpt_param_count",),
    hint="the count leaves out or double-counts a part of the model: compare it part by part with the params tree "
         "(wte V·d, wpe max_len·d, 12d² + 13d per block (9d without attention biases), final norm 2d)",
)
def count_matches_params_tree(impl, case):
    """gpt_param_count equals the total size of the params tree the suite feeds gpt_logits, with and without attention biases."""
    config = case.draw(gpt_configs(min_vocab=1, max_vocab=40, max_max_len=12, min_layers=0, max_layers=3), "config")
    sizes = _tree_sizes(case.draw(gpt_params(config), "params"))
    args = (config.vocab, config.d_model, config.n_layers, config.max_len, config.attn_bias)
    parts = " + ".join(f"{part} {size}" for part, size in sizes.items())
    assert_value(impl.gpt_param_count(*args), sum(sizes.values()), "parameter count", f"{_signature(args)}; the tree holds {parts}")


@invariant(
    requires=("gpt_param_count",),
    hint="the tied output layer is counted as a table of its own (V·d more: an untied head, or a state dict that lists lm_head.weight "
         "beside wte) or given a bias (V more): with tied embeddings each token of the vocabulary adds one row of d",
)
def vocabulary_adds_one_row(impl, case):
    """Each token added to the vocabulary adds exactly d_model parameters to gpt_param_count: one row of the table that is
    both the embedding and the tied output layer."""
    config = case.draw(gpt_configs(min_vocab=1, max_vocab=40, max_max_len=12, min_layers=0, max_layers=3), "config")
    added = case.draw(_TOKENS_ADDED, "tokens added")
    args = (config.vocab, config.d_model, config.n_layers, config.max_len, config.attn_bias)
    grown = (config.vocab + added, *args[1:])
    gap = np.asarray(impl.gpt_param_count(*grown)) - np.asarray(impl.gpt_param_count(*args))
    what = f"gpt_param_count at vocab {grown[0]} minus at vocab {args[0]} (d_model {config.d_model} per token added)"
    assert_value(gap, added * config.d_model, what, f"{_signature(grown)} - {_signature(args)}")


@invariant(
    requires=("gpt_param_count",),
    hint="the count is far from 12·L·d² + V·d: the 12d² per block (4d² attention + 8d² feed-forward) or the tied "
         "embedding V·d is miscounted (a head counted twice adds V·d, 31% of GPT-2 small)",
)
def twelve_l_d_squared_rule(impl, case):
    """12·L·d² + V·d underestimates every GPT-2's count by less than 0.75% (0.73% for small, which the course rounds to 0.7%)."""
    sizes = {name: args for name, (args, _) in KNOWN_COUNTS.items() if name.startswith("GPT-2") and args[4]}
    counts = np.array([float(np.asarray(impl.gpt_param_count(*args))) for args in sizes.values()])  # (4,)
    rules = np.array([12 * layers * d * d + vocab * d for vocab, d, layers, _, _ in sizes.values()], dtype=np.float64)  # (4,)
    gaps = (counts - rules) / counts  # the positions, biases and norms the rule leaves out
    what = f"(count - (12·L·d² + V·d)) / count for {', '.join(sizes)}"
    call = "; ".join(_signature(args) for args in sizes.values())
    assert_where((gaps > 0) & (gaps < 0.0075), gaps, what, "in (0, 0.0075)", call)


@invariant(
    requires=("inference_flops_per_token",),
    hint="generating one token costs one multiply and one add per weight: 2·N, not N or 6·N",
)
def inference_flops_rule(impl, case):
    """inference_flops_per_token(N) = 2·N (a 7B model: 1.4e10 per token)."""
    n_params = case.draw(_INFERENCE_PARAMS, "N")
    got = np.asarray(impl.inference_flops_per_token(n_params), dtype=np.float64)
    assert_close(got, 2.0 * n_params, "inference FLOPs per token", ARITHMETIC, f"inference_flops_per_token({n_params!r})")


@invariant(
    requires=("training_flops",),
    hint="training counts the forward pass only (2·N·D): the backward pass costs twice the forward, so training is 6·N·D",
)
def training_flops_rule(impl, case):
    """training_flops(N, D) = 6·N·D (GPT-3, 175e9 parameters on 300e9 tokens: 3.15e23)."""
    n_params, n_tokens = case.draw(_TRAINING_RUNS, "(N, D)")
    got = np.asarray(impl.training_flops(n_params, n_tokens), dtype=np.float64)
    expected = 6 * n_params * n_tokens  # integers below 2**63, so an int64 answer is exact too; 3.15e23 for GPT-3
    assert_close(got, float(expected), "training FLOPs", ARITHMETIC, f"training_flops({n_params!r}, {n_tokens!r})")


# The closed forms below count the protocol's experts, GELU networks of 8d² + 5d; moe_count_matches_params counts whatever is drawn.
_GELU_EXPERTS_ONLY = declared_skip("EXPERT_FFN", lambda form: form == "swiglu", "the closed-form counts are of GELU experts (8d² + 5d)")


@invariant(
    requires=("moe_n_params", "moe_active_params"),
    applies=_GELU_EXPERTS_ONLY,
    hint="the active count includes every expert instead of the k chosen, the router (d·E, no bias) is left out, "
         "or an expert is not a 4× feed-forward network of 8d² + 5d",
)
def moe_known_counts(impl, case):
    """At d 16 with 8 experts the layer has 17,152 parameters and a token with k = 2 uses 4,384; one expert at d 8 is 552 + the router's 8."""
    assert_value(impl.moe_n_params(16, 8), 17_152, "moe_n_params", "moe_n_params(16, 8)")
    assert_value(impl.moe_active_params(16, 8, 2), 4_384, "moe_active_params", "moe_active_params(16, 8, 2)")
    assert_value(impl.moe_n_params(8, 1) - 8, 552, "moe_n_params(8, 1) - 8 (one feed-forward network)", "moe_n_params(8, 1)")


@invariant(
    requires=("moe_n_params", "moe_active_params"),
    applies=_GELU_EXPERTS_ONLY,
    hint="the MoE count is not router + experts: a (d, E) router and E feed-forward networks of 8d² + 5d each, "
         "of which a token uses k (an active count of every expert is the total)",
)
def moe_counts_by_part(impl, case):
    """moe_n_params(d, E) = d·E + E·(8d² + 5d) and moe_active_params(d, E, k) = d·E + k·(8d² + 5d)."""
    d = case.draw(integers(1, 512), "d")
    n_experts = case.draw(integers(1, 64), "E")
    k = case.draw(integers(1, n_experts), "k")
    expert = 8 * d * d + 5 * d  # W1 (d, 4d), b1, W2 (4d, d), b2
    router = d * n_experts
    assert_value(impl.moe_n_params(d, n_experts), router + n_experts * expert, "moe_n_params", f"moe_n_params({d}, {n_experts})")
    assert_value(impl.moe_active_params(d, n_experts, k), router + k * expert, "moe_active_params", f"moe_active_params({d}, {n_experts}, {k})")


def _expert_size(d):
    """Parameters of one expert at width d: a 4× feed-forward network, W1 (d, 4d), b1, W2 (4d, d), b2."""
    return 8 * d * d + 5 * d


@invariant(
    requires=("moe_n_params",),
    hint="the count leaves out or double-counts part of the layer the suite builds: the (d, E) router, or one of the E experts "
         "(W1 (d, 4d), b1 (4d,), W2 (4d, d), b2 (d,) each), or the E experts counted as one network",
)
def moe_count_matches_params(impl, case):
    """moe_n_params(d, E) equals the total size of the router and the E experts the suite feeds moe."""
    d = case.draw(integers(1, 16), "d")
    n_experts = case.draw(integers(1, 8), "E")
    params = case.draw(moe_params_for(impl, d, n_experts), "params")
    router = params["router"].size
    experts = sum(array.size for expert in params["experts"] for array in expert.values())
    call = f"moe_n_params({d}, {n_experts}); the layer holds router {router} + experts {experts}"
    assert_value(impl.moe_n_params(d, n_experts), router + experts, "moe_n_params", call)


@invariant(
    requires=("moe_n_params", "moe_active_params"),
    applies=_GELU_EXPERTS_ONLY,
    hint="the mixture is counted as one feed-forward network (its E experts as one), or the router is in one count and not the other: "
         "the layer holds E experts of 8d² + 5d, a token uses k of them, and both counts hold the whole router",
)
def mixture_total_minus_active(impl, case):
    """A mixture's total minus what a token uses is the E − k experts it skips:
    moe_n_params(d, E) − moe_active_params(d, E, k) = (E − k)·(8d² + 5d)."""
    d = case.draw(integers(1, 512), "d")
    n_experts = case.draw(integers(2, 64), "E")
    k = case.draw(integers(1, n_experts), "k")
    gap = np.asarray(impl.moe_n_params(d, n_experts)) - np.asarray(impl.moe_active_params(d, n_experts, k))
    what = f"moe_n_params - moe_active_params (E - k = {n_experts - k} experts of {_expert_size(d)} unused)"
    assert_value(gap, (n_experts - k) * _expert_size(d), what, f"moe_n_params({d}, {n_experts}) - moe_active_params({d}, {n_experts}, {k})")


@invariant(
    requires=("moe_n_params", "moe_active_params"),
    applies=_GELU_EXPERTS_ONLY,
    hint="the active count leaves out the router (every token's scores use all of its d·E weights) or counts something the total "
         "does not: with k = E a token uses every parameter of the layer",
)
def active_equals_total_when_all_chosen(impl, case):
    """moe_active_params(d, E, k) <= moe_n_params(d, E) for every k, with equality at k = E: a token sent to every expert uses the whole layer."""
    d = case.draw(integers(1, 512), "d")
    n_experts = case.draw(integers(1, 64), "E")
    k = case.draw(integers(1, n_experts), "k")
    total = np.asarray(impl.moe_n_params(d, n_experts))
    actives = np.array([np.asarray(impl.moe_active_params(d, n_experts, j)) for j in (1, k, n_experts)])  # (3,)
    calls = f"moe_active_params({d}, {n_experts}, k) for k = 1, {k}, {n_experts}; moe_n_params({d}, {n_experts}) = {total}"
    assert_where(actives <= total, actives, "moe_active_params", f"<= moe_n_params = {total}", calls)
    assert_value(actives[-1], total.item(), f"moe_active_params with k = E ({n_experts})", calls)
