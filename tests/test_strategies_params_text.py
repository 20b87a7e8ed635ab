"""The params and text strategies: each bad argument is refused by name, and the edge cases are generated."""

import numpy as np
import pytest
from hypothesis import Phase, find, given, settings

import invariants.reference.numpy as ref
from invariants.strategies._validation import InvalidArgument
from invariants.strategies.params import (
    ATTENTION_BIAS_NAMES,
    GPTConfig,
    block_params,
    gpt_configs,
    gpt_params,
    init_block_params,
    init_gpt_params,
    token_ids,
)
from invariants.strategies.text import corpora, token_streams, window_lengths

FIND = settings(database=None, max_examples=2000, phases=[Phase.generate])  # find an example; no need to shrink it

BAD_ARGUMENTS = [  # (strategy, args, kwargs, what the message must contain)
    (block_params, (0,), {}, "d_model=0 must be at least 1"),
    (block_params, (2.5,), {}, "d_model=2.5 must be an int"),
    (block_params, (4,), {"d_ff": 0}, "d_ff=0 must be at least 1"),
    (block_params, (4,), {"attn_bias": "yes"}, "attn_bias='yes' must be True, False or None"),
    (block_params, (4,), {"attn_bias": 1}, "attn_bias=1 must be True, False or None"),
    (gpt_configs, (), {"min_vocab": 0}, "min_vocab=0 must be at least 1"),
    (gpt_configs, (), {"min_vocab": 5, "max_vocab": 3}, "min_vocab=5 is larger than max_vocab=3"),
    (gpt_configs, (), {"min_max_len": 0}, "min_max_len=0 must be at least 1"),
    (gpt_configs, (), {"min_layers": -1}, "min_layers=-1 must be at least 0"),
    (gpt_configs, (), {"min_heads": 3, "max_heads": 2}, "min_heads=3 is larger than max_heads=2"),
    (gpt_configs, (), {"max_d_head": 0}, "max_d_head=0 must be at least 1"),
    (gpt_configs, (), {"attn_bias": "both"}, "attn_bias='both' must be True, False or None"),
    (gpt_configs, (), {"ff_ratio": 0}, "ff_ratio=0 must be at least 1"),
    (gpt_configs, (), {"ff_ratio": 2.5}, "ff_ratio=2.5 must be an int"),
    (gpt_params, ("config",), {}, "config='config' must be a GPTConfig"),
    (token_ids, (0,), {}, "vocab=0 must be at least 1"),
    (token_ids, (5,), {"min_batch": 0}, "min_batch=0 must be at least 1"),
    (token_ids, (5,), {"min_seq": 4, "max_seq": 2}, "min_seq=4 is larger than max_seq=2"),
    (corpora, (), {"min_size": -1}, "min_size=-1 must be at least 0"),
    (corpora, (), {"min_size": 5, "max_size": 2}, "min_size=5 is larger than max_size=2"),
    (token_streams, (), {"min_vocab": 0}, "min_vocab=0 must be at least 1"),
    (token_streams, (), {"min_length": 9, "max_length": 3}, "min_length=9 is larger than max_length=3"),
    (window_lengths, (1,), {}, "n_tokens=1 must be at least 2"),
    (window_lengths, (5,), {"min_seq": 0}, "min_seq=0 must be at least 1"),
    (window_lengths, (5,), {"max_seq": 5}, "max_seq=5 is larger than n_tokens - 1=4"),
]


@pytest.mark.parametrize("strategy, args, kwargs, message", BAD_ARGUMENTS, ids=lambda v: v if isinstance(v, str) else None)
def test_bad_argument_is_refused_by_name_when_the_strategy_is_built(strategy, args, kwargs, message):
    with pytest.raises(InvalidArgument) as refused:
        strategy(*args, **kwargs)  # refused at once, not at the first draw
    assert message in str(refused.value)


def test_block_params_have_the_protocol_keys_and_shapes():
    params = init_block_params(3, seed=0, attn_bias=True)
    shapes = {name: value.shape for name, value in params.items()}
    assert shapes == {
        "ln1_g": (3,), "ln1_b": (3,), "W_q": (3, 3), "W_k": (3, 3), "W_v": (3, 3), "W_o": (3, 3),
        "ln2_g": (3,), "ln2_b": (3,), "W1": (3, 12), "b1": (12,), "W2": (12, 3), "b2": (3,),
        "b_q": (3,), "b_k": (3,), "b_v": (3,), "b_o": (3,),
    }
    assert init_block_params(3, seed=0, d_ff=5)["W1"].shape == (3, 5)


def test_block_params_draw_both_with_and_without_attention_biases():
    find(block_params(4), lambda p: set(ATTENTION_BIAS_NAMES) <= p.keys(), settings=FIND)
    find(block_params(4), lambda p: not set(ATTENTION_BIAS_NAMES) & p.keys(), settings=FIND)


def test_gpt_params_are_reproducible_from_the_seed_and_sized_like_the_count():
    config = GPTConfig(vocab=7, max_len=5, n_layers=2, n_heads=2, d_head=3, attn_bias=True)
    a, b = init_gpt_params(config, 11), init_gpt_params(config, 11)
    assert np.array_equal(a["wte"], b["wte"]) and np.array_equal(a["blocks"][1]["W2"], b["blocks"][1]["W2"])
    size = a["wte"].size + a["wpe"].size + a["lnf_g"].size + a["lnf_b"].size + sum(v.size for blk in a["blocks"] for v in blk.values())
    assert size == ref.gpt_param_count(7, 6, 2, 5, True)


@pytest.mark.parametrize(
    "edge, predicate",
    [
        ("d_model 1 (one head of width 1)", lambda c: c.d_model == 1),
        ("max_len 1", lambda c: c.max_len == 1),
        ("no blocks", lambda c: c.n_layers == 0),
        ("attention biases", lambda c: c.attn_bias),
        ("no attention biases", lambda c: not c.attn_bias),
    ],
)
def test_gpt_configs_generate_the_edge_cases(edge, predicate):
    find(gpt_configs(min_layers=0), predicate, settings=FIND)


@given(gpt_configs(min_layers=0).flatmap(lambda c: gpt_params(c).map(lambda p: (c, p))))
@settings(max_examples=50, database=None)
def test_gpt_params_match_their_config(drawn):
    config, params = drawn
    assert params["wte"].shape == (config.vocab, config.d_model) and params["wpe"].shape == (config.max_len, config.d_model)
    assert len(params["blocks"]) == config.n_layers
    assert all(block["W1"].shape == (config.d_model, 4 * config.d_model) for block in params["blocks"])  # GPT-2's width


@given(gpt_configs(min_layers=1, ff_ratio=2).flatmap(gpt_params))
@settings(max_examples=20, database=None)
def test_gpt_params_take_the_configs_feed_forward_ratio(params):
    d = params["wte"].shape[1]
    assert all(block["W1"].shape == (d, 2 * d) and block["W2"].shape == (2 * d, d) for block in params["blocks"])


@pytest.mark.parametrize(
    "edge, predicate",
    [
        ("one id repeated over a long sequence", lambda ids: ids.size >= 4 and len(np.unique(ids)) == 1),
        ("both extreme ids", lambda ids: {0, 9} <= set(ids.ravel().tolist())),
        ("one token", lambda ids: ids.shape == (1, 1)),
    ],
)
def test_token_ids_generate_the_edge_cases(edge, predicate):
    find(token_ids(10), predicate, settings=FIND)


@given(token_ids(6, min_batch=2, max_batch=2, min_seq=3, max_seq=5))
@settings(max_examples=50, database=None)
def test_token_ids_stay_in_range_and_shape(ids):
    assert ids.dtype == np.int64 and ids.shape[0] == 2 and 3 <= ids.shape[1] <= 5
    assert ids.min() >= 0 and ids.max() < 6


@pytest.mark.parametrize(
    "edge, predicate",
    [
        ("the empty text", lambda t: t == ""),
        ("one character repeated", lambda t: len(t) >= 3 and len(set(t)) == 1),
        ("a newline", lambda t: "\n" in t),
        ("a combining accent", lambda t: "\u0301" in t),
        ("a character outside the BMP", lambda t: any(ord(ch) > 0xFFFF for ch in t)),
    ],
)
def test_corpora_generate_the_edge_cases(edge, predicate):
    find(corpora(), predicate, settings=FIND)


@pytest.mark.parametrize(
    "edge, predicate",
    [
        ("distinct ids", lambda s: len(s) >= 5 and len(np.unique(s)) == len(s)),
        ("one repeated id", lambda s: len(s) >= 5 and len(np.unique(s)) == 1),
    ],
)
def test_token_streams_generate_the_edge_cases(edge, predicate):
    find(token_streams(), predicate, settings=FIND)


def test_window_lengths_reach_the_single_window_edge():
    find(window_lengths(10), lambda seq: seq == 9, settings=FIND)
    find(window_lengths(10), lambda seq: seq == 1, settings=FIND)
