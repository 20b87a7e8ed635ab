"""Inputs on which the thorough soak failed correct code stay passing: each replayed through its invariant.

A fixture holds the shrunk example exactly as the invariant drew it (label by label); ReplayedCase
hands the values back in the order the invariant asks for them, so the invariant's own code, its
tolerance included, decides.
"""

from pathlib import Path

import numpy as np
import pytest

from invariants import REGISTRY, all_invariants, load_implementation
from invariants.strategies.params import GPTConfig

FIXTURES = Path(__file__).parent / "fixtures" / "false_alarms"
all_invariants()


class ReplayedCase:
    """A Case that answers each draw with the value recorded under its label."""

    def __init__(self, drawn):
        self.drawn, self.calls = dict(drawn), []

    def draw(self, strategy, label):
        return self.drawn[label]


def _gpt_case(path):
    """The drawn values of a model invariant's example from an .npz of config, params (flattened), ids, j and long."""
    saved = np.load(path)
    vocab, max_len, n_layers, n_heads, d_head, attn_bias, ff_ratio = (int(v) for v in saved["config"])
    config = GPTConfig(vocab, max_len, n_layers, n_heads, d_head, bool(attn_bias), ff_ratio)
    blocks = [{key.split(".", 2)[2]: saved[key] for key in saved.files if key.startswith(f"blocks.{i}.")} for i in range(n_layers)]
    params = {"wte": saved["wte"], "wpe": saved["wpe"], "blocks": blocks, "lnf_g": saved["lnf_g"], "lnf_b": saved["lnf_b"]}
    return {"long sequence": int(saved["long"]), "config": config, "params": params, "ids": saved["ids"],
            "j (prefix length, < T)": int(saved["j"])}


@pytest.mark.parametrize("target", ["reference.numpy", "reference.torch"])
def test_a_long_float32_model_with_uniform_attention_passes_prefix_consistency(target):
    """The soak's example: 129 positions, W_q = W_k = 0, prefix 92; 4.1e-5 from the full logits, 1.6× the unscaled tolerance."""
    if target == "reference.torch":
        pytest.importorskip("torch", reason="reference.torch needs torch")
    impl = load_implementation(target, dtype="float32")
    drawn = _gpt_case(FIXTURES / "prefix_consistency_129_float32.npz")
    assert not drawn["params"]["blocks"][0]["W_q"].any() and drawn["ids"].shape == (1, 129)
    REGISTRY["model.prefix_consistency"](impl, ReplayedCase(drawn))  # raises InvariantViolation on a false alarm


def _decoder_block_case(path):
    """The drawn values of cross_attention.block_sees_every_memory_position's example from an .npz of inputs.*, params.*, j, direction."""
    saved = np.load(path)
    inputs = {key.removeprefix("inputs."): saved[key] for key in saved.files if key.startswith("inputs.")}
    inputs["n_heads"] = int(inputs["n_heads"])
    return {"x, memory and n_heads (the W's unused)": inputs,
            "params": {key.removeprefix("params."): saved[key] for key in saved.files if key.startswith("params.")},
            "j (changed encoder position)": int(saved["j"]), "direction of the shift": saved["direction"]}


@pytest.mark.parametrize("target", ["reference.numpy", "reference.torch"])
def test_a_memory_position_whose_weight_rounds_away_passes_block_sees_every_memory_position(target):
    """The soak's example (nn.TransformerDecoderLayer, float32, example 1,910 of 2,000; reference.torch fails it too): shifting
    memory[:, 2] by 1 moves the float64 reference block's output by less than rounding, so float32 may not move at all."""
    if target == "reference.torch":
        pytest.importorskip("torch", reason="reference.torch needs torch")
    impl = load_implementation(target, dtype="float32")
    drawn = _decoder_block_case(FIXTURES / "decoder_block_memory_position_float32.npz")
    REGISTRY["cross_attention.block_sees_every_memory_position"](impl, ReplayedCase(drawn))  # raises InvariantViolation on a false alarm
