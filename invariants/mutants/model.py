"""Broken models: positions from the end, an untied head, no final norm, no input check, unmasked blocks."""

import numpy as np

from invariants.mutants import mutant
from invariants.mutants.attention import _buffered_future, _finish, _masked_softmax, _qkv, _scores
from invariants.reference.numpy import check_token_ids, layer_norm, transformer_block


def _stream(x, params, n_heads, causal=True):
    for block in params["blocks"]:
        x = transformer_block(x, block, n_heads, causal)
    return x


@mutant(replaces="gpt_logits", killed_by="model.positions_from_start", bug="the position table is indexed from the end: wpe[-T:]")
def positions_from_end_gpt(ids, params, n_heads):
    wte, wpe = params["wte"], params["wpe"]
    check_token_ids(ids, vocab=wte.shape[0], max_len=wpe.shape[0])
    x = _stream(wte[ids] + wpe[-ids.shape[1]:], params, n_heads)
    return layer_norm(x, params["lnf_g"], params["lnf_b"]) @ wte.T


@mutant(also_named_by=("model.final_norm",),
        replaces="gpt_logits", killed_by="model.tied_output", bug="an untied head: a separately initialised (d, V) projection")
def untied_head_gpt(ids, params, n_heads):
    wte, wpe = params["wte"], params["wpe"]
    check_token_ids(ids, vocab=wte.shape[0], max_len=wpe.shape[0])
    x = _stream(wte[ids] + wpe[: ids.shape[1]], params, n_heads)
    head = np.random.default_rng(0).standard_normal(wte.T.shape) / np.sqrt(wte.shape[1])  # (d, V), like nn.Linear(d, V)
    return layer_norm(x, params["lnf_g"], params["lnf_b"]) @ head


@mutant(replaces="gpt_logits", killed_by="model.final_norm", bug="the final LayerNorm is missing: logits = h·wteᵀ")
def no_final_norm_gpt(ids, params, n_heads):
    wte, wpe = params["wte"], params["wpe"]
    check_token_ids(ids, vocab=wte.shape[0], max_len=wpe.shape[0])
    return _stream(wte[ids] + wpe[: ids.shape[1]], params, n_heads) @ wte.T


@mutant(replaces="gpt_logits", killed_by="model.refuses_bad_ids", bug="no input check: negative ids wrap around, ids >= vocab fail with IndexError")
def unchecked_gpt(ids, params, n_heads):
    wte, wpe = params["wte"], params["wpe"]
    x = _stream(wte[ids] + wpe[: ids.shape[1]], params, n_heads)
    return layer_norm(x, params["lnf_g"], params["lnf_b"]) @ wte.T


@mutant(also_named_by=("model.prefix_consistency",),
        replaces="gpt_logits", killed_by="model.causal_non_leakage", bug="the blocks run with causal=False (the decoder sees the future)")
def unmasked_gpt(ids, params, n_heads):
    wte, wpe = params["wte"], params["wpe"]
    check_token_ids(ids, vocab=wte.shape[0], max_len=wpe.shape[0])
    x = _stream(wte[ids] + wpe[: ids.shape[1]], params, n_heads, causal=False)
    return layer_norm(x, params["lnf_g"], params["lnf_b"]) @ wte.T


@mutant(
    replaces="attention",
    killed_by="model.causal_non_leakage",
    also_named_by=("attention.causal_non_leakage", "attention.causal_weights_pattern"),  # "a buffer for a fixed block size"
    bug="the model's attention masks with a buffer built for a block size of 64 (nanoGPT's bias[:, :, :T, :T] padded past it): "
    "right up to 64 tokens, nothing masked beyond",
)
def model_mask_buffer_for_64_tokens(x, W_q, W_k, W_v, W_o, n_heads, causal=True, **biases):
    q, k, v = _qkv(x, W_q, W_k, W_v, n_heads, biases)
    weights = _masked_softmax(_scores(q, k), causal, _buffered_future(x.shape[1], 64))  # BUG: see _buffered_future
    return _finish(weights, v, W_o, biases)
