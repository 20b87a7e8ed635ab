"""Broken arithmetic: parts of the model left out or counted twice, 6ND written as 2ND, a mixture counted as one MLP or without its router."""

from invariants.mutants import mutant
from invariants.reference.counts import feed_forward_params


def _count(vocab, d, n_layers, max_len, attn_bias, *, positions=True, final_norm=True, biases=True, head=0):
    per_block = 12 * d * d + 9 * d + (4 * d if attn_bias and biases else 0)  # matrices, FFN biases and two norms (+ attention biases)
    return vocab * d + (max_len * d if positions else 0) + n_layers * per_block + (2 * d if final_norm else 0) + head


@mutant(replaces="gpt_param_count", killed_by="counts.gpt2_exact_counts", bug="the attention biases are not counted",
        also_named_by=("counts.count_matches_params_tree",))  # its hint: "(9d without attention biases)"
def no_attention_biases_count(vocab, d_model, n_layers, max_len, attn_bias=True):
    return _count(vocab, d_model, n_layers, max_len, attn_bias, biases=False)


@mutant(replaces="gpt_param_count", killed_by="counts.gpt2_exact_counts", bug="the position table is not counted",
        also_named_by=("counts.count_matches_params_tree",))  # its hint: "wpe max_len·d"
def no_positions_count(vocab, d_model, n_layers, max_len, attn_bias=True):
    return _count(vocab, d_model, n_layers, max_len, attn_bias, positions=False)


@mutant(replaces="gpt_param_count", killed_by="counts.count_matches_params_tree", bug="the final LayerNorm is not counted",
        also_named_by=("counts.gpt2_exact_counts",))  # "the final LayerNorm (2d)"
def no_final_norm_count(vocab, d_model, n_layers, max_len, attn_bias=True):
    return _count(vocab, d_model, n_layers, max_len, attn_bias, final_norm=False)


@mutant(replaces="gpt_param_count", killed_by="counts.twelve_l_d_squared_rule", bug="the tied head is counted a second time (V·d)")
def untied_head_count(vocab, d_model, n_layers, max_len, attn_bias=True):
    return _count(vocab, d_model, n_layers, max_len, attn_bias, head=vocab * d_model)


@mutant(replaces="training_flops", killed_by="counts.training_flops_rule", bug="6ND written as 2ND (the backward pass left out)")
def forward_only_training_flops(n_params, n_tokens):
    return 2 * n_params * n_tokens


@mutant(also_named_by=("counts.moe_counts_by_part",),
        replaces="moe_active_params", killed_by="counts.moe_known_counts", bug="every expert counted as active, not the k chosen")
def all_experts_active_params(d_model, n_experts, k):
    return d_model * n_experts + n_experts * feed_forward_params(d_model)


@mutant(replaces="gpt_param_count", killed_by="counts.vocabulary_adds_one_row",
        bug="the tied output layer counted as an nn.Linear(d, V) of its own, with a bias (V·d + V more)")
def tied_head_with_bias_count(vocab, d_model, n_layers, max_len, attn_bias=True):
    return _count(vocab, d_model, n_layers, max_len, attn_bias, head=vocab * d_model + vocab)


@mutant(replaces="moe_n_params", killed_by="counts.moe_count_matches_params", bug="the router's d·E weights are not counted")
def no_router_n_params(d_model, n_experts):
    return n_experts * feed_forward_params(d_model)


@mutant(also_named_by=("counts.moe_count_matches_params",),
        replaces="moe_n_params", killed_by="counts.mixture_total_minus_active",
        bug="the mixture counted as one feed-forward network: the router and a single expert")
def one_mlp_mixture_n_params(d_model, n_experts):
    return d_model * n_experts + feed_forward_params(d_model)


@mutant(replaces="moe_active_params", killed_by="counts.active_equals_total_when_all_chosen",
        bug="the active count leaves out the router (a token's scores use all of it)")
def no_router_active_params(d_model, n_experts, k):
    return k * feed_forward_params(d_model)
