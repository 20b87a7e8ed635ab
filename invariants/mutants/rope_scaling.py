"""Broken RoPE scaling and partial rotary: each a bug that reached a release of llama.cpp, transformers, Megatron-LM,
torchtitan, MaxText or an inference engine (cited)."""

import numpy as np

from invariants.mutants import mutant
from invariants.reference.numpy import inverse_frequencies, rope, rotary_width, yarn_correction_range, yarn_mscale, yarn_ramp


@mutant(
    also_named_by=("rope_scaling.rope_frequencies_agree_with_reference",),
    replaces="_llama3_frequencies",
    killed_by="rope_scaling.llama3_keeps_high_divides_low",
    bug="Llama 3.1's llama3 scaling parsed and never applied: plain θ at every length (ggml-org/llama.cpp#8650, lablup/mlxcel#1355)",
)
def ignored_llama3_frequencies(d, base, scaling, seq_len):
    return inverse_frequencies(d, base), 1.0  # BUG: the low frequencies are not divided by the factor


@mutant(
    replaces="_yarn_frequencies",
    killed_by="rope_scaling.yarn_ramp_bounds",
    bug="YaRN's beta_fast and beta_slow swapped in the correction range, so high frequencies are interpolated (pytorch/torchtitan#3787)",
)
def swapped_betas_yarn_frequencies(d, base, scaling, seq_len):
    s = scaling["factor"]
    low, high = yarn_correction_range(d, base, scaling.get("beta_slow") or 1, scaling.get("beta_fast") or 32,  # BUG: swapped
                                      scaling["original_max_position_embeddings"], scaling.get("truncate", True))
    ramp = yarn_ramp(d, low, high)
    theta = inverse_frequencies(d, base)
    mscale, mscale_all_dim = scaling.get("mscale"), scaling.get("mscale_all_dim")
    factor = yarn_mscale(s, mscale) / yarn_mscale(s, mscale_all_dim) if mscale and mscale_all_dim else yarn_mscale(s)
    return theta / s * ramp + theta * (1 - ramp), factor


@mutant(
    also_named_by=("rope_scaling.softmax_scale_agrees_with_reference",),
    replaces="softmax_scale",
    killed_by="rope_scaling.yarn_score_temperature",
    bug="DeepSeek's softmax scale left at 1/√d: yarn_mscale(s, mscale_all_dim)² never folded in (huggingface/transformers#47435)",
)
def unfolded_softmax_scale(d_head, scaling):
    return d_head**-0.5  # BUG: the YaRN magnitude is missing from the scores


@mutant(
    also_named_by=("rope_scaling.softmax_scale_agrees_with_reference",),
    replaces="softmax_scale",
    killed_by="rope_scaling.yarn_score_temperature",
    bug="DeepSeek's softmax scale folds in yarn_mscale(s, mscale) where mscale_all_dim belongs (NVIDIA/Megatron-LM#1429)",
)
def mscale_softmax_scale(d_head, scaling):
    scale = d_head**-0.5
    if scaling["rope_type"] == "yarn" and scaling.get("mscale_all_dim"):
        scale = scale * yarn_mscale(scaling["factor"], scaling["mscale"]) ** 2  # BUG: mscale, not mscale_all_dim
    return scale


_GROWN = {}  # (d, base, factor, L_0) -> the longest seq_len seen: the cache the mutant keeps


@mutant(
    replaces="_dynamic_frequencies",
    killed_by="rope_scaling.rope_frequencies_forget_longer_calls",
    bug="dynamic NTK's frequencies grown for a long sequence kept for shorter ones: the reset never runs "
    "(huggingface/transformers#46624; huggingface/transformers#25306)",
)
def unreset_dynamic_frequencies(d, base, scaling, seq_len):
    s, original = scaling["factor"], scaling["original_max_position_embeddings"]
    key = (d, base, s, original)
    _GROWN[key] = max(_GROWN.get(key, original), seq_len)  # BUG: grows, never shrinks back
    return inverse_frequencies(d, base * (s * _GROWN[key] / original - (s - 1)) ** (d / (d - 2))), 1.0


@mutant(
    also_named_by=("rope_scaling.rope_frequencies_agree_with_reference",),
    replaces="_longrope_frequencies",
    killed_by="rope_scaling.longrope_factors_chosen_by_length",
    bug="LongRoPE's long factors used at every length, the short ones never read (lablup/mlxcel#1358; trymirai/lalamo#326)",
)
def long_only_longrope_frequencies(d, base, scaling, seq_len):
    original = scaling["original_max_position_embeddings"]
    s = scaling["max_position_embeddings"] / original
    factor = 1.0 if s <= 1 else float(np.sqrt(1 + np.log(s) / np.log(original)))
    return inverse_frequencies(d, base) / np.asarray(scaling["long_factor"]), factor  # BUG: whatever seq_len is


@mutant(
    replaces="partial_rope",
    killed_by="rope_scaling.partial_rope_passes_the_rest_through",
    bug="partial_rotary_factor dropped: the whole head rotated, not its leading part (AI-Hypercomputer/maxtext#4615)",
)
def whole_head_partial_rope(x, positions, base, partial_rotary_factor, *, pairing="half_split"):
    return rope(x, positions, base, pairing=pairing)  # BUG: the pass-through features turn too


@mutant(
    replaces="partial_rope",
    killed_by="rope_scaling.partial_rope_agrees_with_reference",
    bug="the rotary part's frequencies over the head width, base^(-2i/D), not base^(-2i/rotary_dim) (pie-project/pie#603)",
)
def head_width_partial_rope(x, positions, base, partial_rotary_factor, *, pairing="half_split"):
    D = x.shape[-1]
    rotary = rotary_width(D, partial_rotary_factor)
    turned = rope(x[..., :rotary], positions, base ** (rotary / D), pairing=pairing)  # BUG: θ_i = base^(-2i/D)
    return np.concatenate([turned, x[..., rotary:]], axis=-1)
