"""Invariants of gqa_attention's masks: the sliding window, the key-padding mask, fully masked rows, masks in 16 bits.

The window (Mistral's rule): query i at position p sees keys j with p - w < j <= p, exactly
min(p + 1, w) of them. Implementations disagree by one (flash-attention's window_size=(w, w)
under a causal mask sees w + 1 keys: huggingface/transformers#39408; NVIDIA-NeMo/Megatron-Bridge#2656
subtracts 1 for it), so the count is checked exactly, and keys outside the window are perturbed
and must change nothing, bitwise. The key mask (B, S) is True for the keys a query may see;
a query whose every visible key is padded has no valid softmax: it gets zeros (the reference,
torch's SDPA, flash-attention) or what FULLY_MASKED_ROWS declares, never NaN
(pytorch/pytorch#103749). Masks are composed as booleans: additive masks of finfo.min summed
overflow to -inf (huggingface/transformers#27114, NVIDIA-NeMo/Automodel#2658), and a -1e9
sentinel is -inf in float16 (google/flax#982), which turns fully masked rows into NaN.
"""

from __future__ import annotations

import numpy as np

from invariants.asserts import assert_close, assert_equal, assert_finite, assert_where
from invariants.conventions import NO_DECODER_MODE, declared_skip, first_reason
from invariants.laws.gqa import GQA, draw_gqa_inputs, fully_masked_convention, sees_a_key, value_scale, visible
from invariants.protocol import describe_call
from invariants.registry import invariant
from invariants.strategies.core import float_arrays, integers

LESSON = 110  # where a lesson meets this component: the registry's order (test ids, the kill matrix's first failure)
HOLDS = ("gqa_attention",)  # the protocol functions whose laws it holds

_NO_WEIGHTS = declared_skip("ATTENTION_WEIGHTS", lambda returns: not returns, "its gqa_attention returns no weights to count")
_NO_WINDOW = first_reason(  # a sliding window is defined on causal attention only
    NO_DECODER_MODE, declared_skip("SLIDING_WINDOW", lambda supported: not supported, "it has no sliding window, which this invariant is about"))
_WINDOW_AND_WEIGHTS = first_reason(_NO_WINDOW, _NO_WEIGHTS)
_NO_KEY_MASK = declared_skip("KEY_MASK", lambda supported: not supported, "it takes no key-padding mask, which this invariant is about")
PERTURBATION_SCALES = dict(min_scale=0.25, max_scale=4.0)  # new keys and values: other finite values of any moderate size


@invariant(
    requires=("gqa_attention",),
    hint="the window is one key too wide or too narrow: j >= p - w (w + 1 keys, as flash-attention's window_size=(w, w) under "
    "a causal mask: huggingface/transformers#39408) or j > p - w + 1 (w - 1 keys); or the window is measured from the first key, "
    "not from the query's own position",
    applies=_WINDOW_AND_WEIGHTS,
)
def window_key_count(impl, case):
    """With a sliding window w, the query at position p has exactly min(p + 1, w) non-zero weights, on the keys p - w < j <= p."""
    inputs = draw_gqa_inputs(impl, case, causal=True, windowed=True, masked=False)
    call = describe_call("gqa_attention", inputs)
    _, weights = GQA.called(impl, inputs, call)
    expected = np.broadcast_to(visible(inputs), weights.shape)  # (B, H, T, S)
    wrong = ((weights != 0) != expected).any(axis=-1)  # (B, H, T)
    first = tuple(np.argwhere(wrong)[0]) if wrong.any() else None
    S = weights.shape[-1]
    position = None if first is None else S - weights.shape[-2] + int(first[-1])  # the query's own position among the keys
    seen = {} if first is None else {"keys_seen": int((weights[first] != 0).sum()), "keys_expected": int(expected[first].sum()),
                                     "keys_after": int((weights[first][position + 1:] != 0).sum()),  # keys after its own position it saw
                                     "window_keys_hidden": int((expected[first] & (weights[first] == 0)).sum()),  # keys it should see, at 0
                                     "window": int(inputs["window"]), "query": position}
    assert_where((weights != 0) == expected, weights, "attention weights", f"non-zero exactly on the {inputs['window']} most recent keys "
                 "up to the query's own position (min(p + 1, w) of them)", call, **seen)


@invariant(
    requires=("gqa_attention",),
    hint="keys outside the window still reach the output: the softmax is stabilised by the maximum over all keys before the "
    "window is applied (the outside keys then change its rounding, or underflow it to 0/0), the window is applied after the "
    "softmax, or only to the weights and not to the values",
    applies=_NO_WINDOW,
)
def window_outside_keys_ignored(impl, case):
    """Replacing the keys and values further back than every window of a set of queries leaves their outputs and weights exactly unchanged."""
    inputs = draw_gqa_inputs(impl, case, shape=dict(min_seq=2), causal=True, windowed=False, masked=False)
    B, H_kv, S, D = inputs["k"].shape
    T = inputs["q"].shape[2]
    window = case.draw(integers(1, S - 1), "window w")
    j0 = case.draw(integers(1, S - window), "j0 (keys 0 .. j0 - 1 replaced)")
    inputs = {**inputs, "window": window}
    new_k = inputs["k"].copy()
    new_v = inputs["v"].copy()
    new_k[:, :, :j0] = case.draw(float_arrays((B, H_kv, j0, D), **PERTURBATION_SCALES), "new keys 0 .. j0 - 1")
    new_v[:, :, :j0] = case.draw(float_arrays((B, H_kv, j0, D), **PERTURBATION_SCALES), "new values 0 .. j0 - 1")
    kept = np.arange(S - T, S) >= j0 + window - 1  # (T,): queries whose window starts at or after j0
    call = describe_call("gqa_attention", inputs, f"with keys and values 0..{j0 - 1} replaced")
    first = int(np.argmax(kept))
    GQA.assert_parts(GQA.called(impl, inputs, call, k=new_k, v=new_v), GQA.called(impl, inputs, call),
                     f"of queries {first}..{T - 1}, whose windows exclude keys < {j0}", call, select=lambda part, value: value[:, :, kept])


@invariant(
    requires=("gqa_attention",),
    hint="a window that covers every key is not plain causal attention: the causal mask is dropped when the window is large "
    "(a shortcut 'the window covers everything, no mask needed'), or the window wraps around (a modulo on positions)",
    applies=_NO_WINDOW,
)
def window_covering_all_keys_is_causal(impl, case):
    """A window w >= S (every key within reach) gives the same outputs and weights as causal attention without a window, to rounding."""
    inputs = draw_gqa_inputs(impl, case, causal=True, windowed=False)
    S = inputs["k"].shape[2]
    window = case.draw(integers(S, S + 3), "window w >= S")
    call = describe_call("gqa_attention", {**inputs, "window": window}, "vs window=None")
    tol = impl.tolerance.scaled(2)  # a kernel for window=None may round differently
    GQA.assert_parts(GQA.called(impl, {**inputs, "window": window}, call), GQA.called(impl, inputs, call), f"with window {window}", call,
                     {"weights": tol, "out": tol.at_scale(value_scale(impl, inputs))})


@invariant(
    requires=("gqa_attention",),
    hint="the key mask is applied to the wrong axis (to the queries, as a row mask) or inverted (True taken as 'padded'), "
    "or hidden keys still reach the output: the mask is applied after the softmax (they stay in the denominator) or only to "
    "the keys and not to the values",
    applies=_NO_KEY_MASK,
)
def padding_hidden_keys_ignored(impl, case):
    """Replacing the keys and values the key mask hides leaves every output and weight of the queries that see a key exactly
    unchanged, and their weights on hidden keys exactly 0."""
    inputs = draw_gqa_inputs(impl, case, masked=True)
    B, H_kv, S, D = inputs["k"].shape
    hidden = ~np.asarray(inputs["key_mask"], dtype=bool)  # (B, S)
    where = np.broadcast_to(hidden[:, None, :, None], (B, H_kv, S, D))
    new_k = np.where(where, case.draw(float_arrays((B, H_kv, S, D), **PERTURBATION_SCALES), "new keys (used where hidden)"), inputs["k"])
    new_v = np.where(where, case.draw(float_arrays((B, H_kv, S, D), **PERTURBATION_SCALES), "new values (used where hidden)"), inputs["v"])
    call = describe_call("gqa_attention", inputs, "with the hidden keys and values replaced")
    out, weights = GQA.called(impl, inputs, call)
    new_out, new_weights = GQA.called(impl, inputs, call, k=new_k, v=new_v)
    rows = np.broadcast_to(sees_a_key(inputs), out.shape[:3])  # (B, H, T)
    assert_equal(new_out[rows], out[rows], "output of the queries that see a key", call)
    if weights is not None:
        assert_equal(new_weights[rows], weights[rows], "weights of the queries that see a key", call)
        on_hidden = np.broadcast_to(hidden[:, None, None, :], weights.shape) & rows[..., None]
        assert_where(~on_hidden | (weights == 0), weights, "weights on hidden keys", "exactly 0", call)


def _check_fully_masked_rows(impl, inputs, out, weights, call):
    """Fully masked rows of out and weights follow impl's FULLY_MASKED_ROWS: exactly 0, 1/S on every key (to rounding), or any finite value."""
    __tracebackhide__ = True
    convention = fully_masked_convention(impl)
    empty = np.broadcast_to(~sees_a_key(inputs), out.shape[:3])  # (B, H, T): queries that see no key
    if convention == "zeros":
        assert_equal(out[empty], 0.0, "output of the queries that see no key (FULLY_MASKED_ROWS = 'zeros')", call)
        if weights is not None:
            assert_equal(weights[empty], 0.0, "weights of the queries that see no key (FULLY_MASKED_ROWS = 'zeros')", call)
    elif convention == "uniform":
        S = inputs["k"].shape[2]
        v = np.repeat(impl.as_seen(inputs["v"]), out.shape[1] // inputs["v"].shape[1], axis=1)  # (B, H, S, D)
        mean = np.broadcast_to(v.mean(axis=2, keepdims=True), out.shape)  # (B, H, T, D): the average of every value
        tol = impl.tolerance.scaled(2)
        if weights is not None:
            assert_close(weights[empty], 1.0 / S, "weights of the queries that see no key (FULLY_MASKED_ROWS = 'uniform': 1/S)", tol, call)
        assert_close(out[empty], mean[empty], "output of the queries that see no key (the mean of all values)",
                     tol.at_scale(value_scale(impl, inputs)), call)


@invariant(
    requires=("gqa_attention",),
    hint="a query whose keys are all hidden computes a softmax over nothing: exp(-inf)/Σexp(-inf) = 0/0 = NaN (guard the rows "
    "with no visible key, as SDPA does since pytorch/pytorch#103749), or a finite sentinel (-1e9, finfo.min) gives it uniform "
    "weights while FULLY_MASKED_ROWS says 'zeros' (declare 'uniform' if that is intended), or two additive finfo.min masks "
    "summed to -inf",
    applies=_NO_KEY_MASK,
)
def fully_masked_rows(impl, case):
    """A query that sees no key (its visible keys all padded) gets finite values: zero output and weights by default, or the
    declared FULLY_MASKED_ROWS ('uniform': 1/S on every key; 'any': finite)."""
    inputs = draw_gqa_inputs(impl, case, masked=True, patterns=("one item fully padded", "left padding"))
    call = describe_call("gqa_attention", inputs)
    out, weights = GQA.called(impl, inputs, call)
    assert_finite(out, "gqa_attention output", call)
    if weights is not None:
        assert_finite(weights, "gqa_attention weights", call)
    _check_fully_masked_rows(impl, inputs, out, weights, call)


@invariant(
    requires=("gqa_attention",),
    hint="masks are composed as additive finfo.min planes: two of them add to -inf (huggingface/transformers#27114, "
    "NVIDIA-NeMo/Automodel#2658), and a score plus finfo.min overflows in float16; or the mask value is a -1e9 sentinel, "
    "which is -inf in float16 (google/flax#982); either way a fully masked row becomes NaN. Compose the masks as booleans "
    "(or clamp at finfo.min)",
    applies=NO_DECODER_MODE,
)
def masks_compose_in_low_precision(impl, case):
    """With causal, window and padding masks composed and scores of size up to ~100, every output and weight is finite, hidden keys
    get exactly 0 and each row that sees a key sums to 1, in every dtype (float16 and bfloat16 included)."""
    inputs = draw_gqa_inputs(impl, case, causal=True, masked=True, min_scale=3.0, max_scale=6.0)
    call = describe_call("gqa_attention", inputs, "(scores of size up to ~100)")
    out, weights = GQA.called(impl, inputs, call)
    assert_finite(out, "gqa_attention output", call)
    _check_fully_masked_rows(impl, inputs, out, weights, call)
    if weights is None:
        return
    assert_finite(weights, "gqa_attention weights", call)
    rows = np.broadcast_to(sees_a_key(inputs), weights.shape[:3])  # (B, H, T)
    hidden = ~np.broadcast_to(visible(inputs), weights.shape) & rows[..., None]
    assert_where(~hidden | (weights == 0), weights, "weights on hidden keys (causal, window or padding)", "exactly 0", call)
    # each weight carries one rounding of its dtype; the row's sum of at most S of them is within the table's tolerance at 1
    assert_close(weights.astype(np.float64).sum(axis=-1)[rows], 1.0, "row sums of the weights of queries that see a key", impl.tolerance, call)

