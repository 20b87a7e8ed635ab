"""`strategies` exports every public strategy of its modules, version 2's included, and each draws a valid example."""

import importlib
import inspect
import pkgutil

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import invariants.strategies
import strategies
from invariants.reference import numpy as R


def _public_strategies():
    """{name: function} of every function a module of invariants/strategies defines, not underscored, that returns a SearchStrategy."""
    found = {}
    for module_info in pkgutil.iter_modules(invariants.strategies.__path__):
        module = importlib.import_module(f"invariants.strategies.{module_info.name}")
        for name, value in vars(module).items():
            if inspect.isfunction(value) and value.__module__ == module.__name__ and not name.startswith("_"):
                if str(inspect.signature(value).return_annotation).startswith("SearchStrategy"):
                    found[name] = value
    return found


PUBLIC = _public_strategies()


def _finite(*answers):
    return all(np.isfinite(np.asarray(part, dtype=np.float64)).all() for part in answers)


def _llama_inputs(draw):
    """A Llama config, its params and ids of a few tokens."""
    config = draw(strategies.llama_configs())
    ids = draw(strategies.token_ids(config.vocab, max_batch=2, max_seq=4))
    return config, draw(strategies.llama_params(config)), ids


def _block_input(config, ids):
    return np.ones(ids.shape + (config.d_model,)) / 2


# name -> draw -> whether the example is valid: a call of the reference on it answers finite, or the value is what the docstring says
VALID = {
    "rope_inputs": lambda draw: _finite(R.rope(**draw(strategies.rope_inputs()))),
    "gqa_inputs": lambda draw: _finite(*R.gqa_attention(*strategies.gqa_args(draw(strategies.gqa_inputs())))),
    "gqa_shapes": lambda draw: (lambda s: s.n_heads % s.n_kv_heads == 0 and s.keys >= s.seq)(draw(strategies.gqa_shapes())),
    "swiglu_inputs": lambda draw: _finite(R.swiglu(**draw(strategies.swiglu_inputs()))),
    "cross_inputs": lambda draw: _finite(*R.cross_attention(*strategies.cross_args(draw(strategies.cross_inputs())))),
    "qk_norm_inputs": lambda draw: _finite(*R.qk_norm_attention(*strategies.qk_norm_args(draw(strategies.qk_norm_inputs())))),
    "llama_configs": lambda draw: (lambda c: c.d_model == c.n_heads * c.d_head and c.d_head % 2 == 0)(draw(strategies.llama_configs())),
    "llama_params": lambda draw: (lambda c, p, ids: _finite(R.llama_logits(ids, p, c.n_heads, c.n_kv_heads, c.rope_base, c.window)))(
        *_llama_inputs(draw)),
    "llama_block_params": lambda draw: (lambda c, ids: _finite(R.llama_block(_block_input(c, ids), draw(strategies.llama_block_params(c)),
                                                                              c.n_heads, c.n_kv_heads, c.rope_base, c.window)))(
        *_llama_inputs(draw)[::2]),
    "decode_schedules": lambda draw: (lambda chunks: sum(chunks) == 5 and min(chunks) >= 1)(draw(strategies.decode_schedules(5))),
    "decoder_block_params": lambda draw: _finite(R.decoder_block(np.ones((1, 2, 4)) / 2, np.ones((1, 3, 4)) / 4,
                                                                 draw(strategies.decoder_block_params(4)), 2)),
    "attention_inputs": lambda draw: _finite(*R.attention(*strategies.attention_args(draw(strategies.attention_inputs())))),
    "block_params": lambda draw: _finite(R.transformer_block(np.ones((1, 2, 4)) / 2, draw(strategies.block_params(4)), 2)),
    "gpt_params": lambda draw: (lambda c: draw(strategies.gpt_params(c)) is not None)(draw(strategies.gpt_configs())),
    "norm_rows": lambda draw: (lambda x: (x.std(axis=-1) >= 0.1 * (1 - 1e-9)).all())(draw(strategies.norm_rows())),
    "targets": lambda draw: (lambda t: ((0 <= t) & (t < 5)).all())(draw(strategies.targets(np.zeros((2, 3, 5))))),
    "token_ids": lambda draw: (lambda ids: ((0 <= ids) & (ids < 7)).all())(draw(strategies.token_ids(7))),
    "window_lengths": lambda draw: 1 <= draw(strategies.window_lengths(10)) <= 9,
    "grouped_routing_inputs": lambda draw: _finite(R.grouped_top_k_gates(**draw(strategies.grouped_routing_inputs()))),
    "grouped_routing_shapes": lambda draw: (lambda s: s.experts % s.n_group == 0 and s.group_size >= 2 and s.topk_group <= s.n_group
                                            and s.k <= s.topk_group * s.group_size)(draw(strategies.grouped_routing_shapes())),
    "softmax_routing_inputs": lambda draw: _finite(R.softmax_top_k_gates(**draw(strategies.softmax_routing_inputs()))),
    "bias_update_inputs": lambda draw: _finite(R.expert_bias_update(**draw(strategies.bias_update_inputs()))),
    "masked_router_logits": lambda draw: _finite(R.top_k_gates(draw(strategies.masked_router_logits(3, 4, 3)), 3)),
    "position_runs": lambda draw: (lambda p: p.shape == (5,) and (p >= 0).all())(draw(strategies.position_runs(5))),
    "gemma_norm_inputs": lambda draw: _finite(R.gemma_rms_norm(**draw(strategies.gemma_norm_inputs()))),
    "scaled_embedding_inputs": lambda draw: _finite(R.scaled_embedding(**draw(strategies.scaled_embedding_inputs()))),
    "gemma_norm_weights": lambda draw: (lambda w: w.shape == (4,) and (np.abs(w) <= 0.5).all())(draw(strategies.gemma_norm_weights(4))),
    "loud_rows": lambda draw: (lambda x: np.abs(x).max() < 2048 and np.isfinite(x.astype(np.float16)).all())(
        draw(strategies.loud_rows(strategies.float_arrays((2, 3)), "float16"))),
}
# the arguments of the strategies that take some (any valid ones: these draw a value, which must not be None)
ARGUMENTS = {
    "byte_arrays": ((2, 3),), "grid_values": ((2, 3),), "float_arrays": ((2, 3),), "weights": ((3, 4),), "feed_forward_weights": (4,),
    "router_logits": (3, 4), "masked_router_logits": (3, 4, 3), "position_runs": (5,),
    "uniform_mean_router_logits": (4,), "moe_tokens": (3, 4), "moe_params": (4, 3), "gains_and_biases": (4,),
    "shifts": ((2, 3),), "routing_biases": (4,), "gemma_norm_weights": (4,), "alibi_slope_arrays": (4,), "sink_logits": (3,),
}


def test_every_public_strategy_of_the_modules_is_exported_from_strategies():
    missing = sorted(name for name in PUBLIC if name not in strategies.__all__)
    assert not missing, f"strategies.__all__ lacks {missing}: add them to invariants/strategies/__init__.py"
    assert all(getattr(strategies, name) is function for name, function in PUBLIC.items())
    assert {"rope_inputs", "gqa_inputs", "llama_configs", "decode_schedules", "cross_inputs", "qk_norm_inputs"} <= set(PUBLIC)


def test_every_exported_name_is_there():
    assert sorted(strategies.__all__) == sorted(set(strategies.__all__)) and all(hasattr(strategies, name) for name in strategies.__all__)


@pytest.mark.parametrize("name", sorted(PUBLIC))
def test_each_strategy_draws_a_valid_example(name):
    check = VALID.get(name) or (lambda draw: draw(PUBLIC[name](*ARGUMENTS.get(name, ()))) is not None)

    @settings(max_examples=5, deadline=None, database=None, suppress_health_check=list(HealthCheck))
    @given(st.data())
    def draws_validly(data):
        assert check(data.draw), f"strategies.{name} drew an example its own protocol function or docstring refuses"

    draws_validly()
