"""Attention with QK-norm: twin references, the strategy's arguments, transformers' Qwen3 behind the adapter, OLMo 2's variant told apart.

The references pass every qk_norm invariant in tests/test_reference_passes.py, and each mutant dies by the
invariant that names it in tests/test_mutants.py; this file covers the rest.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings

import invariants.reference.numpy as rn
from invariants import REGISTRY, Implementation, all_invariants, load_implementation, run_invariant
from invariants.strategies import InvalidArgument
from invariants.strategies.decoder import qk_norm_args, qk_norm_inputs

torch = pytest.importorskip("torch", reason="the torch twin and the adapter need torch")
import invariants.reference.torch as rt  # noqa: E402

all_invariants()
FEW = settings(max_examples=20, derandomize=True, database=None, deadline=None)
QK_NORM = sorted(name for name in REGISTRY if name.startswith("qk_norm."))


def _torch(value):
    if isinstance(value, dict):
        return {k: _torch(v) for k, v in value.items()}
    return torch.as_tensor(value) if isinstance(value, np.ndarray) else value


@FEW
@given(qk_norm_inputs(min_qk_scale=0.25, max_qk_scale=64.0))
def test_qk_norm_attention_twins(inputs):
    for pairing in rn.ROPE_PAIRINGS:
        expected = rn.qk_norm_attention(*qk_norm_args(inputs), pairing=pairing)
        got = rt.qk_norm_attention(*map(_torch, qk_norm_args(inputs)), pairing=pairing)
        for e, g in zip(expected, got, strict=True):
            np.testing.assert_allclose(g.numpy(), e, rtol=1e-12, atol=1e-12)


def test_the_reference_normalises_each_head_before_rope():
    """Written out by hand for one head of D = 2 at position 1: q/√(mean(q²) + eps)·g, then rotated by 1 radian."""
    x = np.array([[[1.0], [2.0]]])  # (B 1, T 2, d 1)
    params = {"W_q": np.array([[3.0, 4.0]]), "W_k": np.array([[1.0, 0.0]]), "W_v": np.array([[1.0, 1.0]]), "W_o": np.eye(2)[:, :1],
              "q_norm": np.array([1.0, 2.0]), "k_norm": np.array([1.0, 1.0])}
    _, weights = rn.qk_norm_attention(x, params, 1, 1, np.array([0, 1]), 10_000.0, eps=0.0)
    q1 = np.array([6.0, 8.0]) / np.sqrt(50.0) * np.array([1.0, 2.0])  # token 1's query x·W_q = (6, 8): mean square 50, then the gain
    c, s = np.cos(1.0), np.sin(1.0)
    q1 = np.array([q1[0] * c - q1[1] * s, q1[0] * s + q1[1] * c])  # rotated (position 1, θ_0 = 1)
    k = np.array([[np.sqrt(2.0), 0.0], [np.sqrt(2.0) * c, np.sqrt(2.0) * s]])  # both keys normalised to rms 1, the second rotated
    scores = k @ q1 / np.sqrt(2.0)
    np.testing.assert_allclose(weights[0, 0, 1], np.exp(scores) / np.exp(scores).sum(), rtol=1e-13)
    assert weights[0, 0, 0].tolist() == [1.0, 0.0]


BAD = [
    (lambda: qk_norm_inputs(min_seq=4, max_seq=2), "min_seq=4 is larger than max_seq=2; lower min_seq or raise max_seq"),
    (lambda: qk_norm_inputs(min_group=0), "min_group=0 must be at least 1"),
    (lambda: qk_norm_inputs(max_start=-1), "max_start=-1 must be at least 0"),
    (lambda: qk_norm_inputs(bases=(1.0,)), "base=1.0 must be at least 1.0000001"),
    (lambda: qk_norm_inputs(min_qk_scale=0.0), "min_scale=0.0 must be"),
]


@pytest.mark.parametrize("build, message", BAD, ids=[m for _, m in BAD])
def test_bad_strategy_arguments_are_named(build, message):
    with pytest.raises(InvalidArgument) as info:
        build()
    assert str(info.value).startswith(message), str(info.value)


# -- transformers: Qwen3 passes, OLMo 2's whole-projection norm is another function ------------------------------------------


@pytest.mark.parametrize("name", QK_NORM)
def test_qwen3_adapter_passes(name):
    pytest.importorskip("transformers", reason="the Qwen3 adapter needs transformers (pip install -e '.[external]')")
    outcome = run_invariant(REGISTRY[name], load_implementation("invariants.adapters.qwen3", dtype="float32"), settings=FEW)
    assert outcome.passed, outcome.report or outcome.reason


def _olmo2_attention(x, params, n_heads, n_kv_heads, positions, rope_base):
    """transformers' Olmo2Attention, its gains (H·D,) and (H_kv·D,) the per-head ones tiled: the norm's scope is all that differs."""
    from transformers import Olmo2Config
    from transformers.models.olmo2 import modeling_olmo2 as olmo2

    D = params["q_norm"].shape[0]
    config = Olmo2Config(vocab_size=1, hidden_size=x.shape[-1], intermediate_size=1, num_hidden_layers=1, num_attention_heads=n_heads,
                         num_key_value_heads=n_kv_heads, head_dim=D, rms_norm_eps=1e-5, rope_parameters={"rope_type": "default",
                         "rope_theta": float(rope_base)}, pad_token_id=None, bos_token_id=None, eos_token_id=None)
    config._attn_implementation = "eager"
    attn = olmo2.Olmo2Attention(config, 0).to(x.dtype)
    with torch.no_grad():
        for name in ("q", "k", "v", "o"):
            getattr(attn, f"{name}_proj").weight.copy_(params[f"W_{name}"].T)
        attn.q_norm.weight.copy_(params["q_norm"].repeat(n_heads))
        attn.k_norm.weight.copy_(params["k_norm"].repeat(n_kv_heads))
        cos, sin = olmo2.Olmo2RotaryEmbedding(config)(x, positions.reshape(1, -1))
        mask = torch.zeros(x.shape[1], x.shape[1], dtype=x.dtype).masked_fill(torch.ones(x.shape[1], x.shape[1]).triu(1).bool(), -torch.inf)
        return attn(x, (cos, sin), mask[None, None])


def test_olmo2_whole_projection_norm_is_told_apart_from_qwen3s_per_head_norm():
    """OLMo 2 normalises all heads' features together: the per-head laws fail on it, and the laws that hold for both variants pass."""
    pytest.importorskip("transformers", reason="needs transformers' Olmo2")
    impl = Implementation.from_functions(backend="torch", dtype="float32", label="transformers' Olmo2Attention", qk_norm_attention=_olmo2_attention)
    laws = ("head_rescaling_invariant", "agrees_with_reference", "causal_non_leakage", "relative_positions", "linear_in_values")
    verdicts = {law: run_invariant(REGISTRY[f"qk_norm.{law}"], impl, settings=FEW).status for law in laws}
    assert verdicts == dict(zip(laws, ("failed", "failed", "passed", "passed", "passed"), strict=True)), verdicts


def test_every_qk_norm_law_names_a_mutant_it_kills():
    """Each law has a mutant of QK-norm attention whose bug its hint names (tests/test_mutants.py runs them at ci)."""
    from invariants.mutants import all_mutants

    named = {name for m in all_mutants() if m.replaces == "qk_norm_attention" for name in m.named_by}
    assert set(QK_NORM) <= named, sorted(set(QK_NORM) - named)
