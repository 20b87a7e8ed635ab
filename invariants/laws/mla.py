"""Invariants of multi-head latent attention (DeepSeek-V2/V3, Kimi K2): causality, the decoupled RoPE key, the latent norms,
the softmax scale, the latent cache and its size, the absorbed decode, the reference.

mla_attention(x (B, T, d), params, n_heads, positions (T,), rope_base, mscale) computes each head's key from one normalised
latent c = RMSNorm(x·W_dkv) per token (c·W_uk_h) and ONE RoPE key k_r = RoPE(x·W_kr) shared by every head, its value as
c·W_uv_h, and scales the scores by mscale²/√(D_n + D_r) (DeepSeek-V2 §2.1; transformers' DeepseekV3Attention). It returns
out (B, T, d) and weights (B, H, T, T) (out alone under ATTENTION_WEIGHTS = False). mla_decode(..., chunks) runs it in chunks
on its own cache and answers that cache: per token c and k_r, r_kv + D_r numbers whatever the number of heads.

What holds exactly, and what to rounding:
- Causality, and the position-free part: with W_kr = 0 the RoPE key is 0, so no score depends on a position and the output
  is bitwise the same at any positions (RoPE on the D_n features breaks it: their scores would turn with the offset).
- The cache size: its width is r_kv + D_r, and doubling the heads leaves it bitwise unchanged (it never reads a head).
- The latent norms: RMSNorm_eps(s·c) = RMSNorm_{eps/s²}(c), so scaling W_dkv (and W_dq) by a power of two changes the
  output by the eps effect only, which the float64 reference measures and the check allows.
- Relative positions, the reference, the cache's values and the decode equal to the naive attention hold to rounding.
"""

from __future__ import annotations

import numpy as np

import invariants.reference.numpy as ref
from invariants.asserts import assert_equal, assert_value
from invariants.conventions import declared, rms_norm_eps
from invariants.inputs import valid_inputs
from invariants.laws.reference_check import reference_tolerance
from invariants.laws.rope import angle_error, assert_close_to_a_pairing, rope_pairings
from invariants.protocol import FUNCTIONS, ROUNDINGS, describe_call
from invariants.registry import invariant
from invariants.strategies.core import float_arrays, integers, sampled_from
from invariants.strategies.decoder import position_runs
from invariants.strategies.mla import MSCALES, mla_decode_inputs, mla_inputs
from invariants.tolerance import Tolerance

LESSON = 147  # where a lesson meets this component: the registry's order (test ids, the kill matrix's first failure)
HOLDS = ("mla_attention", "mla_decode")  # the protocol functions whose laws it holds

ATTENTION = FUNCTIONS["mla_attention"]  # called(impl, inputs, call, **changes): out (B, T, d), weights (B, H, T, T) or None
DECODE = FUNCTIONS["mla_decode"]  # out (B, T, d), cache (B, T, r_kv + D_r)
ROUNDING = ROUNDINGS["mla_attention"]
POWERS_OF_TWO = (2.0, 0.5, 4.0, 0.25)  # latent scale factors, exact in every dtype


def draw_mla_inputs(impl, case, label="inputs", *, decode=False, **options):
    """mla_inputs(**options) (mla_decode_inputs where decode) for impl: its ROPE_THETA as the only base where it declares one."""
    if declared(impl, "ROPE_THETA") is not None:
        options["bases"] = (declared(impl, "ROPE_THETA"),)
    return case.draw((mla_decode_inputs if decode else mla_inputs)(**options), label)


@valid_inputs("mla_attention")
def mla_attention_arguments(impl, case):
    """The arguments of one mla_attention call, in protocol order (short sequences: the laws over every entry)."""
    return ATTENTION.arguments_of(draw_mla_inputs(impl, case, max_seq=3))


@valid_inputs("mla_decode")
def mla_decode_arguments(impl, case):
    """The arguments of one mla_decode call, in protocol order."""
    return DECODE.arguments_of(draw_mla_inputs(impl, case, decode=True, max_seq=3))


def with_params(inputs, **params):
    """inputs with some params replaced."""
    return {**inputs, "params": {**inputs["params"], **params}}


def _pieces(impl, inputs):
    """The float64 reference's queries (B, H, T, D_n + D_r) and cache (B, T, r_kv + D_r) of the values impl receives."""
    x, p = impl.as_seen((inputs["x"], inputs["params"]))
    eps = rms_norm_eps(impl)
    return (ref.mla_query(x, p, inputs["n_heads"], inputs["positions"], inputs["rope_base"], eps=eps),
            ref.mla_latent(x, p, inputs["positions"], inputs["rope_base"], eps=eps))


def output_scale(impl, inputs):
    """The size of an output element's terms: max|c·W_uv|·max_j Σ_i |W_o[i, j]| (the weights sum to 1)."""
    p = impl.as_seen(inputs["params"])
    _, cache = _pieces(impl, inputs)
    values = cache[..., : p["W_dkv"].shape[1]] @ p["W_uv"]
    return float(np.abs(values).max(initial=0.0) * np.abs(p["W_o"]).sum(axis=0).max(initial=0.0))


def score_bound(impl, inputs):
    """The largest |q_h·k_h|·mscale²/√(D_n + D_r) of any query and key: how far a score may move when its angles do."""
    q, cache = _pieces(impl, inputs)
    D_n, D_r, _ = ref.mla_widths(inputs["params"], inputs["n_heads"])
    k_size = np.linalg.norm(cache[..., -D_r:], axis=-1).max(initial=0.0) + np.linalg.norm(cache[..., :-D_r], axis=-1).max(initial=0.0) * \
        np.abs(impl.as_seen(inputs["params"]["W_uk"])).sum(axis=0).max(initial=0.0)
    return float(np.linalg.norm(q, axis=-1).max(initial=0.0) * k_size * ref.mla_softmax_scale(D_n, D_r, inputs["mscale"]))


def with_angle_slack(impl, inputs, tol, *, max_position=None):
    """tol plus what a float32 RoPE angle at positions up to max_position may move the weights and the output (relative to their
    scale): a rotation off by δ moves a score by at most 2δ·L (score_bound), the weights by twice that in sum."""
    position = int(inputs["positions"].max()) if max_position is None else max_position
    slack = 4.0 * angle_error(impl, position) * score_bound(impl, inputs)
    return Tolerance(tol.rtol + slack, tol.atol + slack, tol.dtype)


def _compare(impl, inputs, got, expected, tol, what, call):
    """out (and weights, where impl returns them) within tol (the output's at output_scale)."""
    __tracebackhide__ = True
    ATTENTION.assert_parts(got, expected, what, call, {"weights": tol.at_scale(1.0), "out": tol.at_scale(output_scale(impl, inputs))})


def reference_answers(impl, inputs):
    """{pairing: the float64 reference's (out, weights)} for each pairing impl may follow, at its RMSNorm eps."""
    seen = impl.as_seen(ATTENTION.arguments_of(inputs))
    return {p: ref.mla_attention(*seen, pairing=p, eps=rms_norm_eps(impl)) for p in rope_pairings(impl)}


@invariant(
    requires=("mla_attention",),
    hint="the attention is not causal (no mask, a mask built for another length or applied after the softmax), or a latent norm "
    "mixes tokens (a mean square over the sequence axis)",
)
def causal_non_leakage(impl, case):
    """Changing x at positions >= j leaves the output and weights of the queries at positions < j exactly equal."""
    inputs = draw_mla_inputs(impl, case, min_seq=2)
    B, T, d = inputs["x"].shape
    j = case.draw(integers(1, T - 1), "j (first changed position)")
    changed = inputs["x"].copy()
    changed[:, j:] = case.draw(float_arrays((B, T - j, d), min_scale=0.25, max_scale=4.0), "new x[:, j:]")
    call = describe_call("mla_attention", inputs, f"with x[:, {j}:] changed")
    out, weights = ATTENTION.called(impl, inputs, call)
    new_out, new_weights = ATTENTION.called(impl, inputs, call, x=changed)
    if weights is not None:
        assert_equal(new_weights[:, :, :j], weights[:, :, :j], f"weights of the queries at positions < {j}", call)
    assert_equal(new_out[:, :j], out[:, :j], f"output at positions < {j}", call)


@invariant(
    requires=("mla_attention",),
    hint="the scores depend on more than the offset m - n: the RoPE key is not rotated (or rotated at other positions than the "
    "query), q and k are rotated by different rules, or the positions argument is read for one of them only",
)
def relative_positions(impl, case):
    """Shifting every position by s leaves the output and weights unchanged to rounding: the scores depend on m - n only."""
    inputs = draw_mla_inputs(impl, case, min_seq=2)
    shift = case.draw(integers(1, 64), "shift s")
    call = describe_call("mla_attention", inputs, f"vs the same at positions + {shift}")
    got = ATTENTION.called(impl, inputs, call, positions=inputs["positions"] + shift)
    base = ATTENTION.called(impl, inputs, call)
    tol = with_angle_slack(impl, inputs, impl.tolerance.scaled(ROUNDING), max_position=int(inputs["positions"].max()) + shift)
    _compare(impl, inputs, got, base, tol, f"with positions shifted by {shift}", call)


@invariant(
    requires=("mla_attention",),
    hint="RoPE turns more than the decoupled D_r features: the D_n position-free features of the query or key are rotated too "
    "(RoPE over the whole head, or sized by qk_nope_head_dim), or the latent or the values are rotated, so the scores still see "
    "positions when the RoPE key is 0",
)
def nope_part_position_free(impl, case):
    """With W_kr = 0 (the shared RoPE key is 0) the output and weights are bitwise the same at any other positions: only the
    decoupled D_r features carry a position."""
    inputs = draw_mla_inputs(impl, case, min_seq=2)
    inputs = with_params(inputs, W_kr=np.zeros_like(inputs["params"]["W_kr"]))
    other = case.draw(position_runs(inputs["x"].shape[1], max_start=4096), "other positions")
    call = describe_call("mla_attention", inputs, f"with W_kr = 0, vs the same at positions {other.tolist()}")
    got = ATTENTION.called(impl, inputs, call, positions=other)
    ATTENTION.assert_parts(got, ATTENTION.called(impl, inputs, call), "with W_kr = 0 at other positions", call)


@invariant(
    requires=("mla_attention",),
    hint="a latent is not RMS-normalised: kv_norm (kv_a_layernorm) or q_norm (q_a_layernorm) skipped, applied after the up-projection "
    "or over another axis, so the scale of W_dkv or W_dq reaches the keys, values or queries",
)
def latent_rescaling_invariant(impl, case):
    """Multiplying W_dkv (and W_dq where the query is compressed) by a power of two leaves the output and weights unchanged up to
    the eps effect (RMSNorm_eps(s·c) = RMSNorm_eps/s²(c)), which the float64 reference measures and the check allows."""
    inputs = draw_mla_inputs(impl, case)
    s = case.draw(sampled_from(POWERS_OF_TWO), "latent scale s")
    scaled = {name: inputs["params"][name] * s for name in ("W_dkv", "W_dq") if name in inputs["params"]}
    call = describe_call("mla_attention", inputs, f"vs the same with {' and '.join(scaled)} times {s}")
    got = ATTENTION.called(impl, with_params(inputs, **scaled), call)
    base = ATTENTION.called(impl, inputs, call)
    pairing = rope_pairings(impl)[0]
    eps_effect = max(np.abs(a - b).max(initial=0.0) for a, b in zip(reference_answers(impl, with_params(inputs, **scaled))[pairing],
                                                                   reference_answers(impl, inputs)[pairing], strict=True))
    tol = with_angle_slack(impl, inputs, impl.tolerance.scaled(ROUNDING))
    _compare(impl, inputs, got, base, Tolerance(tol.rtol, tol.atol + eps_effect, tol.dtype), f"with the latents times {s}", call)


@invariant(
    requires=("mla_attention",),
    hint="a convention differs from the reference's: the norms' eps or gains, the query's per-head layout (D_n then D_r), the RoPE "
    "key not shared by the heads, a rotated part of the wrong width (vllm#41185: half of it), the softmax scale, the positions "
    "argument ignored (RoPE at 0..T-1), or a latent norm squaring a 16-bit projection without an upcast",
)
def agrees_with_reference(impl, case):
    """mla_attention's output and weights agree with the float64 reference in its RoPE pairing (1e-10 in float64, the dtype
    tolerance otherwise), with W_dkv and W_dq scaled by 2^-2 to 2^10: latents whose squares overflow float16."""
    inputs = draw_mla_inputs(impl, case, min_latent_scale=0.25, max_latent_scale=2.0**10)
    call = describe_call("mla_attention", inputs)
    out, weights = ATTENTION.called(impl, inputs, call)
    answers = reference_answers(impl, inputs)
    tol = with_angle_slack(impl, inputs, reference_tolerance(impl, factor=ROUNDING))
    if weights is not None:
        assert_close_to_a_pairing(impl, weights, {p: a[1] for p, a in answers.items()}, "mla_attention weights", tol.at_scale(1.0), call)
    assert_close_to_a_pairing(impl, out, {p: a[0] for p, a in answers.items()}, "mla_attention output",
                              tol.at_scale(output_scale(impl, inputs)), call)


def known_inputs(mscale):
    """Two tokens at position 0 (no rotation, so any pairing), one head, D_n = D_r = 2, D_v = 1: query 1's score for key 1 is 8 above
    its score for key 0 before the scale (x = e_0, e_1; W_q, W_dkv the identity on the nope part; kv_norm and W_uv from the hint)."""
    eye = np.eye(2)
    params = {"W_q": np.array([[0.0, 0.0, 0.0, 0.0], [-4.0, 4.0, 0.0, 0.0]]),  # token 1's query (-4, 4 | 0, 0), token 0's is 0
              "W_dkv": eye, "kv_norm": np.ones(2), "W_kr": np.zeros((2, 2)), "W_uk": eye * np.sqrt(0.5),  # k_nope = e_t (to eps)
              "W_uv": np.array([[0.0], [np.sqrt(0.5)]]), "W_o": np.array([[1.0, 0.0]])}  # v = (0, 1): out = the weight of key 1
    return {"x": eye[None], "params": params, "n_heads": 1, "positions": np.zeros(2, dtype=np.int64), "rope_base": 10_000.0, "mscale": mscale}


@invariant(
    requires=("mla_attention",),
    hint="the softmax scale is not mscale²/√(D_n + D_r): query 1 gives key 1 the weight σ(4·m²) = 0.982 for m = 1 and 0.9994 for "
    "DeepSeek-V3's m = 1.369; √D_n alone gives σ(5.66) = 0.9965, a scale without YaRN's m² (onnxruntime/mobius#548, "
    "transformers#47435) 0.982 where 0.9994 is due, a √D multiplied in place of 1/√D (maxtext#1370) σ(16) = 1.0000",
)
def softmax_scale_known_values(impl, case):
    """On two tokens whose raw scores differ by 8, query 1 weighs its keys by the softmax of those scores times mscale²/√(D_n + D_r),
    with mscale 1 and YaRN's DeepSeek-V3 factor (1.369): its output is the weight of key 1."""
    for mscale in (1.0, MSCALES[-1]):
        inputs = known_inputs(mscale)
        call = describe_call("mla_attention", inputs, f"on two tokens, one head, D_n = D_r = 2, mscale = {mscale:.4f}")
        got = ATTENTION.called(impl, inputs, call)
        expected = ref.mla_attention(*ATTENTION.arguments_of(inputs), eps=rms_norm_eps(impl))
        _compare(impl, inputs, got, expected, impl.tolerance.scaled(ROUNDING), "on the known inputs", call)


def _cache(impl, inputs, call, **changes):
    """impl's mla_decode cache (B, T, width), its width held to r_kv + D_r."""
    __tracebackhide__ = True
    _, cache = DECODE.called(impl, inputs, call, **changes)
    r_kv, D_r = inputs["params"]["W_dkv"].shape[1], inputs["params"]["W_kr"].shape[1]
    assert_value(cache.shape[-1], r_kv + D_r, "numbers mla_decode's cache holds per token (r_kv + D_r: the latent and the shared RoPE key)",
                 call)
    return cache


def doubled_heads(inputs):
    """inputs with every head repeated once (2H heads: W_uq or W_q, W_uk and W_uv twice over, W_o's rows twice, halved)."""
    p = inputs["params"]
    query = "W_q" if "W_q" in p else "W_uq"
    doubled = {name: np.concatenate([p[name], p[name]], axis=1) for name in (query, "W_uk", "W_uv")}
    return {**with_params(inputs, **doubled, W_o=np.concatenate([p["W_o"], p["W_o"]]) / 2), "n_heads": 2 * inputs["n_heads"]}


@invariant(
    requires=("mla_decode",),
    hint="the cache holds more than each token's latent and RoPE key: per-head keys and values decompressed before caching "
    "(deepseek-ai/DeepSeek-R1#238: the released modeling code cached them), or keys and values repeated per head, so it grows with H",
)
def cache_size(impl, case):
    """mla_decode's cache holds r_kv + D_r numbers per token, and is bitwise the same with every head doubled: it never reads a head."""
    inputs = draw_mla_inputs(impl, case, decode=True)
    call = describe_call("mla_decode", inputs, f"vs the same with the heads doubled (n_heads = {2 * inputs['n_heads']})")
    assert_equal(_cache(impl, doubled_heads(inputs), call), _cache(impl, inputs, call), "mla_decode cache with the heads doubled", call)


@invariant(
    requires=("mla_decode",),
    hint="the cache is not [RMSNorm(x·W_dkv), RoPE(x·W_kr)] per token: kv_norm applied after the cache (or not at all), the RoPE "
    "key cached before its rotation or at other positions, or the two in the other order",
)
def cache_agrees_with_reference(impl, case):
    """mla_decode's cache is each token's normalised latent RMSNorm(x·W_dkv; kv_norm), then its RoPE key RoPE(x·W_kr) rotated at
    its position, in token order, to rounding (in its RoPE pairing; interleaved pairs may be stored de-interleaved, which no score sees)."""
    inputs = draw_mla_inputs(impl, case, decode=True)
    call = describe_call("mla_decode", inputs)
    cache = _cache(impl, inputs, call)
    x, p = impl.as_seen((inputs["x"], inputs["params"]))
    answers = {pairing: ref.mla_latent(x, p, inputs["positions"], inputs["rope_base"], pairing=pairing, eps=rms_norm_eps(impl))
               for pairing in rope_pairings(impl)}
    if "interleaved" in answers:  # the RoPE key's pairs may be kept de-interleaved (evens, then odds), as transformers caches it
        kept, D_r = answers["interleaved"], p["W_kr"].shape[1]
        answers["interleaved, kept de-interleaved"] = np.concatenate([kept[..., :-D_r], kept[..., -D_r::2], kept[..., 1 - D_r :: 2]], axis=-1)
    scale = max(float(np.abs(a).max(initial=0.0)) for a in answers.values())
    tol = reference_tolerance(impl, factor=ROUNDING)
    tol = Tolerance(tol.rtol + angle_error(impl, int(inputs["positions"].max())), tol.atol, tol.dtype)
    assert_close_to_a_pairing(impl, cache, answers, "mla_decode cache", tol.at_scale(scale), call)


@invariant(
    requires=("mla_decode", "mla_attention"),
    hint="the decode differs from the attention it computes: W_uk or W_uv absorbed with a head's weights transposed or another "
    "head's, the scale or the mask of a chunk on the cache wrong (the new queries are the last of the cached positions), or each "
    "chunk rotated from position 0 (executorch#2010)",
)
def decode_equals_attention(impl, case):
    """mla_decode's output over any chunks equals mla_attention's on the whole sequence, to rounding: the absorbed decode (W_uk
    folded into the query, W_uv into the output) computes the same attention as the naive one."""
    inputs = draw_mla_inputs(impl, case, decode=True, min_chunks=2)
    call = describe_call("mla_decode", inputs, "vs mla_attention on the whole sequence")
    out, _ = DECODE.called(impl, inputs, call)
    expected, _ = ATTENTION.called(impl, inputs, call)
    tol = impl.tolerance.scaled(ROUNDING).at_scale(output_scale(impl, inputs))
    DECODE.assert_parts((out, None), (expected, None), "vs mla_attention's", call, {"out": tol})
