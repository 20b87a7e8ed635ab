"""The modern decoder (protocol v2): twin references, strategies valid by construction, declared conventions that change what runs.

Every new invariant runs on the references in tests/test_reference_passes.py, and every new mutant
is killed by the invariant that names it in tests/test_mutants.py; this file covers the rest.
"""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from hypothesis import Phase, given, settings
from hypothesis import strategies as st

import invariants.reference.numpy as rn
from invariants import REGISTRY, Implementation, all_invariants, load_implementation, run_invariant
from invariants.conventions import Declared
from invariants.profiles import profile_settings
from invariants.protocol import FUNCTIONS, PROTOCOL_VERSION
from invariants.strategies import InvalidArgument
from invariants.strategies.decoder import (
    KEY_MASK_PATTERNS,
    LlamaConfig,
    _unused_by_rank,
    cross_inputs,
    decode_schedules,
    gqa_inputs,
    gqa_shapes,
    init_llama_params,
    key_mask_of,
    llama_configs,
    rope_inputs,
    swiglu_inputs,
)

torch = pytest.importorskip("torch", reason="the twin checks compare reference.numpy with reference.torch")
import invariants.reference.torch as rt  # noqa: E402

all_invariants()
CI = profile_settings("ci")
FEW = settings(max_examples=25, derandomize=True, database=None, deadline=None)
NEW_COMPONENTS = ("rope", "gqa", "masking", "swiglu", "llama", "decoding", "cross_attention")
NEW_FUNCTIONS = ("rope", "gqa_attention", "swiglu", "llama_block", "llama_logits", "llama_decode", "cross_attention", "decoder_block")


def _torch(value):
    if isinstance(value, dict):
        return {k: _torch(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_torch(v) for v in value]
    return torch.as_tensor(value) if isinstance(value, np.ndarray) else value


def _numpy(value):
    return tuple(_numpy(v) for v in value) if isinstance(value, tuple) else value.numpy()


def _assert_twins(name, *args):
    expected = getattr(rn, name)(*args)
    got = _numpy(getattr(rt, name)(*_torch(list(args))))
    for e, g in zip(expected if isinstance(expected, tuple) else (expected,), got if isinstance(got, tuple) else (got,), strict=True):
        np.testing.assert_allclose(g, e, rtol=1e-10, atol=1e-10)


# -- the protocol --------------------------------------------------------------------------------------------------------


def test_version_2_adds_the_decoder_and_keeps_every_version_1_function():
    assert PROTOCOL_VERSION == 2
    assert set(NEW_FUNCTIONS) <= set(FUNCTIONS)
    assert FUNCTIONS["attention"].params == ("x", "W_q", "W_k", "W_v", "W_o", "n_heads", "causal")  # unchanged
    assert FUNCTIONS["gqa_attention"].params == ("q", "k", "v", "causal", "key_mask", "window")
    assert FUNCTIONS["llama_decode"].params[-1] == "chunks"


def test_a_version_1_implementation_skips_the_decoder_with_the_reason():
    impl = Implementation.from_functions(backend="numpy", attention=rn.attention)
    outcome = run_invariant(REGISTRY["gqa.head_groups"], impl, settings=CI)
    assert outcome.status == "skipped" and outcome.reason == "functions does not provide gqa_attention (protocol v2)"


# -- the references are twins ------------------------------------------------------------------------------------------


@FEW
@given(rope_inputs(), st.sampled_from(rn.ROPE_PAIRINGS))
def test_rope_twins(inputs, pairing):
    x, positions, base = inputs["x"], inputs["positions"], inputs["base"]
    np.testing.assert_allclose(rt.rope(torch.as_tensor(x), torch.as_tensor(positions), base, pairing=pairing).numpy(),
                               rn.rope(x, positions, base, pairing=pairing), rtol=1e-12, atol=1e-12)


@FEW
@given(gqa_inputs())
def test_gqa_attention_twins(inputs):
    _assert_twins("gqa_attention", inputs["q"], inputs["k"], inputs["v"], inputs["causal"], inputs["key_mask"], inputs["window"])


@FEW
@given(swiglu_inputs())
def test_swiglu_twins(inputs):
    _assert_twins("swiglu", inputs["x"], inputs["W_gate"], inputs["W_up"], inputs["W_down"])


@FEW
@given(llama_configs(), st.integers(0, 2**32 - 1), st.data())
def test_llama_twins_and_decode(config, seed, data):
    params = init_llama_params(config, seed)
    ids = np.random.default_rng(seed).integers(0, config.vocab, size=(2, 5))
    chunks = data.draw(decode_schedules(5))
    args = (params, config.n_heads, config.n_kv_heads, config.rope_base, config.window)
    _assert_twins("llama_logits", ids, *args)
    _assert_twins("llama_decode", ids, *args, chunks)
    logits, held = rn.llama_decode(ids, *args, chunks)
    np.testing.assert_allclose(logits, rn.llama_logits(ids, *args), rtol=1e-10, atol=1e-10)
    expected = np.where(np.arange(5) < np.cumsum(chunks)[:, None], np.arange(5), -1)  # (n, T): positions 0 .. t - 1, then empty
    np.testing.assert_array_equal(held, np.broadcast_to(expected[:, None, None, :], (len(chunks), config.n_layers, config.n_kv_heads, 5)))


@FEW
@given(cross_inputs(), st.integers(0, 2**32 - 1))
def test_cross_attention_and_decoder_block_twins(inputs, seed):
    from invariants.strategies.decoder import init_decoder_block_params

    args = tuple(inputs[n] for n in ("x", "memory", "W_q", "W_k", "W_v", "W_o", "n_heads"))
    _assert_twins("cross_attention", *args)
    _assert_twins("decoder_block", inputs["x"], inputs["memory"], init_decoder_block_params(inputs["x"].shape[-1], seed), inputs["n_heads"])


def test_rope_known_values():
    # e_0 at position 1 with D = 4, base 10,000: half-split pairs (0, 2), interleaved pairs (0, 1); θ_0 = 1
    e0 = np.eye(4)[0][None, :]  # (T = 1, D = 4)
    np.testing.assert_allclose(rn.rope(e0, np.array([1]), pairing="half_split")[0], [np.cos(1), 0, np.sin(1), 0], atol=1e-15)
    np.testing.assert_allclose(rn.rope(e0, np.array([1]), pairing="interleaved")[0], [np.cos(1), np.sin(1), 0, 0], atol=1e-15)


def test_visible_keys_is_bottom_right_with_mistral_windows():
    # 2 queries over 4 keys: the queries sit at positions 2 and 3; a window of 2 keeps the two most recent keys
    np.testing.assert_array_equal(rn.visible_keys(2, 4, True, None), [[1, 1, 1, 0], [1, 1, 1, 1]])
    np.testing.assert_array_equal(rn.visible_keys(2, 4, True, 2), [[0, 1, 1, 0], [0, 0, 1, 1]])
    np.testing.assert_array_equal(rn.visible_keys(2, 4, False, None), np.ones((2, 4)))


def test_fully_masked_rows_are_zeros_or_uniform_never_nan():
    q, k, v = np.ones((1, 1, 2, 2)), np.ones((1, 1, 2, 2)), np.arange(4.0).reshape(1, 1, 2, 2)
    mask = np.array([[False, False]])
    out, weights = rn.gqa_attention(q, k, v, True, mask, None)
    assert (out == 0).all() and (weights == 0).all()
    out, weights = rn.gqa_attention(q, k, v, True, mask, None, fully_masked="uniform")
    np.testing.assert_array_equal(weights, 0.5)
    for dtype in (torch.float16, torch.bfloat16):
        out, weights = rt.gqa_attention(*(torch.as_tensor(a, dtype=dtype) for a in (q, k, v)), True, torch.as_tensor(mask), None)
        assert torch.isfinite(out).all() and (weights == 0).all()


# -- the strategies ----------------------------------------------------------------------------------------------------


@FEW
@given(gqa_inputs())
def test_gqa_inputs_are_valid_by_construction(inputs):
    q, k, v = inputs["q"], inputs["k"], inputs["v"]
    assert q.shape[1] % k.shape[1] == 0 and k.shape == v.shape and k.shape[2] >= q.shape[2]
    assert inputs["window"] is None or (inputs["causal"] and 1 <= inputs["window"] <= k.shape[2] + 1)
    assert inputs["key_mask"] is None or inputs["key_mask"].shape == (q.shape[0], k.shape[2])


@FEW
@given(rope_inputs(max_seq=6, max_position=7))
def test_rope_positions_are_distinct_and_in_range(inputs):
    positions = inputs["positions"]
    assert positions.dtype == np.int64 and len(set(positions.tolist())) == len(positions) == inputs["x"].shape[2]
    assert positions.min() >= 0 and positions.max() <= 7


def test_rope_positions_by_rank_reach_every_arrangement_once():
    # 3 distinct positions out of 0..4 in order: 5·4·3 arrangements, one for each rank tuple; ranks of 0 are a contiguous cache
    arrangements = {tuple(_unused_by_rank(list(r))) for r in itertools.product(range(5), range(4), range(3))}
    assert len(arrangements) == 60 and all(len(set(a)) == 3 and max(a) <= 4 for a in arrangements)
    assert _unused_by_rank([0, 0, 0]) == [0, 1, 2]


def test_rope_invariants_reject_few_examples():
    # drawn by rank, positions need no rejection: 200 examples cost about 200 calls, not the ~360 a unique list took
    impl = load_implementation("reference.numpy")
    outcome = run_invariant(REGISTRY["rope.agrees_with_reference"], impl, settings=settings(FEW, max_examples=200))
    assert outcome.passed and outcome.examples <= 220


@FEW
@given(st.integers(1, 9), st.data())
def test_decode_schedules_are_compositions(seq, data):
    min_chunks = data.draw(st.integers(1, seq))
    chunks = data.draw(decode_schedules(seq, min_chunks=min_chunks))
    assert chunks.dtype == np.int64 and (chunks >= 1).all() and chunks.sum() == seq and len(chunks) >= min_chunks


def _straddles(chunks, window):
    """A prefill shorter than w, then a chunk of 2 to w tokens that ends past position w - 1."""
    return len(chunks) >= 2 and chunks[0] < window and 2 <= chunks[1] <= window and chunks[0] + chunks[1] > window


@pytest.mark.parametrize("seq, window", [(3, 2), (6, 3), (6, 5)])
def test_decode_schedules_straddle_the_window_where_asked(seq, window):
    drawn = []

    @settings(CI, phases=[Phase.generate])  # the ci profile's derandomized draws, in order
    @given(decode_schedules(seq, straddling=window))
    def record(chunks):
        drawn.append(chunks)

    record()
    assert drawn and all(_straddles(c, window) for c in drawn), drawn


@FEW
@given(st.integers(1, 9), st.sampled_from([None, 1, 2]), st.sampled_from([None, 1, 3]), st.data())
def test_decode_schedules_keep_to_the_declared_limits(seq, max_chunk, max_prefill, data):
    chunks = data.draw(decode_schedules(seq, max_prefill=max_prefill, max_chunk=max_chunk))
    assert chunks.sum() == seq and (chunks >= 1).all()
    assert max_prefill is None or chunks[0] <= max_prefill
    assert max_chunk is None or (chunks[1:] <= max_chunk).all()


@FEW
@given(llama_configs())
def test_llama_configs_are_valid(config):
    assert isinstance(config, LlamaConfig) and config.d_head % 2 == 0 and config.d_model == config.n_heads * config.d_head


def test_key_mask_patterns_include_fully_padded_rows():
    rng = np.random.default_rng(0)
    assert not key_mask_of("one item fully padded", 2, 3, rng)[0].any()
    left = key_mask_of("left padding", 64, 4, rng)
    assert (~left).all(axis=1).any() and left.all(axis=1).any()  # some items fully padded, some not at all
    assert set(KEY_MASK_PATTERNS) == {"random", "left padding", "right padding", "one item fully padded"}


BAD = [
    (lambda: gqa_shapes(min_group=3, max_group=2), "min_group=3 is larger than max_group=2; lower min_group or raise max_group"),
    (lambda: gqa_shapes(max_cached=-1), "max_cached=-1 must be at least 0"),
    (lambda: gqa_inputs(causal=False, windowed=True), "windowed=True needs causal attention"),
    (lambda: gqa_inputs(patterns=("diagonal",)), "pattern='diagonal' is not one of"),
    (lambda: gqa_inputs(masked="yes"), "masked='yes' must be True, False, or None to draw it"),
    (lambda: rope_inputs(bases=()), "bases=() is empty"),
    (lambda: rope_inputs(max_seq=8, max_position=3), "max_position=3 must be at least 7"),
    (lambda: rope_inputs(bases=(1.0,)), "base=1.0 must be at least 1.0000001"),
    (lambda: decode_schedules(0), "seq=0 must be at least 1"),
    (lambda: decode_schedules(3, min_chunks=4), "min_chunks=4"),
    (lambda: llama_configs(min_group=0), "min_group=0 must be at least 1"),
    (lambda: llama_configs(min_window=3, max_window=2), "min_window=3 is larger than max_window=2"),
    (lambda: decode_schedules(3, max_chunk=0), "max_chunk=0 must be at least 1"),
    (lambda: decode_schedules(3, straddling=3), "straddling=3 needs 2 <= w < seq=3"),
    (lambda: swiglu_inputs(min_d_ff=0), "min_d_ff=0 must be at least 1"),
]


@pytest.mark.parametrize("build, message", BAD, ids=[m for _, m in BAD])
def test_bad_strategy_arguments_are_named(build, message):
    with pytest.raises(InvalidArgument) as info:
        build()
    assert str(info.value).startswith(message), str(info.value)


# -- declared conventions change what runs, never what is true -------------------------------------------------------------


def _impl(label, **functions_and_declarations):
    namespace = type(label, (), {k: staticmethod(v) if callable(v) else v for k, v in functions_and_declarations.items()})
    return Implementation(namespace, label=label, backend="numpy")


def _status(name, impl):
    return run_invariant(REGISTRY[name], impl, settings=CI).status


def _interleaved_rope(x, positions, base):
    return rn.rope(x, positions, base, pairing="interleaved")


def test_rope_pairing_declarations():
    assert _status("rope.pairing_anchor", _impl("interleaved", rope=_interleaved_rope, ROPE_PAIRING="interleaved")) == "passed"
    assert _status("rope.pairing_anchor", _impl("undeclared", rope=_interleaved_rope)) == "passed"  # either pairing
    assert _status("rope.pairing_anchor", _impl("wrong", rope=_interleaved_rope, ROPE_PAIRING="half_split")) == "failed"
    assert _status("rope.agrees_with_reference", _impl("wrong", rope=_interleaved_rope, ROPE_PAIRING="half_split")) == "failed"


def _uniform_gqa(q, k, v, causal, key_mask, window):
    return rn.gqa_attention(q, k, v, causal, key_mask, window, fully_masked="uniform")


def test_fully_masked_rows_declarations():
    assert _status("masking.fully_masked_rows", _impl("uniform", gqa_attention=_uniform_gqa, FULLY_MASKED_ROWS="uniform")) == "passed"
    assert _status("masking.fully_masked_rows", _impl("any", gqa_attention=_uniform_gqa, FULLY_MASKED_ROWS="any")) == "passed"
    assert _status("masking.fully_masked_rows", _impl("undeclared", gqa_attention=_uniform_gqa)) == "failed"  # the default is zeros
    assert _status("gqa.agrees_with_reference", _impl("uniform", gqa_attention=_uniform_gqa, FULLY_MASKED_ROWS="uniform")) == "passed"


def _top_left_gqa(q, k, v, causal, key_mask, window):
    T, S = q.shape[2], k.shape[2]
    assert T == S, "a top-left implementation is drawn with as many queries as keys"
    return rn.gqa_attention(q, k, v, causal, key_mask, window)


def test_causal_alignment_and_sliding_window_declarations():
    top_left = _impl("top_left", gqa_attention=_top_left_gqa, CAUSAL_ALIGNMENT="top_left")
    reason = REGISTRY["gqa.queries_shorter_than_keys"].skip_reason(top_left)
    assert isinstance(reason, Declared) and "CAUSAL_ALIGNMENT = 'top_left'" in reason
    for name in ("gqa.head_groups", "gqa.agrees_with_reference", "masking.padding_hidden_keys_ignored"):
        assert _status(name, top_left) == "passed", name

    def no_window(q, k, v, causal, key_mask, window):
        assert window is None, "SLIDING_WINDOW = False: never passed a window"
        return rn.gqa_attention(q, k, v, causal, key_mask, window)

    windowless = _impl("windowless", gqa_attention=no_window, SLIDING_WINDOW=False)
    for name in ("masking.window_key_count", "masking.window_outside_keys_ignored", "masking.window_covering_all_keys_is_causal"):
        assert isinstance(REGISTRY[name].skip_reason(windowless), Declared), name
    assert _status("masking.masks_compose_in_low_precision", windowless) == "passed"


def test_qkv_biases_are_drawn_only_where_declared():
    seen = []

    def block(x, params, n_heads, n_kv_heads, rope_base, window):
        seen.append("b_q" in params)
        return rn.llama_block(x, params, n_heads, n_kv_heads, rope_base, window)

    assert _status("llama.block_agrees_with_reference", _impl("plain", llama_block=block)) == "passed" and not any(seen)
    seen.clear()
    assert _status("llama.block_agrees_with_reference", _impl("qwen", llama_block=block, QKV_BIASES=True)) == "passed" and any(seen)


def test_every_new_component_has_invariants_and_mutants():
    from invariants.mutants import all_mutants

    components = {inv.component for inv in REGISTRY.values()}
    killed = {m.killed_by for m in all_mutants()}
    for component in NEW_COMPONENTS:
        assert component in components
        names = [name for name, inv in REGISTRY.items() if inv.component == component]
        assert all(name in killed for name in names), sorted(set(names) - killed)
