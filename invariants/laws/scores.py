"""Invariants of the attention scores as shipped: ALiBi (BLOOM, MPT, Baichuan), softcapping (Gemma 2, Grok) and gpt-oss's
attention sinks.

alibi_slopes(H) are Press et al.'s (2022, §3): geometric from 2^(-8/H) for H a power of two, else the largest power of two
P's followed by every other slope of 2P. alibi_attention(q, k, v, slopes, key_mask) is causal GQA whose head h adds
-slopes[h]·(distance back) to each scaled score; a bias that depends on the distance alone is what lets a KV cache hold keys
once. softcap(x, cap) = cap·tanh(x / cap); softcapped_attention caps the scaled scores before the mask (a mask first turns
-inf into -cap, and masked keys leak: onnx/onnx#7865). sink_attention adds head h's logit sinks[h] to each row's softmax
as a column that is then dropped: the weights over the keys sum to less than 1, and the sink belongs in the softmax's max
(one far above every score must not overflow). The q, k, v, masks and windows are gqa.py's draws, honouring the same
declarations; the sources are cited in invariants/protocol.py (SCORES_DETAILS) and invariants/reference/numpy.py.
"""

from __future__ import annotations

import numpy as np

import invariants.reference.numpy as ref
from invariants.asserts import assert_close, assert_where
from invariants.conventions import declared_skip
from invariants.inputs import valid_inputs
from invariants.laws.gqa import draw_gqa_inputs, fully_masked_convention, value_scale
from invariants.laws.reference_check import reference_tolerance
from invariants.protocol import FUNCTIONS, ROUNDINGS, describe_call
from invariants.registry import invariant
from invariants.strategies.core import integers, one_of, sampled_from
from invariants.strategies.scores import (
    ALIBI_PATTERNS,
    OTHER_HEAD_COUNTS,
    POWERS_OF_TWO,
    SMALL_CAPS,
    alibi_slope_arrays,
    capped_logits,
    head_counts,
    sink_logits,
)
from invariants.tolerance import Tolerance

LESSON = 87  # where a lesson meets this component: the registry's order (test ids, the kill matrix's first failure)
HOLDS = ("alibi_slopes", "alibi_attention", "softcap", "softcapped_attention", "sink_attention")  # the protocol functions whose laws it holds

ALIBI, CAPPED, SINKS = FUNCTIONS["alibi_attention"], FUNCTIONS["softcapped_attention"], FUNCTIONS["sink_attention"]
SLOPES_TOL = Tolerance(1e-6, 0.0, "float32")  # slopes are constants a model builds once, in float32 (BLOOM): float32's rounding in every run

_TOP_LEFT = declared_skip("CAUSAL_ALIGNMENT", lambda alignment: alignment == "top_left",
                          "its causal mask aligns top-left when there are fewer queries than keys, which this invariant is about")
_NO_WEIGHTS = declared_skip("ATTENTION_WEIGHTS", lambda value: value is False, "it returns no weights, which this invariant reads")


def _fully_masked(impl):
    return "uniform" if fully_masked_convention(impl) == "uniform" else "zeros"


def draw_alibi_inputs(impl, case, **shape):
    """{q, k, v, slopes, key_mask}: gqa.py's causal draws (declarations honoured), padding on the left or the right, and slopes."""
    drawn = draw_gqa_inputs(impl, case, shape=shape, causal=True, windowed=False, patterns=ALIBI_PATTERNS)
    inputs = {name: drawn[name] for name in ("q", "k", "v", "key_mask")}
    return {**inputs, "slopes": case.draw(alibi_slope_arrays(drawn["q"].shape[1]), "slopes")}


def draw_capped_inputs(impl, case, caps=None, **options):
    """{q, k, v, causal, key_mask, window, cap}: gqa.py's draws with scores up to 16 in size, and a cap."""
    inputs = draw_gqa_inputs(impl, case, min_scale=1.0, max_scale=4.0, **options)
    return {**inputs, "cap": case.draw(sampled_from(caps or (1.0, 2.0, 5.0, 30.0, 50.0)), "cap")}


def draw_sink_inputs(impl, case, large=False, **options):
    """{q, k, v, causal, key_mask, window, sinks}: gqa.py's draws and one sink logit per query head."""
    inputs = draw_gqa_inputs(impl, case, **options)
    return {**inputs, "sinks": case.draw(sink_logits(inputs["q"].shape[1], large=large), "sinks")}


def _visible(inputs, causal=True, window=None):
    """(B, 1, T, S) where each query may look."""
    q, k = inputs["q"], inputs["k"]
    seen = ref.visible_keys(q.shape[2], k.shape[2], inputs.get("causal", causal), inputs.get("window", window))[None, None]
    if inputs["key_mask"] is not None:
        seen = seen & np.asarray(inputs["key_mask"], dtype=bool)[:, None, None, :]
    return np.broadcast_to(seen, (q.shape[0], 1) + seen.shape[2:])


def _tolerances(impl, inputs, name):
    tol = reference_tolerance(impl, factor=ROUNDINGS[name])
    return {"weights": tol, "out": tol.at_scale(value_scale(impl, inputs))}


def _agrees(impl, entry, inputs, expected):
    """entry's answer on `inputs` agrees with `expected` (out, weights) to the reference tolerance."""
    call = describe_call(entry.name, inputs)
    entry.assert_parts(entry.called(impl, inputs, call), expected, "", call, _tolerances(impl, inputs, entry.name))


@valid_inputs("alibi_slopes")
def alibi_slopes_arguments(impl, case):
    """A head count from 1 to 64: powers of two, the published others, any."""
    return (case.draw(head_counts(), "n_heads"),)


@valid_inputs("alibi_attention")
def alibi_attention_arguments(impl, case):
    """gqa_attention's causal draws with left or right padding, and the model's slopes or drawn ones."""
    return ALIBI.arguments_of(draw_alibi_inputs(impl, case))


@valid_inputs("softcap")
def softcap_arguments(impl, case):
    """Logits up to 60000 in size and a cap from 1 to 50."""
    drawn = case.draw(capped_logits(), "logits")
    return drawn["x"], drawn["cap"]


@valid_inputs("softcapped_attention")
def softcapped_attention_arguments(impl, case):
    """gqa_attention's draws, scores up to 16, and a cap from 1 to 50."""
    return CAPPED.arguments_of(draw_capped_inputs(impl, case))


@valid_inputs("sink_attention")
def sink_attention_arguments(impl, case):
    """gqa_attention's draws and sinks in [-4, 4]."""
    return SINKS.arguments_of(draw_sink_inputs(impl, case))


# ---------------------------------------------------------------------------
# ALiBi: alibi_slopes, alibi_attention
# ---------------------------------------------------------------------------


def _slopes(impl, n_heads):
    """impl's alibi_slopes(n_heads) as float64 (H,)."""
    return FUNCTIONS["alibi_slopes"].checked(impl, (n_heads,), f"alibi_slopes({n_heads})")[0].astype(np.float64)


@invariant(
    requires=("alibi_slopes",),
    hint=(
        "for H a power of two the slopes are not 2^(-8/H), 2^(-16/H), ..., 2^(-8): the exponent off by one, head 0 given slope 1 "
        "(paiml/aprender#2143), or the ratio not 2^(-8/H)"
    ),
)
def alibi_slopes_powers_of_two(impl, case):
    """For H a power of two the slopes are geometric: the first is 2^(-8/H), each next the last times 2^(-8/H), the last 2^(-8)."""
    n_heads = case.draw(sampled_from(POWERS_OF_TWO), "n_heads (a power of two)")
    expected = 2.0 ** (-8.0 * np.arange(1, n_heads + 1) / n_heads)
    assert_close(_slopes(impl, n_heads), expected, f"alibi_slopes({n_heads})", SLOPES_TOL, f"alibi_slopes({n_heads})")


@invariant(
    requires=("alibi_slopes",),
    hint=(
        "for H not a power of two the slopes are not those of the largest power of two P < H followed by every other slope of 2P: "
        "one geometric sequence 2^(-8i/H) (ml-explore/mlx#3071), or 2P's slopes reordered (TensorRT-LLM#1611)"
    ),
)
def alibi_slopes_other_counts(impl, case):
    """For H not a power of two, alibi_slopes(H) is alibi_slopes(P) for the largest power of two P < H, then the 1st, 3rd, ...
    of alibi_slopes(2P), H - P of them (Press et al.'s get_slopes, BLOOM's build_alibi_tensor)."""
    n_heads = case.draw(one_of(sampled_from(OTHER_HEAD_COUNTS), integers(3, 63)), "n_heads")
    n_heads += n_heads & (n_heads - 1) == 0  # a power of two: the next count, which is not
    closest = 1 << (n_heads.bit_length() - 1)
    expected = np.concatenate([_slopes(impl, closest), _slopes(impl, 2 * closest)[0::2][: n_heads - closest]])
    assert_close(_slopes(impl, n_heads), expected, f"alibi_slopes({n_heads}) vs alibi_slopes({closest}) then every other of "
                 f"alibi_slopes({2 * closest})", SLOPES_TOL, f"alibi_slopes({n_heads})")


@invariant(
    requires=("alibi_attention",),
    hint=(
        "with q = 0 the weights do not fall by e^(-slope) per step back: the bias's sign is flipped, -slope·(j - i) "
        "(meta-pytorch/attention-gym#86), it is divided by √D with the scores, or head h reads another head's slope"
    ),
    applies=_NO_WEIGHTS,
)
def alibi_attention_decays_with_distance(impl, case):
    """With q = 0 every score is its bias alone: each query's weights over the keys it sees are e^(-slopes[h]·d) normalised,
    d the key's distance back, falling by e^(-slopes[h]) per step (each head its own slope)."""
    inputs = draw_alibi_inputs(impl, case)
    inputs["q"] = np.zeros_like(inputs["q"])
    call = describe_call("alibi_attention", inputs, "with q = 0 (scores = the bias alone)")
    _, weights = ALIBI.called(impl, inputs, call)
    T, S = inputs["q"].shape[2], inputs["k"].shape[2]
    distance = np.arange(S - T, S)[:, None] - np.arange(S)[None, :]  # (T, S)
    seen = _visible(inputs)  # (B, 1, T, S)
    decay = np.where(seen, np.exp(-impl.as_seen(inputs["slopes"])[:, None, None] * distance), 0.0)  # (B, H, T, S)
    total = decay.sum(axis=-1, keepdims=True)
    rows = seen.any(axis=-1, keepdims=True) | (fully_masked_convention(impl) != "any")
    expected = np.where(total > 0, decay / np.where(total > 0, total, 1.0), 1.0 / S if _fully_masked(impl) == "uniform" else 0.0)
    assert_close(np.where(rows, weights, 0.0), np.where(rows, expected, 0.0), "alibi_attention weights with q = 0",
                 reference_tolerance(impl, factor=ROUNDINGS["alibi_attention"]), call)


@invariant(
    requires=("alibi_attention",),
    hint=(
        "the last t queries alone (a KV-cache step) do not give the full call's last t rows: the bias is built over the queries, "
        "not the keys, so a one-token step gets none (keras-team/keras-hub#2861), or a query's distance counts from its index "
        "in the step instead of its position S - T + i"
    ),
    applies=_TOP_LEFT,
)
def alibi_attention_queries_shorter_than_keys(impl, case):
    """The last t of T queries over the same S = T keys give the last t rows of the full call, outputs and weights, to rounding:
    ALiBi depends on the distance back alone, so a KV-cache step needs no bias of its own."""
    inputs = draw_alibi_inputs(impl, case, min_seq=2, max_cached=0)
    T = inputs["q"].shape[2]
    t = case.draw(integers(1, T - 1), "t (queries kept)")
    call = describe_call("alibi_attention", inputs, f"vs the same with only the last {t} queries, q[:, :, {T - t}:]")
    out, weights = ALIBI.called(impl, inputs, call)
    rows = (_visible(inputs).any(axis=-1) | (fully_masked_convention(impl) != "any"))[:, :, T - t :, None]  # (B, 1, t, 1)
    tol = impl.tolerance.scaled(2)
    ALIBI.assert_parts(ALIBI.called(impl, inputs, call, q=inputs["q"][:, :, T - t :]), (out[:, :, T - t :],
                       None if weights is None else weights[:, :, T - t :]), f"of the last {t} queries alone", call,
                       {"weights": tol, "out": tol.at_scale(value_scale(impl, inputs))}, select=lambda part, value: np.where(rows, value, 0.0))


@invariant(
    requires=("alibi_attention",),
    hint="the bias is not -slopes[h]·(distance back) added after the 1/√D scaling, or the mask or the kv heads differ from gqa_attention's",
)
def alibi_attention_agrees_with_reference(impl, case):
    """alibi_attention agrees with the float64 reference (1e-10 in float64, the dtype tolerance otherwise), padding and cache included."""
    inputs = draw_alibi_inputs(impl, case)
    expected = ref.alibi_attention(*ALIBI.arguments_of(impl.as_seen(inputs)), fully_masked=_fully_masked(impl))
    rows = _visible(inputs).any(axis=-1, keepdims=True) | (fully_masked_convention(impl) != "any")
    call = describe_call("alibi_attention", inputs)
    ALIBI.assert_parts(ALIBI.called(impl, inputs, call), expected, "", call, _tolerances(impl, inputs, "alibi_attention"),
                       select=lambda part, value: np.where(rows, value, 0.0))


# ---------------------------------------------------------------------------
# Softcapping: softcap, softcapped_attention
# ---------------------------------------------------------------------------


def _softcapped(impl, x, cap, call):
    return FUNCTIONS["softcap"].checked(impl, (x, cap), call)[0].astype(np.float64)


@invariant(
    requires=("softcap",),
    hint=(
        "softcap is not finite and within ±cap for logits far beyond it: tanh computed as (e^2y - 1)/(e^2y + 1), which is inf/inf "
        "for large y (vllm#56578), or the cap is left out"
    ),
)
def softcap_bounded(impl, case):
    """softcap(x, cap) is finite, has x's sign and lies within ±cap, for logits up to 60000 in size."""
    drawn = case.draw(capped_logits(), "logits")
    x, cap = drawn["x"], drawn["cap"]
    call = f"softcap(x{list(x.shape)} up to {np.abs(x).max():g}, cap={cap})"
    y = _softcapped(impl, x, cap, call)
    seen = impl.as_seen(x)
    assert_where(np.isfinite(y) & (np.abs(y) <= cap * (1 + impl.tolerance.rtol)) & (y * seen >= 0), y, "softcap(x, cap)",
                 f"finite, of x's sign, within ±{cap}", call)


@invariant(
    requires=("softcap",),
    hint="softcap is not x to first order for |x| ≪ cap: cap·tanh(x) without the division (or tanh(x / cap) without the ·cap)",
)
def softcap_small_logits_unchanged(impl, case):
    """For |x| ≤ cap/64, softcap(x, cap) = x to within (x/cap)²/3 relative (cap·tanh(x/cap) = x - x³/(3cap²) + ...)."""
    drawn = case.draw(capped_logits(magnitudes=(1.0,)), "logits")
    cap = drawn["cap"]
    x = drawn["x"] * cap / 64  # |x| <= cap / 64
    call = f"softcap(x{list(x.shape)} within ±cap/64, cap={cap})"
    tol = impl.tolerance.scaled(ROUNDINGS["softcap"])
    tol = Tolerance(tol.rtol + 1 / (3 * 64**2), tol.atol, tol.dtype)  # the cubic term's share at |x| = cap/64
    assert_close(_softcapped(impl, x, cap, call), impl.as_seen(x), "softcap(x, cap)", tol, call)


@invariant(
    requires=("softcap",),
    hint="softcap is not cap·tanh(x / cap)",
)
def softcap_agrees_with_reference(impl, case):
    """softcap agrees with the float64 reference cap·tanh(x / cap)."""
    drawn = case.draw(capped_logits(), "logits")
    x, cap = drawn["x"], drawn["cap"]
    call = f"softcap(x{list(x.shape)}, cap={cap})"
    tol = reference_tolerance(impl, factor=ROUNDINGS["softcap"]).at_scale(cap)
    assert_close(_softcapped(impl, x, cap, call), ref.softcap(impl.as_seen(x), cap), "softcap(x, cap)", tol, call)


@invariant(
    requires=("softcapped_attention",),
    hint=(
        "a key the mask hides gets weight: the mask is applied before the cap, which turns -inf into -cap (onnx/onnx#7865, "
        "emmtrix/emx-onnx-cgen#731, sgl-project/sgl-kernel-xpu#491)"
    ),
    applies=_NO_WEIGHTS,
)
def softcapped_attention_masked_keys_get_zero(impl, case):
    """With caps of 1 or 2, every key a query may not see (causal, window, key mask) gets weight exactly 0."""
    inputs = draw_capped_inputs(impl, case, caps=SMALL_CAPS)
    call = describe_call("softcapped_attention", inputs)
    _, weights = CAPPED.called(impl, inputs, call)
    hidden = np.broadcast_to(~_visible(inputs) & _visible(inputs).any(axis=-1, keepdims=True), weights.shape)
    assert_where(~hidden | (weights == 0), weights, "softcapped_attention weights of the keys a query may not see", "exactly 0", call)


@invariant(
    requires=("softcapped_attention",),
    hint=(
        "the scores are not capped: two weights of a row differ by more than e^(2·cap), as where the cap is dropped "
        "(sgl-project/sgl-kernel-xpu#491; transformers' Gemma 2 under SDPA before transformers#31887)"
    ),
    applies=_NO_WEIGHTS,
)
def softcapped_attention_weights_bounded(impl, case):
    """With scores up to 16·16 and caps of 1 or 2, any two keys a query sees have weights within a factor e^(2·cap): each
    capped score lies in (-cap, cap)."""
    inputs = draw_capped_inputs(impl, case, caps=SMALL_CAPS, shape=dict(min_seq=2))
    inputs["q"] = inputs["q"] * 16
    call = describe_call("softcapped_attention", inputs, "with q × 16 (scores far beyond the cap)")
    _, weights = CAPPED.called(impl, inputs, call)
    seen = np.broadcast_to(_visible(inputs), weights.shape)
    highest = np.where(seen, weights, -np.inf).max(axis=-1)
    lowest = np.where(seen, weights, np.inf).min(axis=-1)
    rows = seen.any(axis=-1)
    bound = np.exp(2 * inputs["cap"]) * (1 + reference_tolerance(impl, factor=ROUNDINGS["softcapped_attention"]).rtol)
    ratio = np.where(rows, highest / np.where(rows & (lowest > 0), lowest, 1.0) * np.where(rows & (lowest <= 0), np.inf, 1.0), 1.0)
    assert_where(ratio <= bound, ratio, "ratio of the largest to the smallest weight of a query's visible keys",
                 f"at most e^(2·cap) = {np.exp(2 * inputs['cap']):.4g}", call)


@invariant(
    requires=("softcapped_attention",),
    hint="the cap is not cap·tanh(s / cap) on the scores after the 1/√D scaling (capped before it, or applied after the softmax)",
)
def softcapped_attention_agrees_with_reference(impl, case):
    """softcapped_attention agrees with the float64 reference (1e-10 in float64, the dtype tolerance otherwise)."""
    inputs = draw_capped_inputs(impl, case)
    expected = ref.softcapped_attention(*CAPPED.arguments_of(impl.as_seen(inputs)), fully_masked=_fully_masked(impl))
    rows = _visible(inputs).any(axis=-1, keepdims=True) | (fully_masked_convention(impl) != "any")
    call = describe_call("softcapped_attention", inputs)
    CAPPED.assert_parts(CAPPED.called(impl, inputs, call), expected, "", call, _tolerances(impl, inputs, "softcapped_attention"),
                        select=lambda part, value: np.where(rows, value, 0.0))


# ---------------------------------------------------------------------------
# Attention sinks: sink_attention
# ---------------------------------------------------------------------------


def _sink_shares(impl, inputs):
    """(B, H, T) the share of each row's softmax the keys take, 1 / (1 + e^(sink - logsumexp(visible scores))), in float64."""
    seen = impl.as_seen(inputs)
    scores, visible, _ = ref.scores_and_visible(seen["q"], seen["k"], seen["v"], inputs["causal"], inputs["key_mask"], inputs["window"])
    masked = np.where(visible, scores, -np.inf)
    sinks = seen["sinks"][:, None]  # (H, 1)
    top = np.maximum(masked.max(axis=-1), sinks)  # (B, H, T): the sink in the max
    keys = np.exp(masked - top[..., None]).sum(axis=-1)
    return keys / (keys + np.exp(sinks - top))


@invariant(
    requires=("sink_attention",),
    hint=(
        "a row's weights sum to 1 (the sink left out of the softmax: vllm#52156, vllm-project/vllm-metal#550), or the sink's share "
        "is wrong: its e^sink added to a denominator already divided by the max, or a row that sees no key not all 0"
    ),
    applies=_NO_WEIGHTS,
)
def sink_attention_weights_sum_below_one(impl, case):
    """Each row's weights sum to 1 / (1 + e^(sink - logsumexp of the scores it sees)), less than 1, and 0 where it sees no key."""
    inputs = draw_sink_inputs(impl, case)
    call = describe_call("sink_attention", inputs)
    _, weights = SINKS.called(impl, inputs, call)
    assert_close(weights.sum(axis=-1), _sink_shares(impl, inputs), "sum of each row's sink_attention weights",
                 reference_tolerance(impl, factor=ROUNDINGS["sink_attention"]), call)


LARGE_SCORE = 32.0  # q and k all ±32: every score of a row is ±1024·√D, D ≤ 4, past exp's range and 2048 from every sink


@invariant(
    requires=("sink_attention",),
    hint=(
        "scores or sinks in the thousands overflow: the exponentials are taken without subtracting a max, or against a max "
        "that leaves the sink out, so e^(sink - max) is inf (NVIDIA/TensorRT-LLM#19220, fla-org/flash-linear-attention#831)"
    ),
)
def sink_attention_large_logits(impl, case):
    """With every score of a row ±1024·√D (q and k all ±32) and sinks of ±4096 or ±8192, out and weights are finite: 0 under a
    sink far above the scores, the plain average over the keys a row sees under one far below."""
    inputs = draw_sink_inputs(impl, case, large=True, shape=dict(max_d_head=4))
    inputs["q"] = np.where(inputs["q"] < 0, -LARGE_SCORE, LARGE_SCORE)
    inputs["k"] = np.full_like(inputs["k"], LARGE_SCORE)
    call = describe_call("sink_attention", inputs, "with q and k all ±32 (scores ±1024·√D) and sinks of ±4096 or ±8192")
    out, weights = SINKS.called(impl, inputs, call)
    seen = np.broadcast_to(_visible(inputs), inputs["q"].shape[:3] + (inputs["k"].shape[2],)).astype(np.float64)  # (B, H, T, S)
    below = (inputs["sinks"] < 0)[:, None, None]  # (H, 1, 1)
    expected_weights = np.where(below, seen / np.maximum(seen.sum(axis=-1, keepdims=True), 1.0), 0.0)
    group = inputs["q"].shape[1] // inputs["k"].shape[1]
    expected_out = expected_weights @ np.repeat(impl.as_seen(inputs["v"]), group, axis=1)
    tol = reference_tolerance(impl, factor=ROUNDINGS["sink_attention"])
    SINKS.assert_parts((out, weights), (expected_out, expected_weights), "with scores and sinks in the thousands", call,
                       {"weights": tol, "out": tol.at_scale(value_scale(impl, inputs))})


@invariant(
    requires=("sink_attention",),
    hint=("sink_attention is not a softmax over the visible scores and the head's sink, the sink's column then dropped (sinks[h] "
          "read by kv head, or the sink's value weighted into the output)"),
)
def sink_attention_agrees_with_reference(impl, case):
    """sink_attention agrees with the float64 reference (1e-10 in float64, the dtype tolerance otherwise)."""
    inputs = draw_sink_inputs(impl, case)
    _agrees(impl, SINKS, inputs, ref.sink_attention(*SINKS.arguments_of(impl.as_seen(inputs))))
