"""Invariants of RoPE scaling and partial rotary: the scaled frequencies of every rope_type, YaRN's score temperature, and
RoPE on the first part of each head.

rope_frequencies(d_head, base, scaling, seq_len) answers (inv_freq, attention_factor) as transformers'
ROPE_INIT_FUNCTIONS do (modeling_rope_utils.py); θ_i = base^(-2i/d) are the unscaled frequencies, s the factor, L_0 the
trained length. The laws state each type's defining property against θ, computed here in float64: linear divides every
frequency by s (rope at positions / s: Chen et al. 2023); dynamic NTK is plain RoPE up to L_0 and only slows past it;
llama3 keeps the high frequencies, divides the low ones by s and blends monotonically between (Meta's apply_scaling); YaRN
keeps the pairs below its ramp, divides those above by s and blends monotonically between (Peng et al. 2023, eq. 25: the
code's blend of frequencies, which transformers, DeepSeek and jquesnelle/yarn ship, where eq. 23 blends wavelengths; both
satisfy these laws, the reference follows the code); LongRoPE divides by the short factors up to L_0 and the long ones past
it. Each answer is a function of its arguments alone: a cache grown for a long sequence and kept for a short one is the
dynamic-NTK bug transformers fixed twice (#25306, #46624). softmax_scale and the attention factor together give each score
YaRN's temperature yarn_mscale(s, mscale)² (DeepSeek folds mscale_all_dim² into the softmax scale).

Frequencies and factors are config constants with no input dtype: every law holds them to float32's rounding (transformers
computes them in float32) whatever the run's dtype, so one rounded to bfloat16 fails.
"""

from __future__ import annotations

import numpy as np

import invariants.reference.numpy as ref
from invariants.asserts import assert_close, assert_equal, assert_shape, assert_where
from invariants.conventions import declared, input_as_rounded, rounding_dtype
from invariants.inputs import valid_inputs
from invariants.laws.rope import assert_close_to_a_pairing, rope_pairings, rope_tolerance
from invariants.protocol import FUNCTIONS, ROUNDINGS
from invariants.registry import invariant
from invariants.strategies.core import integers, sampled_from
from invariants.strategies.rope_scaling import partial_rope_inputs, rope_frequency_inputs
from invariants.tolerance import Tolerance, agreement_tolerance

LESSON = 91  # where a lesson meets this component: the registry's order (test ids, the kill matrix's first failure)
HOLDS = ("rope_frequencies", "softmax_scale", "partial_rope")  # the protocol functions whose laws it holds

FREQUENCIES, SCALE, PARTIAL = FUNCTIONS["rope_frequencies"], FUNCTIONS["softmax_scale"], FUNCTIONS["partial_rope"]
# float32's unit roundoff × 512: a few roundings of base^x (whose error grows with ln base) and of llama3's blend, whose
# γ carries up to factor × the wavelength's rounding; a bfloat16 frequency (2^-9) fails it by 30 times
CONSTANT_TOLERANCE = Tolerance(512 * 2.0**-24, 0.0, "float32")


def _shown(inputs):
    scaling = ", ".join(f"{k}={v!r}" if not isinstance(v, list) else f"{k}=[{len(v)} values]" for k, v in inputs["scaling"].items())
    return f"rope_frequencies(d_head={inputs['d_head']}, base={inputs['base']!r}, scaling={{{scaling}}}, seq_len={inputs['seq_len']})"


def _frequencies(impl, inputs, call, **changes):
    """impl's (inv_freq (d/2,), attention_factor ()) as float64 for `inputs` with `changes`."""
    __tracebackhide__ = True
    inv_freq, factor = FREQUENCIES.called(impl, inputs, call, **changes)
    d_head = changes.get("d_head", inputs["d_head"])
    return assert_shape(inv_freq, (d_head // 2,), "rope_frequencies inv_freq", call).astype(np.float64), np.asarray(factor, dtype=np.float64)


def _draw(case, rope_type=None, label="rope_frequencies call"):
    return case.draw(rope_frequency_inputs(rope_type=rope_type), label)


def _theta(inputs):
    return ref.inverse_frequencies(inputs["d_head"], inputs["base"])  # (d/2,) float64


@valid_inputs("rope_frequencies")
def rope_frequencies_arguments(impl, case):
    """A rotated width of 4 to 16, a base, a scaling config of any rope_type and a length around its trained one."""
    return FREQUENCIES.arguments_of(_draw(case))


@valid_inputs("partial_rope")
def partial_rope_arguments(impl, case):
    """(B, H, T, D) heads whose int(D · factor) leading features are even in number, distinct positions, a base."""
    return PARTIAL.arguments_of(_draw_partial(impl, case))


@invariant(
    requires=("rope_frequencies",),
    hint=(
        "a rope_type's frequencies or attention factor differ from transformers' ROPE_INIT_FUNCTIONS: the scaling ignored "
        "(llama.cpp#8650: Llama 3.1 run with plain θ), a band or ramp misplaced, the dynamic base grown with the wrong "
        "exponent, LongRoPE's attention factor from s instead of max_position_embeddings / L_0, or the frequencies rounded "
        "to the model's bfloat16 (compute them in float32 at least)"
    ),
)
def rope_frequencies_agree_with_reference(impl, case):
    """rope_frequencies agrees with the float64 reference for every rope_type, to float32's rounding of a few roundings."""
    inputs = _draw(case)
    call = _shown(inputs)
    inv_freq, factor = _frequencies(impl, inputs, call)
    expected, expected_factor = ref.rope_frequencies(*FREQUENCIES.arguments_of(inputs))
    assert_close(inv_freq, expected, "rope_frequencies inv_freq", CONSTANT_TOLERANCE, call)
    assert_close(factor, expected_factor, "rope_frequencies attention_factor", CONSTANT_TOLERANCE, call)


@invariant(
    requires=("rope_frequencies",),
    hint="linear interpolation is not rope at positions / s: the frequencies multiplied by s, or only some of them divided",
)
def linear_scaling_divides_every_frequency(impl, case):
    """Linear scaling divides every θ_i by s (rope at positions / s) and leaves the attention factor at 1."""
    inputs = _draw(case, "linear")
    call = _shown(inputs)
    inv_freq, factor = _frequencies(impl, inputs, call)
    assert_close(inv_freq * inputs["scaling"]["factor"], _theta(inputs), "rope_frequencies inv_freq × factor", CONSTANT_TOLERANCE, call)
    assert_close(factor, 1.0, "rope_frequencies attention_factor (linear)", CONSTANT_TOLERANCE, call)


@invariant(
    requires=("rope_frequencies",),
    hint=(
        "dynamic NTK changes RoPE within the trained length (the base grown from seq_len 0, or from max_position_embeddings "
        "× factor), or grows the frequencies past it: the base must grow with the length, so every θ_i shrinks"
    ),
)
def dynamic_ntk_is_rope_within_trained_length(impl, case):
    """Dynamic NTK equals plain RoPE (θ_i, factor 1) for seq_len <= L_0; past it every frequency is at most θ_i and θ_0 stays 1."""
    inputs = _draw(case, "dynamic")
    call = _shown(inputs)
    inv_freq, factor = _frequencies(impl, inputs, call)
    theta = _theta(inputs)
    if inputs["seq_len"] <= inputs["scaling"]["original_max_position_embeddings"]:
        assert_close(inv_freq, theta, "rope_frequencies inv_freq within the trained length (θ_i)", CONSTANT_TOLERANCE, call)
    else:
        assert_where(inv_freq <= theta * (1 + CONSTANT_TOLERANCE.rtol), inv_freq, "rope_frequencies inv_freq past the trained length",
                     "<= θ_i (a grown base)", call)
        assert_close(inv_freq[:1], 1.0, "rope_frequencies inv_freq[0] (base^0)", CONSTANT_TOLERANCE, call)
    assert_close(factor, 1.0, "rope_frequencies attention_factor (dynamic)", CONSTANT_TOLERANCE, call)


@invariant(
    requires=("rope_frequencies",),
    hint=(
        "the answer depends on earlier calls: a cos/sin cache or base grown for a long sequence is kept for a shorter one "
        "(transformers#25306, transformers#46624: the reset never ran), or LongRoPE stays on its long factors once it has used them"
    ),
)
def rope_frequencies_forget_longer_calls(impl, case):
    """A call at a length, then one past it, then the first again: the first and the last answers are identical."""
    inputs = _draw(case, case.draw(sampled_from(("dynamic", "longrope")), "rope_type"))
    longer = inputs["seq_len"] + case.draw(integers(1, 4 * inputs["scaling"]["original_max_position_embeddings"]), "how much longer")
    call = _shown(inputs) + f", then seq_len={longer}, then seq_len={inputs['seq_len']} again"
    first = _frequencies(impl, inputs, call)
    _frequencies(impl, inputs, call, seq_len=longer)
    again = _frequencies(impl, inputs, call)
    assert_equal(again[0], first[0], "rope_frequencies inv_freq after a longer call", call)
    assert_equal(again[1], first[1], "rope_frequencies attention_factor after a longer call", call)


def _ratios(inv_freq, theta):
    return inv_freq / theta  # (d/2,): 1 where kept, 1/s where divided


def _monotone_between(inputs, ratios, call, what):
    """ratios lie in [1/s, 1] and never grow with i (a lower frequency is never scaled less), to CONSTANT_TOLERANCE."""
    s, rtol = inputs["scaling"]["factor"], CONSTANT_TOLERANCE.rtol
    assert_where((ratios >= (1 - rtol) / s) & (ratios <= 1 + rtol), ratios, f"{what} inv_freq / θ_i", f"in [1/factor, 1] = [{1 / s}, 1]", call)
    steps = np.diff(ratios)
    assert_where(steps <= 2 * rtol, steps, f"{what} change of inv_freq / θ_i from pair i to i + 1",
                 "<= 0 (lower frequencies scaled at least as much)", call)


@invariant(
    requires=("rope_frequencies",),
    hint=(
        "llama3's bands are misplaced: the factor applied to the high frequencies (wavelength < L_0/high_freq_factor) or "
        "not to the low ones (> L_0/low_freq_factor), low and high factors swapped, the wavelengths of the scaled instead of "
        "the original θ, or the blend not between θ/s and θ (the smooth factor's sign flipped)"
    ),
)
def llama3_keeps_high_divides_low(impl, case):
    """llama3 keeps θ_i where 2π/θ_i < L_0/high_freq_factor, gives θ_i/s where 2π/θ_i > L_0/low_freq_factor, and between
    lies in [θ_i/s, θ_i] scaling lower frequencies no less; the attention factor is 1."""
    inputs = _draw(case, "llama3")
    call = _shown(inputs)
    inv_freq, factor = _frequencies(impl, inputs, call)
    theta, scaling = _theta(inputs), inputs["scaling"]
    wavelength, original = 2 * np.pi / theta, scaling["original_max_position_embeddings"]
    edge = 1e-4  # a wavelength this close to a band's edge may fall on either side in float32
    high = wavelength < original / scaling["high_freq_factor"] * (1 - edge)
    low = wavelength > original / scaling["low_freq_factor"] * (1 + edge)
    assert_close(inv_freq[high], theta[high], "rope_frequencies inv_freq of the high frequencies (kept)", CONSTANT_TOLERANCE, call)
    assert_close(inv_freq[low], theta[low] / scaling["factor"], "rope_frequencies inv_freq of the low frequencies (θ/factor)",
                 CONSTANT_TOLERANCE, call)
    _monotone_between(inputs, _ratios(inv_freq, theta), call, "llama3")
    assert_close(factor, 1.0, "rope_frequencies attention_factor (llama3)", CONSTANT_TOLERANCE, call)


@invariant(
    requires=("rope_frequencies",),
    hint=(
        "YaRN's ramp is misplaced: beta_fast and beta_slow swapped (pytorch/torchtitan#3787), so the high frequencies are "
        "interpolated and the low ones kept; the ramp inverted (1 − γ for γ); or pairs outside the ramp scaled"
    ),
)
def yarn_ramp_bounds(impl, case):
    """YaRN keeps θ_i for the pairs up to where beta_fast rotations fit in L_0, gives θ_i/s from where beta_slow ones do,
    and between lies in [θ_i/s, θ_i] scaling lower frequencies no less."""
    inputs = _draw(case, "yarn")
    call = _shown(inputs)
    inv_freq, _ = _frequencies(impl, inputs, call)
    theta, scaling = _theta(inputs), inputs["scaling"]
    low, high = ref.yarn_correction_range(inputs["d_head"], inputs["base"], scaling["beta_fast"], scaling["beta_slow"],
                                          scaling["original_max_position_embeddings"], scaling["truncate"])
    pair = np.arange(inputs["d_head"] // 2)
    kept, divided = pair <= low - 1e-6, pair >= high + 1e-6
    assert_close(inv_freq[kept], theta[kept], f"rope_frequencies inv_freq of the pairs up to the ramp's start {low:.3f} (kept)",
                 CONSTANT_TOLERANCE, call)
    assert_close(inv_freq[divided], theta[divided] / scaling["factor"],
                 f"rope_frequencies inv_freq of the pairs from the ramp's end {high:.3f} (θ/factor)", CONSTANT_TOLERANCE, call)
    _monotone_between(inputs, _ratios(inv_freq, theta), call, "yarn")


@invariant(
    requires=("rope_frequencies", "softmax_scale"),
    hint=(
        "YaRN's temperature is wrong: DeepSeek's softmax scale without mscale_all_dim² (transformers#47435), with mscale in "
        "place of mscale_all_dim (NVIDIA/Megatron-LM#1429), or 0.1·ln s + 1 applied to cos and sin and in the softmax scale too"
    ),
)
def yarn_score_temperature(impl, case):
    """For YaRN, softmax_scale × attention_factor² × √d = yarn_mscale(s, mscale)² where mscale and mscale_all_dim are set, else
    (0.1·ln s + 1)²: each score's rotary part is scaled by the paper's 1/t once."""
    inputs = _draw(case, "yarn")
    scaling = inputs["scaling"]
    call = _shown(inputs) + f" and softmax_scale({inputs['d_head']}, scaling)"
    _, factor = _frequencies(impl, inputs, call)
    (scale,) = SCALE.called(impl, inputs, call)
    both = scaling.get("mscale") and scaling.get("mscale_all_dim")
    expected = ref.yarn_mscale(scaling["factor"], scaling["mscale"] if both else 1.0) ** 2
    temperature = np.asarray(scale, dtype=np.float64) * factor**2 * np.sqrt(inputs["d_head"])  # () array
    assert_close(np.asarray(temperature), expected,
                 "softmax_scale × attention_factor² × √d_head (the score's temperature)", CONSTANT_TOLERANCE, call)


@invariant(
    requires=("softmax_scale",),
    hint="the softmax scale differs from 1/√d_head (× DeepSeek's yarn_mscale(s, mscale_all_dim)² for YaRN with mscale_all_dim): "
    "1/d, the rotated width in place of the whole query-key width, or the mscale folded in for every rope_type",
)
def softmax_scale_agrees_with_reference(impl, case):
    """softmax_scale agrees with the reference: 1/√d_head, × yarn_mscale(s, mscale_all_dim)² for a YaRN config that sets it."""
    inputs = _draw(case)
    call = SCALE.describe(inputs)
    (scale,) = SCALE.called(impl, inputs, call)
    expected = ref.softmax_scale(inputs["d_head"], inputs["scaling"])
    assert_close(np.asarray(scale, dtype=np.float64), expected, "softmax_scale", CONSTANT_TOLERANCE, call)


@invariant(
    requires=("rope_frequencies",),
    hint=(
        "LongRoPE's factor lists are chosen wrongly: the long factors at every length (lablup/mlxcel#1358; trymirai/lalamo#326 "
        "chose them from the configured capacity), the switch at seq_len >= L_0 instead of > L_0, or the factors multiplied "
        "into θ instead of dividing it; or the attention factor differs between the two"
    ),
)
def longrope_factors_chosen_by_length(impl, case):
    """LongRoPE gives θ_i / short_factor[i] for seq_len <= L_0 and θ_i / long_factor[i] past it, with one attention factor
    √(1 + ln S / ln L_0) for both (S = max_position_embeddings / L_0)."""
    inputs = _draw(case, "longrope")
    call = _shown(inputs)
    inv_freq, factor = _frequencies(impl, inputs, call)
    scaling = inputs["scaling"]
    original = scaling["original_max_position_embeddings"]
    chosen = "long_factor" if inputs["seq_len"] > original else "short_factor"
    assert_close(inv_freq, _theta(inputs) / np.asarray(scaling[chosen]), f"rope_frequencies inv_freq (θ / {chosen})", CONSTANT_TOLERANCE, call)
    expected = np.sqrt(1 + np.log(scaling["max_position_embeddings"] / original) / np.log(original))
    assert_close(factor, expected, "rope_frequencies attention_factor (longrope)", CONSTANT_TOLERANCE, call)


# ---------------------------------------------------------------------------
# partial_rope
# ---------------------------------------------------------------------------


def _draw_partial(impl, case):
    options = {"bases": (declared(impl, "ROPE_THETA"),)} if declared(impl, "ROPE_THETA") is not None else {}
    return case.draw(partial_rope_inputs(**options), "partial_rope call")


def _partial(impl, inputs, call):
    __tracebackhide__ = True
    (out,) = PARTIAL.called(impl, inputs, call)
    return assert_shape(out, inputs["x"].shape, "partial_rope output", call)


def _partial_call(inputs):
    return PARTIAL.describe(inputs)


@invariant(
    requires=("partial_rope",),
    hint=(
        "features past the rotary width are changed: the rotation applied to the whole head (AI-Hypercomputer/maxtext#4615), "
        "the rotary width taken as D/2 or D·factor/2, or the pass-through part rounded through another dtype"
    ),
)
def partial_rope_passes_the_rest_through(impl, case):
    """partial_rope returns the features past int(D · partial_rotary_factor) exactly as they came in (bit for bit)."""
    inputs = _draw_partial(impl, case)
    call = _partial_call(inputs)
    out = _partial(impl, inputs, call)
    rotary = ref.rotary_width(inputs["x"].shape[-1], inputs["partial_rotary_factor"])
    assert_equal(out[..., rotary:], input_as_rounded(impl, out, inputs["x"])[..., rotary:],
                 f"partial_rope output past the rotary width {rotary} (passed through)", call)


@invariant(
    requires=("partial_rope",),
    hint="the rotated part is not a rotation: its pairs span the whole head (partner i + D/2 instead of i + rotary/2), or cos "
    "and sin are laid out for another width, so the leading features' norm changes",
)
def partial_rope_rotated_part_keeps_its_norm(impl, case):
    """The leading int(D · factor) features of each vector keep their norm: the rotated part is a rotation."""
    inputs = _draw_partial(impl, case)
    call = _partial_call(inputs)
    rotary = ref.rotary_width(inputs["x"].shape[-1], inputs["partial_rotary_factor"])
    out = _partial(impl, inputs, call).astype(np.float64)[..., :rotary]
    seen = impl.as_seen(inputs["x"])[..., :rotary]
    tol = impl.tolerance.scaled(ROUNDINGS["partial_rope"]).at_scale(float(np.abs(seen).max()) * np.sqrt(rotary))
    assert_close(np.linalg.norm(out, axis=-1), np.linalg.norm(seen, axis=-1), "norm of the rotated part of each vector", tol, call)


@invariant(
    requires=("partial_rope",),
    hint=(
        "the rotated part's frequencies are over the head width, base^(-2i/D), not the rotary width's base^(-2i/rotary) "
        "(pie-project/pie#603), or its pairs are not the declared ROPE_PAIRING within the rotary width"
    ),
)
def partial_rope_agrees_with_reference(impl, case):
    """partial_rope agrees with the reference: rope over the leading int(D · factor) features with θ_i = base^(-2i/rotary), in its pairing."""
    inputs = _draw_partial(impl, case)
    call = _partial_call(inputs)
    out = _partial(impl, inputs, call)
    seen = impl.as_seen(inputs["x"])
    answers = {p: ref.partial_rope(seen, inputs["positions"], inputs["base"], inputs["partial_rotary_factor"], pairing=p)
               for p in rope_pairings(impl)}
    tol = agreement_tolerance(rounding_dtype(impl))
    if tol.dtype != "float64":
        tol = rope_tolerance(impl, int(inputs["positions"].max()), base=tol)
    assert_close_to_a_pairing(impl, out, answers, "partial_rope output", tol.at_scale(float(np.abs(seen).max())), call)
