"""Invariants of grouped-query attention: repeated kv heads, head groups (MHA and MQA), queries shorter than keys, the reference.

gqa_attention(q (B, H, T, D), k and v (B, H_kv, S, D), causal, key_mask (B, S) or None, window or
None) returns out (B, H, T, D) and weights (B, H, T, S) (out alone with ATTENTION_WEIGHTS = False).
Query head h uses kv head h // (H / H_kv): the kv heads repeated in repeat-interleave order
[kv0, kv0, kv1, kv1], as Llama's repeat_kv and torch's SDPA with enable_gqa do; ONNX's Attention
op tiled them [kv0, kv1, kv0, kv1] (onnx/onnx#7274). With T < S (a KV cache) the queries are the
last T positions: query i sits at S - T + i and, causal, sees keys 0 .. S - T + i (bottom-right
alignment). torch's SDPA is_causal aligns top-left instead when T != S, so a decode query sees
key 0 only (pytorch/pytorch#115111); an implementation that follows it declares
CAUSAL_ALIGNMENT = "top_left" and is drawn with T = S only. The masks themselves (window,
padding) have their invariants in invariants/laws/masking.py, which uses the helpers here.
"""

from __future__ import annotations

from functools import cache

import numpy as np

import invariants.reference.numpy as ref
from invariants.asserts import assert_close
from invariants.conventions import NO_DECODER_MODE, causal_modes, declared, declared_skip, first_reason
from invariants.inputs import valid_inputs
from invariants.laws.reference_check import reference_tolerance
from invariants.protocol import FUNCTIONS, ROUNDINGS, describe_call
from invariants.registry import invariant
from invariants.strategies.core import integers
from invariants.strategies.decoder import gqa_inputs, gqa_shapes

LESSON = 100  # where a lesson meets this component: the registry's order (test ids, the kill matrix's first failure)
HOLDS = ("gqa_attention",)  # the protocol functions whose laws it holds

GQA = FUNCTIONS["gqa_attention"]  # called(impl, inputs, call, **changes): out (B, H, T, D) and weights (B, H, T, S) (None: ATTENTION_WEIGHTS = False)


@cache
def _strategy(shape_options, options):
    return gqa_inputs(shapes=gqa_shapes(**dict(shape_options)), **dict(options))


def draw_gqa_inputs(impl, case, *, shape=None, **options):
    """Draw gqa_inputs(**options) of gqa_shapes(**shape), following impl's declarations: causal=True only under CAUSAL_ONLY
    (False only under ENCODER_ONLY), no window under SLIDING_WINDOW = False, no key mask under KEY_MASK = False, and as many
    queries as keys (no cache) under CAUSAL_ALIGNMENT = "top_left"."""
    shape = dict(shape or {})
    if declared(impl, "CAUSAL_ALIGNMENT") == "top_left":
        shape.update(min_cached=0, max_cached=0)
    if options.get("causal") is None and len(causal_modes(impl)) == 1:
        options["causal"] = causal_modes(impl)[0]
    if not declared(impl, "SLIDING_WINDOW"):
        options["windowed"] = False
    if not declared(impl, "KEY_MASK"):
        options["masked"] = False
    return case.draw(_strategy(tuple(sorted(shape.items())), tuple(sorted(options.items()))), "inputs")


@valid_inputs("gqa_attention")
def gqa_attention_arguments(impl, case):
    """Queries and fewer (or as many) key-value heads dividing their count, with the causal flag, window and key mask as declared."""
    return GQA.arguments_of(draw_gqa_inputs(impl, case))


def visible(inputs, **changes):
    """(B, 1, T, S) True where a query may see a key: the causal and window masks (bottom-right aligned) and the key mask."""
    args = {**inputs, **changes}
    B, T, S = args["q"].shape[0], args["q"].shape[2], args["k"].shape[2]
    seen = np.broadcast_to(ref.visible_keys(T, S, args["causal"], args["window"])[None, None], (B, 1, T, S))
    if args["key_mask"] is not None:
        seen = seen & np.asarray(args["key_mask"], dtype=bool)[:, None, None, :]
    return seen


def sees_a_key(inputs, **changes):
    """(B, 1, T) True for the queries that see at least one key (the others are fully masked rows)."""
    return visible(inputs, **changes).any(axis=-1)


def fully_masked_convention(impl):
    """What impl's fully masked rows hold: its declared FULLY_MASKED_ROWS ('zeros', 'uniform' or 'any')."""
    return declared(impl, "FULLY_MASKED_ROWS")


def reference_gqa(impl, inputs, **changes):
    """The float64 reference's (out, weights) on the values impl receives, with impl's fully-masked-row convention ('any': zeros)."""
    convention = fully_masked_convention(impl)
    args = impl.as_seen({**inputs, **changes})
    return ref.gqa_attention(*GQA.arguments_of(args), fully_masked="uniform" if convention == "uniform" else "zeros")


def value_scale(impl, inputs):
    """The size of the terms of an output element Σ_j w_j·v_j: max|v| (the weights sum to at most 1)."""
    return float(np.abs(impl.as_seen(inputs["v"])).max(initial=0.0))


def compared_rows(impl, inputs):
    """(B, H, T) True for the query rows whose values the convention fixes: all rows, or those that see a key under FULLY_MASKED_ROWS = 'any'."""
    B, H, T = inputs["q"].shape[:3]
    rows = sees_a_key(inputs) if fully_masked_convention(impl) == "any" else np.ones((B, 1, T), dtype=bool)
    return np.broadcast_to(rows, (B, H, T))


_TOP_LEFT = declared_skip("CAUSAL_ALIGNMENT", lambda alignment: alignment == "top_left",
                          "its causal mask aligns top-left when there are fewer queries than keys, which this invariant is about")


@invariant(
    requires=("gqa_attention",),
    hint="the kv heads are matched to the query heads in the wrong order: tiled [kv0, kv1, kv0, kv1] (np.tile, torch's .repeat, "
    "ONNX's Attention before onnx/onnx#7274) instead of repeat-interleaved [kv0, kv0, kv1, kv1], so query head h reads kv head "
    "h % H_kv instead of h // (H / H_kv)",
)
def repeated_kv_heads(impl, case):
    """gqa_attention equals multi-head attention on k and v with each kv head repeated for its group in repeat-interleave order
    ([kv0, kv0, kv1, kv1]), to rounding."""
    inputs = draw_gqa_inputs(impl, case, shape=dict(min_kv_heads=2, min_group=2))
    group = inputs["q"].shape[1] // inputs["k"].shape[1]
    call = describe_call("gqa_attention", inputs, f"vs the same with k and v repeat-interleaved {group}× (H_kv = H)")
    repeated = {name: np.repeat(inputs[name], group, axis=1) for name in ("k", "v")}  # (B, H, S, D)
    tol = impl.tolerance.scaled(2)  # two calls of the same maths, perhaps through two kernels
    GQA.assert_parts(GQA.called(impl, inputs, call), GQA.called(impl, inputs, call, **repeated), "with the kv heads shared", call,
                     {"weights": tol, "out": tol.at_scale(value_scale(impl, inputs))})


@invariant(
    requires=("gqa_attention",),
    hint="a query head reads another kv head than h // (H / H_kv) for its keys or its values (the two repeated in different "
    "orders, or the groups formed along the wrong axis of a reshape), or heads mix (a softmax or a sum across the head axis)",
)
def head_groups(impl, case):
    """Query head h attends with kv head h // (H / H_kv) alone: its output and weights equal gqa_attention on q[:, h] and that kv head
    (H_kv = H: each head its own multi-head attention; H_kv = 1: multi-query attention), to rounding."""
    inputs = draw_gqa_inputs(impl, case)
    q, k, v = inputs["q"], inputs["k"], inputs["v"]
    H, H_kv = q.shape[1], k.shape[1]
    call = describe_call("gqa_attention", inputs, "vs one call per query head on its kv head")
    out, weights = GQA.called(impl, inputs, call)
    tol = impl.tolerance.scaled(2)
    for h in range(H):
        g = h // (H // H_kv)
        head_out, head_weights = GQA.called(impl, inputs, f"{call} (head {h}, kv head {g})", q=q[:, h : h + 1], k=k[:, g : g + 1], v=v[:, g : g + 1])
        if weights is not None:
            assert_close(weights[:, h], head_weights[:, 0], f"weights of query head {h} (kv head {g})", tol, call)
        assert_close(out[:, h], head_out[:, 0], f"output of query head {h} (kv head {g})", tol.at_scale(value_scale(impl, inputs)), call)


@invariant(
    requires=("gqa_attention",),
    hint="the causal mask of T queries over S > T keys is aligned top-left (query i sees keys 0..i, as SDPA's is_causal does "
    "when L != S: pytorch/pytorch#115111), or built for T keys and sliced: a KV-cache step must align it bottom-right, query i "
    "at position S - T + i; declare CAUSAL_ALIGNMENT = 'top_left' if that is the intended behaviour",
    applies=first_reason(NO_DECODER_MODE, _TOP_LEFT),
)
def queries_shorter_than_keys(impl, case):
    """The last t of T queries over the same S = T keys give the last t rows of the full call: gqa_attention(q[:, :, -t:], k, v) =
    gqa_attention(q, k, v)[:, :, -t:], outputs and weights, to rounding (queries are aligned with the last keys, as in a KV cache)."""
    inputs = draw_gqa_inputs(impl, case, shape=dict(min_seq=2, max_cached=0), causal=True)
    T = inputs["q"].shape[2]
    t = case.draw(integers(1, T - 1), "t (queries kept)")
    call = describe_call("gqa_attention", inputs, f"vs the same with only the last {t} queries, q[:, :, {T - t}:]")
    tol = impl.tolerance.scaled(2)
    rows = compared_rows(impl, inputs)[:, :, T - t :, None]  # (B, H, t, 1)
    GQA.assert_parts(GQA.called(impl, inputs, call, q=inputs["q"][:, :, T - t :]), GQA.called(impl, inputs, call),
                     f"of the last {t} queries alone", call, {"weights": tol, "out": tol.at_scale(value_scale(impl, inputs))},
                     select=lambda part, value: np.where(rows, value[:, :, -t:], 0.0))  # the last t queries of either call


@invariant(
    requires=("gqa_attention",),
    hint="the scores are not scaled by 1/√D of the head (1/√(H·D), 1/D, unscaled), the causal mask is not aligned bottom-right, "
    "a mask is applied where none is asked (causal=False), or fully masked rows do not follow FULLY_MASKED_ROWS",
)
def agrees_with_reference(impl, case):
    """gqa_attention's output and weights agree with the float64 reference (1e-10 in float64, the dtype tolerance otherwise),
    masks and cache included."""
    inputs = draw_gqa_inputs(impl, case)
    call = describe_call("gqa_attention", inputs)
    rows = compared_rows(impl, inputs)[..., None]  # (B, H, T, 1)
    tol = reference_tolerance(impl, factor=ROUNDINGS["gqa_attention"])
    GQA.assert_parts(GQA.called(impl, inputs, call), reference_gqa(impl, inputs), "", call,
                     {"weights": tol, "out": tol.at_scale(value_scale(impl, inputs))}, select=lambda part, value: np.where(rows, value, 0.0))
