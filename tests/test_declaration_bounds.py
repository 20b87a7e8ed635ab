"""No declaration lets code without a component pass that component's agreement with the reference.

Each cheat below is the reference evaluated at an eps of 1e300 (a LayerNorm that returns its bias,
an RMSNorm that returns zeros, a block that adds constant vectors to x, a model whose logits are
lnf_b·wteᵀ at every position) or a network with nothing inside (a feed-forward that returns b2, an
MoE that returns zeros). Declared with LAYER_NORM_EPS = 1e300 such code agreed with the reference,
since the reference then computes the same constants; the bounds of the numeric conventions keep
every declaration where the norm still depends on its input.
"""

from types import SimpleNamespace

import numpy as np
import pytest

import invariants.reference.numpy as rn
from invariants import REGISTRY, Implementation, all_invariants, run_invariant
from invariants.conventions import CONVENTIONS
from invariants.profiles import profile_settings

all_invariants()
CI = profile_settings("ci")
HUGE = 1e300  # the eps a declaration used to be allowed, that makes every norm constant


def _no_layer_norm(x, gain, bias, eps):
    return rn.layer_norm(x, gain, bias, HUGE)  # bias, broadcast


def _no_rms_norm(x, gain, eps):
    return rn.rms_norm(x, gain, HUGE)  # about 1e-150·x: zeros


def _no_feed_forward(x, W1, b1, W2, b2):
    return np.broadcast_to(b2, x.shape).copy()


def _no_block(x, params, n_heads, causal):
    return rn.transformer_block(x, params, n_heads, causal, eps=HUGE)  # x + two vectors made of biases


def _no_model(ids, params, n_heads):
    return rn.gpt_logits(ids, params, n_heads, eps=HUGE)  # lnf_b·wteᵀ at every position


def _no_moe(x, router, experts, k):
    return np.zeros_like(x)


def _no_llama_block(x, params, n_heads, n_kv_heads, rope_base, window):
    return rn.llama_block(x, params, n_heads, n_kv_heads, rope_base, window, eps=HUGE)


def _no_llama_model(ids, params, n_heads, n_kv_heads, rope_base, window):
    return rn.llama_logits(ids, params, n_heads, n_kv_heads, rope_base, window, eps=HUGE)


def _no_decoder_block(x, memory, params, n_heads):
    return rn.decoder_block(x, memory, params, n_heads, eps=HUGE)


CHEATS = {  # protocol function: (the cheat, the invariant it must fail)
    "layer_norm": (_no_layer_norm, "norms.layer_norm_agrees_with_reference"),
    "rms_norm": (_no_rms_norm, "norms.rms_norm_agrees_with_reference"),
    "feed_forward": (_no_feed_forward, "feed_forward.feed_forward_agrees_with_reference"),
    "transformer_block": (_no_block, "block.agrees_with_reference"),
    "gpt_logits": (_no_model, "model.agrees_with_reference"),
    "moe": (_no_moe, "moe.moe_agrees_with_reference"),
    "llama_block": (_no_llama_block, "llama.block_agrees_with_reference"),
    "llama_logits": (_no_llama_model, "llama.logits_agree_with_reference"),
    "decoder_block": (_no_decoder_block, "cross_attention.block_agrees_with_reference"),
}


def _values(convention):
    """The values of `convention` to try: both ends of a numeric one's bounds, else every allowed value."""
    return convention.bounds if convention.bounds is not None else convention.allowed


WEAKEST = dict(LAYER_NORM_BIAS=False, FEED_FORWARD_BIASES=False)  # zero biases leave the cheats the fewest constants to get right
DECLARATIONS = [{name: value} for name, c in CONVENTIONS.items() for value in _values(c)] + [
    {**WEAKEST, "LAYER_NORM_EPS": eps, "RMS_NORM_EPS": eps, "FEED_FORWARD_RATIO": ratio}
    for eps in CONVENTIONS["LAYER_NORM_EPS"].bounds for ratio in CONVENTIONS["FEED_FORWARD_RATIO"].bounds
]


def _cheat(function, declarations):
    return Implementation(SimpleNamespace(BACKEND="numpy", **{function: CHEATS[function][0]}, **declarations),
                          label=f"no {function}", backend="numpy", dtype="float64")  # COMPUTE_DTYPE: held to float32 rounding there


def _status(function, impl):
    return run_invariant(REGISTRY[CHEATS[function][1]], impl, settings=CI, shrink_limit=1).status


@pytest.mark.parametrize("declarations", DECLARATIONS, ids=lambda d: ",".join(f"{k}={v!r}" for k, v in d.items()))
def test_no_declaration_lets_code_without_the_component_agree_with_the_reference(declarations):
    passed = [f for f in CHEATS if _status(f, _cheat(f, declarations)) != "failed"]
    assert not passed, f"with {declarations}, code without {', '.join(passed)} was not failed by its agreement with the reference"


@pytest.mark.parametrize("function, declarations", [
    ("layer_norm", {"LAYER_NORM_EPS": HUGE}), ("transformer_block", {"LAYER_NORM_EPS": HUGE}), ("gpt_logits", {"LAYER_NORM_EPS": HUGE}),
    ("rms_norm", {"RMS_NORM_EPS": HUGE}), ("llama_block", {"RMS_NORM_EPS": HUGE}),
])
def test_the_cheats_pass_at_the_eps_the_bounds_refuse(function, declarations):
    """The cheats are what the bounds stop: given the declaration past read_declarations, they agree with the reference."""
    impl = _cheat(function, {})
    impl.declarations = declarations
    assert _status(function, impl) == "passed"
