"""Invariants of attention with QK-norm: scale invariance per head, bounded scores, values untouched, causality, GQA, RoPE, the reference.

qk_norm_attention(x (B, T, d), params, n_heads, n_kv_heads, positions (T,), rope_base) is causal
grouped-query attention whose queries and keys are RMS-normalised per head, over D, with gains
q_norm and k_norm (D,) shared by the heads, before RoPE (Qwen3, Gemma 3; transformers'
modeling_qwen3.Qwen3Attention). It returns out (B, T, d) and weights (B, H, T, T) (out alone
under ATTENTION_WEIGHTS = False). OLMo 2 normalises the whole projection (H·D features, gains of
that width) instead: another function, not this one.

What the norm buys, and what holds exactly:
- RMSNorm_eps(c·q) = RMSNorm_{eps/c²}(q) for c > 0, so scaling one head's query (or key) projection
  by c changes nothing but that head's eps: the output is invariant up to the eps effect. The check
  (`head_rescaling_invariant`) scales by powers of two (exact in every dtype), first lifts each head's
  mean square towards 10·eps/rtol (so the eps effect is at most rtol/20), and allows the
  eps effect that remains as the float64 reference measures it.
- A normalised head vector has norm at most √D·max|gain|, so every score q̂·k̂/√D lies within
  ±√D·max|q_norm|·max|k_norm| = ±L whatever the weights' scale, and a query that sees n keys gives each at
  least 1/(1 + (n - 1)·e^(2L)) (exact in real arithmetic; checked to rounding).
- Values are not normalised: the output is linear in W_v (to rounding; the weights do not depend on it, exactly).
- Causality is bitwise; the GQA head mapping, the RoPE shift law and the reference agreement hold to rounding.
"""

from __future__ import annotations

import numpy as np
from hypothesis import strategies as st

import invariants.reference.numpy as ref
from invariants.asserts import assert_close, assert_equal, assert_where
from invariants.conventions import declared, declared_skip, rms_norm_eps
from invariants.inputs import valid_inputs
from invariants.laws.reference_check import reference_tolerance
from invariants.laws.rope import angle_error, assert_close_to_a_pairing, rope_pairings
from invariants.protocol import FUNCTIONS, ROUNDINGS, describe_call
from invariants.registry import invariant
from invariants.strategies.core import float_arrays, integers, sampled_from
from invariants.strategies.decoder import qk_norm_inputs
from invariants.tolerance import Tolerance

LESSON = 145  # where a lesson meets this component: the registry's order (test ids, the kill matrix's first failure)
HOLDS = ("qk_norm_attention",)  # the protocol functions whose laws it holds

QK_NORM = FUNCTIONS["qk_norm_attention"]  # called(impl, inputs, call, **changes): out (B, T, d), weights (B, H, T, T) or None
ROUNDING = ROUNDINGS["qk_norm_attention"]
POWERS_OF_TWO = (0.25, 0.5, 2.0, 4.0)  # scale factors exact in every dtype
HEAD_SCALES = (2.0, 1.0, 4.0, 0.5, 0.25)  # per-head factors: every head scaled by 2 first, different factors as it searches

_NO_WEIGHTS = declared_skip("ATTENTION_WEIGHTS", lambda value: value is False, "it returns no weights, which this invariant reads")


def draw_qk_norm_inputs(impl, case, label="inputs", **options):
    """qk_norm_inputs(**options) for impl: its ROPE_THETA as the only base where it declares one."""
    if declared(impl, "ROPE_THETA") is not None:
        options["bases"] = (declared(impl, "ROPE_THETA"),)
    return case.draw(qk_norm_inputs(**options), label)


@valid_inputs("qk_norm_attention")
def qk_norm_attention_arguments(impl, case):
    """The arguments of one qk_norm_attention call, in protocol order (short sequences: the laws over every entry)."""
    return QK_NORM.arguments_of(draw_qk_norm_inputs(impl, case, max_seq=3))


def with_params(inputs, **params):
    """inputs with some params replaced."""
    return {**inputs, "params": {**inputs["params"], **params}}


def heads_of(W, D):
    """(d, n·D) -> (d, n, D): the columns of each head."""
    return W.reshape(W.shape[0], -1, D)


def score_bound(impl, inputs):
    """L = √D·max|q_norm|·max|k_norm|: no score q̂·k̂/√D can exceed it in size."""
    p = impl.as_seen(inputs["params"])
    return float(np.sqrt(p["q_norm"].size) * np.abs(p["q_norm"]).max() * np.abs(p["k_norm"]).max())


def output_scale(impl, inputs):
    """The size of an output element's terms: max|v|·max_j Σ_i |W_o[i, j]| (the weights sum to 1)."""
    x, p = impl.as_seen((inputs["x"], inputs["params"]))
    return float(np.abs(x @ p["W_v"]).max(initial=0.0) * np.abs(p["W_o"]).sum(axis=0).max(initial=0.0))


def with_angle_slack(impl, inputs, tol, *, max_position=None):
    """tol plus what a float32 RoPE angle at positions up to max_position may move the weights and the output (relative to their scale).

    A rotation off by δ moves a score by at most 2δ·L (score_bound); the weights then move by at most twice that in sum,
    so the slack is 4·angle_error·L, on the weights' scale (1) and the output's.
    """
    position = int(inputs["positions"].max()) if max_position is None else max_position
    slack = 4.0 * angle_error(impl, position) * score_bound(impl, inputs)
    return Tolerance(tol.rtol + slack, tol.atol + slack, tol.dtype)


def reference_answers(impl, inputs):
    """{pairing: the float64 reference's (out, weights)} for each pairing impl may follow, at its RMSNorm eps."""
    seen = impl.as_seen(QK_NORM.arguments_of(inputs))
    return {p: ref.qk_norm_attention(*seen, pairing=p, eps=rms_norm_eps(impl)) for p in rope_pairings(impl)}


def _compare(impl, inputs, got, expected, tol, what, call):
    """out (and weights, where impl returns them) within tol (the output's at output_scale)."""
    __tracebackhide__ = True
    QK_NORM.assert_parts(got, expected, what, call, {"weights": tol.at_scale(1.0), "out": tol.at_scale(output_scale(impl, inputs))})


@invariant(
    requires=("qk_norm_attention",),
    hint="the attention is not causal (no mask, a mask built for another length or applied after the softmax), or the norm mixes "
    "tokens (a mean square over the sequence axis instead of each head's D features)",
)
def causal_non_leakage(impl, case):
    """Changing x at positions >= j leaves the output and weights of the queries at positions < j exactly equal."""
    inputs = draw_qk_norm_inputs(impl, case, min_seq=2)
    B, T, d = inputs["x"].shape
    j = case.draw(integers(1, T - 1), "j (first changed position)")
    changed = inputs["x"].copy()
    changed[:, j:] = case.draw(float_arrays((B, T - j, d), min_scale=0.25, max_scale=4.0), "new x[:, j:]")
    call = describe_call("qk_norm_attention", inputs, f"with x[:, {j}:] changed")
    QK_NORM.assert_parts(QK_NORM.called(impl, inputs, call, x=changed), QK_NORM.called(impl, inputs, call),
                         f"of the queries at positions < {j}", call, select=lambda part, value: value[..., :j, :])  # (B, T, d), (B, H, T, T)


@invariant(
    requires=("qk_norm_attention",),
    hint="the angle depends on more than the offset m - n: the norm is applied after RoPE (its gain then differs within a rotated "
    "pair, so the scores see absolute positions), the positions argument is ignored for q or k, or q and k are rotated by "
    "different rules",
)
def relative_positions(impl, case):
    """Shifting every position by s leaves the output and weights unchanged to rounding: the scores depend on m - n only."""
    inputs = draw_qk_norm_inputs(impl, case, min_seq=2)
    shift = case.draw(integers(1, 64), "shift s")
    call = describe_call("qk_norm_attention", inputs, f"vs the same at positions + {shift}")
    got = QK_NORM.called(impl, inputs, call, positions=inputs["positions"] + shift)
    base = QK_NORM.called(impl, inputs, call)
    tol = with_angle_slack(impl, inputs, impl.tolerance.scaled(ROUNDING), max_position=int(inputs["positions"].max()) + shift)
    _compare(impl, inputs, got, base, tol, f"with positions shifted by {shift}", call)


@invariant(
    requires=("qk_norm_attention",),
    hint="query head h does not read kv head h // (H / H_kv) (the kv heads tiled [kv0, kv1, kv0, kv1] instead of repeat-interleaved), "
    "or the key norm reads across kv heads",
)
def repeated_kv_heads(impl, case):
    """qk_norm_attention equals itself with W_k's and W_v's kv heads repeated for their groups in repeat-interleave order
    (n_kv_heads = H), to rounding."""
    inputs = draw_qk_norm_inputs(impl, case, min_group=2)
    H, H_kv, D = inputs["n_heads"], inputs["n_kv_heads"], inputs["params"]["q_norm"].size
    group = H // H_kv
    call = describe_call("qk_norm_attention", inputs, f"vs the same with W_k's and W_v's kv heads repeat-interleaved {group}× (n_kv_heads = {H})")
    repeated = {name: np.repeat(heads_of(inputs["params"][name], D), group, axis=1).reshape(-1, H * D) for name in ("W_k", "W_v")}
    got = QK_NORM.called(impl, with_params(inputs, **repeated), call, n_kv_heads=H)
    base = QK_NORM.called(impl, inputs, call)
    _compare(impl, inputs, got, base, with_angle_slack(impl, inputs, impl.tolerance.scaled(ROUNDING)), "with the kv heads repeated", call)


def largest_value(impl):
    """The largest finite value of impl's dtype (bfloat16 has float32's range)."""
    return float(np.finfo("float32" if impl.dtype == "bfloat16" else impl.dtype).max)


def lifted(impl, inputs):
    """inputs with W_q and W_k times powers of two (at most 2^8) that put every head's mean square at or above 10·eps/rtol, as far as
    the squares of the largest, HEAD_SCALES included, stay 16 times below the dtype's largest value (float16: 65,504)."""
    x, p = impl.as_seen((inputs["x"], inputs["params"]))
    D, floor = p["q_norm"].size, 10.0 * rms_norm_eps(impl) / impl.tolerance.rtol
    lifts = {}
    for name in ("W_q", "W_k"):
        squares = (heads_of(x @ p[name], D) ** 2).mean(axis=-1)  # (B, T, n): each head's mean square
        smallest, largest = float(squares[squares > 0].min(initial=floor)), float(squares.max(initial=floor))
        wanted = np.ceil(np.log2(floor / smallest) / 2)
        room = np.floor(np.log2(largest_value(impl) / (16.0 * D * largest * max(HEAD_SCALES) ** 2)) / 2)  # D·ms bounds every square
        lifts[name] = 2.0 ** max(0, int(min(wanted, room, 8)))
    return with_params(inputs, W_q=inputs["params"]["W_q"] * lifts["W_q"], W_k=inputs["params"]["W_k"] * lifts["W_k"])


@invariant(
    requires=("qk_norm_attention",),
    hint="the queries or keys are not normalised per head: the norm is missing on the keys (or the queries), taken over the whole "
    "projection or d_model (one head's scale then changes the others)",
)
def head_rescaling_invariant(impl, case):
    """Multiplying each query head's columns of W_q, and each kv head's of W_k, by its own power of two leaves the output and weights
    unchanged up to the eps effect (RMSNorm_eps(c·q) = RMSNorm_eps/c²(q)), which is kept below rounding and allowed for."""
    inputs = lifted(impl, draw_qk_norm_inputs(impl, case))
    H, H_kv, D = inputs["n_heads"], inputs["n_kv_heads"], inputs["params"]["q_norm"].size
    q_scales = np.array(case.draw(st.lists(sampled_from(HEAD_SCALES), min_size=H, max_size=H), "query head scales"))
    k_scales = np.array(case.draw(st.lists(sampled_from(HEAD_SCALES), min_size=H_kv, max_size=H_kv), "kv head scales"))
    scaled = with_params(inputs, W_q=(heads_of(inputs["params"]["W_q"], D) * q_scales[:, None]).reshape(-1, H * D),
                         W_k=(heads_of(inputs["params"]["W_k"], D) * k_scales[:, None]).reshape(-1, H_kv * D))
    call = describe_call("qk_norm_attention", inputs, f"vs the same with W_q's heads times {q_scales.tolist()} and W_k's times {k_scales.tolist()}")
    got = QK_NORM.called(impl, scaled, call)
    base = QK_NORM.called(impl, inputs, call)
    pairing = rope_pairings(impl)[0]
    eps_effect = max(np.abs(a - b).max(initial=0.0) for a, b in zip(reference_answers(impl, scaled)[pairing],
                                                                   reference_answers(impl, inputs)[pairing], strict=True))
    tol = with_angle_slack(impl, inputs, impl.tolerance.scaled(ROUNDING))
    tol = Tolerance(tol.rtol, tol.atol + eps_effect, tol.dtype)
    _compare(impl, inputs, got, base, tol, "with the heads rescaled", call)


@invariant(
    requires=("qk_norm_attention",),
    hint="the values are normalised too (an RMSNorm on v makes the output blind to W_v's scale), or RoPE or a gain is applied to "
    "them: only the queries and keys are normalised and rotated",
)
def linear_in_values(impl, case):
    """Multiplying W_v by c (a power of two) multiplies the output by c, to rounding, and leaves the weights exactly unchanged."""
    inputs = draw_qk_norm_inputs(impl, case)
    c = case.draw(sampled_from(POWERS_OF_TWO), "c")
    call = describe_call("qk_norm_attention", inputs, f"vs the same with W_v times {c}")
    out, weights = QK_NORM.called(impl, with_params(inputs, W_v=inputs["params"]["W_v"] * c), call)
    base_out, base_weights = QK_NORM.called(impl, inputs, call)
    if weights is not None:
        assert_equal(weights, base_weights, f"weights with W_v times {c}", call)
    # A power of two scales every rounding of the values' path exactly, except where a value falls below the normal range:
    # one rounding of each call (2) is what may differ.
    tol = impl.tolerance.scaled(2).at_scale(abs(c) * output_scale(impl, inputs))
    assert_close(out, c * base_out.astype(np.float64), f"output with W_v times {c} (expected {c} times the output)", tol, call)


@invariant(
    requires=("qk_norm_attention",),
    hint="the norm is not per head over D with its gains (q_norm and k_norm swapped, over the whole projection or d_model, eps "
    "outside the root, after RoPE), the values normalised too, a scale other than 1/√D, the positions argument ignored (RoPE "
    "at 0..T-1), or a 16-bit projection squared without an upcast to float32 (past 256, x² is inf in float16)",
)
def agrees_with_reference(impl, case):
    """qk_norm_attention's output and weights agree with the float64 reference in its RoPE pairing (1e-10 in float64, the dtype
    tolerance otherwise), with W_q and W_k scaled by 2^-2 to 2^10: projections in the thousands, whose squares overflow float16,
    so the per-head norm squares in float32 (as rms_norm_large_rows demands of rms_norm)."""
    inputs = draw_qk_norm_inputs(impl, case, min_qk_scale=0.25, max_qk_scale=2.0**10)
    call = describe_call("qk_norm_attention", inputs)
    out, weights = QK_NORM.called(impl, inputs, call)
    answers = reference_answers(impl, inputs)
    tol = with_angle_slack(impl, inputs, reference_tolerance(impl, factor=ROUNDING))
    if weights is not None:
        assert_close_to_a_pairing(impl, weights, {p: a[1] for p, a in answers.items()}, "qk_norm_attention weights", tol.at_scale(1.0), call)
    assert_close_to_a_pairing(impl, out, {p: a[0] for p, a in answers.items()}, "qk_norm_attention output",
                              tol.at_scale(output_scale(impl, inputs)), call)


@invariant(
    requires=("qk_norm_attention",),
    hint="the scores are not bounded by the norm: the keys (or queries) are not normalised, the gains are applied twice, or the "
    "norm divides by something other than the root mean square (a scaled-up projection then saturates the softmax)",
    applies=_NO_WEIGHTS,
)
def weights_bounded_below(impl, case):
    """With W_q and W_k scaled by up to 2^10 in every dtype, a query that sees n keys still gives each at least 1/(1 + (n - 1)·e^(2L)),
    L = √D·max|q_norm|·max|k_norm| the bound on every score (to rounding), and the keys it does not see exactly 0.

    The projections then reach thousands, representable in float16 while their squares are not: the per-head norm squares in
    float32, as rms_norm_large_rows demands of rms_norm (the protocol's norms are float32 norms in every dtype)."""
    inputs = draw_qk_norm_inputs(impl, case, min_seq=2, min_qk_scale=1.0, max_qk_scale=2.0**10)
    call = describe_call("qk_norm_attention", inputs, f"with W_q and W_k of scale {inputs['params']['W_q'].std():.3g}")
    _, weights = QK_NORM.called(impl, inputs, call)
    T = inputs["x"].shape[1]
    seen = np.tril(np.ones((T, T), dtype=bool))  # (T, T): query i sees keys 0..i
    n = seen.sum(axis=-1)[:, None]  # (T, 1)
    bound = score_bound(impl, inputs)
    floor = 1.0 / (1.0 + (n - 1) * np.exp(2.0 * bound))  # (T, 1)
    rounding = impl.tolerance.rtol * ROUNDING * (1.0 + 2.0 * bound)  # a weight's relative error: its own, and twice its score's (<= L)
    allowed = floor * (1.0 - rounding) - impl.tolerance.atol
    assert_where(~seen | (weights >= allowed), weights, "weight of a visible key",
                 f">= 1/(1 + (n - 1)·e^(2L)) - rounding, L = {bound:.4g} (here at least {float(allowed.min()):.3g})", call)
    assert_equal(np.where(seen, 0.0, weights), np.zeros_like(weights), "weights of the keys after each query", call)
