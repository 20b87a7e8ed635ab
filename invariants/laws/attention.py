"""Invariants of multi-head self-attention: causality (perturbed and differentiated), the weights, the heads, linearity, batches.

attention(x (B, T, d), W_q, W_k, W_v, W_o (d, d), n_heads, causal) returns out (B, T, d) and
weights (B, H, T, T). Causality is checked by perturbing the future, not by truncating the
sequence: perturbing is bitwise exact in correct code, truncating is not (another shape may take
another kernel, measured at ~1e-7 on GPT-2 and torch's SDPA), and future values stay finite
(an inf or a NaN reaches the past as 0·inf = NaN even in correct code).

Where shipped attention bugs live is reached on purpose (strategies/attention.py): the causal
checks draw, half the time, a sequence of 65 or 129 tokens at a small width and run at
every length on either side of 16, 32, 64 and 128 up to it (the tiles and block sizes of real
kernels and mask buffers; swept_lengths); the exact laws also draw scores of up to about 1e4, where a mask of -1e4 instead of -inf
leaks and a softmax without its max subtracted overflows; and inputs with zero tokens, one token
repeated and all-equal scores are drawn on purpose.

Declarations (invariants/conventions.py): with ATTENTION_WEIGHTS = False attention answers its
output alone (SDPA-style, no weights); the weight invariants are then skipped and every other one
checks the output only (tolerances that scale with the weights use the reference's weights). With
CAUSAL_ONLY = True the invariants about causal=False are skipped and the others draw causal=True; with
ENCODER_ONLY = True the invariants about causal=True are skipped and the others draw causal=False.
"""

from __future__ import annotations

from functools import lru_cache

import numpy as np
from hypothesis import strategies as st

from invariants.asserts import assert_close, assert_equal, assert_finite, assert_where
from invariants.conventions import NO_DECODER_MODE, NO_ENCODER_MODE, causal_modes, declared_skip, first_reason, returns_weights
from invariants.inputs import valid_inputs
from invariants.laws.reference_check import reference_answer, reference_tolerance
from invariants.protocol import FUNCTIONS, ROUNDINGS, ImplementationError, describe_call
from invariants.registry import invariant
from invariants.strategies.attention import MAX_SCORE_SCALE, MAX_SCORE_SUM, attention_inputs, largest_score_sum, truncated
from invariants.strategies.core import LONG_LENGTHS, SWEPT_LENGTHS, TILE_LENGTHS, float_arrays, integers, permutations, sampled_from, swept_lengths
from invariants.strategies.core import weights as weight_matrices

LESSON = 40  # where a lesson meets this component: the registry's order (test ids, the kill matrix's first failure)
HOLDS = ("attention",)  # the protocol functions whose laws it holds

# Each strategy built once per set of arguments: building one costs more than drawing from it.
_inputs = lru_cache(maxsize=None)(attention_inputs)

PERTURBATION_SCALES = dict(min_scale=0.25, max_scale=4.0)  # new tokens: other values, finite and of any moderate size
SWEEP = dict(long_lengths=SWEPT_LENGTHS)  # causal checks: long sequences half the time, run either side of every tile up to them
LONG = dict(long_lengths=LONG_LENGTHS)  # the other checks: long sequences half the time, one length each
# Scores up to about 1e4 (a scale of 16384), for the laws that stay exact there. Every partial sum of a score stays
# below MAX_SCORE_SUM (2**15) in float16, where more would overflow, and below 2**17 in wider dtypes (gaps of 1e4 and more).
WIDE_SCORE_SUM = 2.0**17


ATTENTION = FUNCTIONS["attention"]  # called(impl, inputs, call, **changes): out (B, T, d) and weights (B, H, T, T) (None: ATTENTION_WEIGHTS = False)
_NO_WEIGHTS = declared_skip("ATTENTION_WEIGHTS", lambda returns: not returns, "its attention returns no weights to check")


def _score_bound(impl):
    """The largest partial sum of a score the inputs may reach for impl: MAX_SCORE_SUM (2**15) in float16, else WIDE_SCORE_SUM."""
    return MAX_SCORE_SUM if impl.dtype == "float16" else WIDE_SCORE_SUM


def _draw_inputs(impl, case, *, large_scores=False, **options):
    """Draw attention_inputs(**options); causal is drawn, or impl's one mode where it declares CAUSAL_ONLY or ENCODER_ONLY.

    large_scores=True draws score scales up to 16384 (scores of about 1e4), within _score_bound(impl).
    """
    if options.get("causal") is None and len(causal_modes(impl)) == 1:
        options["causal"] = causal_modes(impl)[0]
    if large_scores:
        options.update(max_score_scale=MAX_SCORE_SCALE, max_score_sum=_score_bound(impl))
    return case.draw(_inputs(**options), "inputs")


@valid_inputs("attention")
def attention_arguments(impl, case):
    """x (B, T, d) of up to (2, 4, 6), its four (d, d) projections, a head count dividing d, and a causal flag as declared."""
    causal = case.draw(sampled_from(causal_modes(impl)), "causal")
    return ATTENTION.arguments_of(case.draw(attention_inputs(max_batch=2, max_seq=4, max_heads=2, max_d_head=3, causal=causal), "inputs"))


def attention_output(impl, answer):
    """The output of one of impl's attention answers: answer[0] of (out, weights), or answer itself with ATTENTION_WEIGHTS = False."""
    return answer[0] if returns_weights(impl) and isinstance(answer, (tuple, list)) else answer


def _magnitude(impl, inputs, weights, **changes):
    """The largest Σ|terms| behind an element of attention's output: max of |weights| @ (|x| @ |W_v|) @ |W_o|.

    The output is a sum over keys, then over features, of products that may cancel; rounding
    errors in a sum scale with Σ|terms|, not with the sum, so output tolerances are taken at this scale.
    weights=None (an attention that returns none) takes the reference's weights for these inputs.
    """
    args = {**inputs, **changes}
    if weights is None:
        weights = reference_answer(impl, "attention", *ATTENTION.arguments_of(args))[1]  # (B, H, T, T)
    x, W_v, W_o = (np.abs(impl.as_seen(args[name])) for name in ("x", "W_v", "W_o"))
    B, T, d = x.shape
    H = args["n_heads"]
    v = (x @ W_v).reshape(B, T, H, d // H).transpose(0, 2, 1, 3)  # (B, H, T, D)
    heads = np.abs(weights.astype(np.float64)) @ v  # (B, H, T, T) x (B, H, T, D) -> (B, H, T, D)
    return float((heads.transpose(0, 2, 1, 3).reshape(B, T, d) @ W_o).max())  # (B, T, d) x (d, d) -> (B, T, d)


def _future(T):
    """(T, T) True above the diagonal: the keys a causal query must not see."""
    return np.triu(np.ones((T, T), dtype=bool), k=1)


def _zeroed_sides(weights):
    """The counterexample's figures: the share of exactly-zero weights above the diagonal (the future) and below it (the past)."""
    T = weights.shape[-1]
    zero = weights == 0  # (B, H, T, T)
    return {"zero_share_above": float(zero[..., _future(T)].mean()) if T > 1 else 1.0,
            "zero_share_below": float(zero[..., _future(T).T].mean()) if T > 1 else 0.0}


def _new_tokens(impl, case, inputs, label):
    """x with new tokens at positions 1 .. T - 1 (a check changes positions >= j with them): finite, other values, scaled
    down by powers of two (if need be) so that the scores they take part in stay within _score_bound(impl)."""
    x = inputs["x"]
    B, T, d = x.shape
    changed = x.copy()
    changed[:, 1:] = case.draw(float_arrays((B, T - 1, d), **PERTURBATION_SCALES), label)
    while largest_score_sum(changed, inputs["W_q"], inputs["W_k"], inputs["n_heads"]) > _score_bound(impl):
        changed[:, 1:] /= 2  # exact; deterministic, so the draw stays valid
    return changed


def _lengths(inputs):
    """The lengths a causal check runs at for these inputs: swept_lengths of the drawn one (15, 16, 17, ... up to 129 for 129)."""
    return swept_lengths(inputs["x"].shape[1])


@invariant(
    requires=("attention",),
    hint="the future leaks into the past: no mask, a mask after the softmax (the future stays in the denominator), off by "
    "one (triu with k=2), built for another length (a longer mask sliced as if tokens were cached), right only up to some "
    "length (a buffer for a block size of 64, a kernel masking only within its tiles of 16 to 128: see the call's length), "
    "or -1e4 for -inf (GPT-2's masked_bias)",
    applies=NO_DECODER_MODE,
)
def causal_non_leakage(impl, case):
    """Replacing the tokens at positions >= j by other finite values leaves causal attention's outputs and weights at positions < j exactly equal.

    Exact at any score size: a masked weight is exactly 0. Drawn at lengths up to 129 (a long draw
    runs at every length either side of 16, 32, 64 and 128 up to it) and at scores up to about 1e4.
    """
    inputs = _draw_inputs(impl, case, min_seq=2, causal=True, **SWEEP, large_scores=True)
    T_max = inputs["x"].shape[1]
    drawn_j = case.draw(integers(1, T_max - 1), "j (first replaced position; at most T - 1 at each length T)")
    changed = _new_tokens(impl, case, inputs, "new tokens (used at positions >= j)")
    for T in _lengths(inputs):
        j = min(drawn_j, T - 1)
        short = truncated(inputs, T)
        call = describe_call("attention", short, f"with x[:, {j}:] replaced")
        new = ATTENTION.called(impl, short, call, x=np.concatenate([inputs["x"][:, :j], changed[:, j:T]], axis=1))
        ATTENTION.assert_parts(new, ATTENTION.called(impl, short, call), f"of the queries at positions < {j}", call,
                               select=lambda part, value, j=j: value[..., :j, :])  # the query axis: (B, T, d), (B, H, T, T)


@invariant(
    requires=("attention",),
    hint="the future reaches the past through the backward pass: a statistic of the whole score row taken before the mask "
    "(a softmax stabilised by the max over all keys, future included) makes the past depend on the future by rounding, "
    "and by 0/0 = NaN once a future score is large; or a mask right only up to a length (a buffer for a block size, "
    "a kernel masking only within its tiles: see m and the length)",
    backends=("torch",),
    in_process=True,
    applies=NO_DECODER_MODE,
)
def causal_gradient(impl, case):
    """Under causal attention ∂out_i/∂x_j is exactly 0 for every j > i, through the implementation's own autograd.

    Exact in every dtype: a masked weight is exactly 0, and every gradient that reaches a future
    token is a product with it (or with a zero cotangent). Checked boundary by boundary: the gradient
    of Σ_(i<m) c_i·out_i (random directions c_i) is exactly 0 at every position from m on, for every m
    of a short sequence (which pins each ∂out_i/∂x_j to 0) and for the boundaries _boundaries picks in
    a long one. Drawn at lengths up to 129, as causal_non_leakage.
    """
    inputs = _draw_inputs(impl, case, min_seq=2, causal=True, **SWEEP)
    x = inputs["x"]  # (B, T, d)
    B, T, d = x.shape
    cotangents = case.draw(float_arrays((T - 1, B, d)), "cotangents")  # a direction for each out[:, i], i < T - 1
    extra = case.draw(integers(1, T - 1), "a further boundary m (long sequences)")
    for length in _lengths(inputs):
        short = truncated(inputs, length)
        call = describe_call("attention", short, "differentiated with torch.autograd.grad")
        for m, grad in _gradients_across(impl, short, cotangents[: length - 1], _boundaries(length, extra)):
            assert_equal(grad[:, m:], 0.0, f"∂out_i/∂x_j for i < {m} <= j (rows j >= {m} of the gradient of Σ_(i<{m}) c_i·out_i)", call)


def _boundaries(T, extra):
    """The boundaries m at which causal_gradient checks that no output before m depends on an input from m on.

    Every m in 1 .. T - 1 for T <= 9 (so each ∂out_i/∂x_j, j > i, is pinned to 0); for a long sequence
    1, T - 1, one drawn m, and each tile edge below T (16, 17, 32, 33, 64, 65, 128): a leak across any
    of them shows, as does every leak a block-size or tile bug makes, at a few passes per length.
    """
    if T <= 9:
        return range(1, T)
    chosen = {1, T - 1, min(extra, T - 1)} | {t + s for t in TILE_LENGTHS for s in (0, 1)}
    return sorted(m for m in chosen if 1 <= m <= T - 1)


def _gradients_across(impl, inputs, cotangents, boundaries):
    """[(m, grad (B, T, d))]: for each boundary m the gradient of Σ_(i<m) cotangents[i]·out[:, i] with respect to x,
    through impl's own autograd (one backward pass per boundary, on one forward pass)."""
    import torch

    args = list(impl.to_backend(ATTENTION.arguments_of(inputs)))
    args[0] = impl.to_backend(inputs["x"], requires_grad=True)
    found = []
    try:
        out = attention_output(impl, impl.raw("attention")(*args))  # (B, T, d)
        directions = torch.zeros_like(out)  # (B, T, d): cotangent i at position i
        directions[:, : len(cotangents)] = impl.to_backend(np.ascontiguousarray(cotangents.transpose(1, 0, 2)))
        for m in boundaries:
            weight = torch.zeros_like(out)
            weight[:, :m] = directions[:, :m]
            found.append((m, torch.autograd.grad(out, args[0], grad_outputs=weight, retain_graph=True)[0]))
    except Exception as exc:  # no graph (a detach, an in-place op), a failing backward, a bad answer
        raise ImplementationError(f"autograd through attention raised {type(exc).__name__}: {str(exc).strip().partition(chr(10))[0]}") from None
    return [(m, impl.to_numpy(grad, "the gradient")) for m, grad in found]


@invariant(
    requires=("attention",),
    hint="the mask also hides the diagonal (triu with k=0: the first row is 0/0 = NaN), fills the future with a finite "
    "value (-1e4, GPT-2's masked_bias, beaten by scores of 1e4), is right only up to some length (masked only within "
    "tiles of 16 to 128, a buffer for one block size, a longer mask sliced as if cached), is off by one (triu with k=2), "
    "or zeroes weights after the softmax (row 0 does not sum to 1)",
    applies=first_reason(NO_DECODER_MODE, _NO_WEIGHTS),
)
def causal_weights_pattern(impl, case):
    """With causal=True every weight above the diagonal is exactly 0 and the first query's weights are exactly (1, 0, …, 0).

    Exact at any score size (exp(-inf) is 0): drawn at scores up to about 1e4, where a finite mask
    value stops zeroing the future, and at lengths up to 129.
    """
    inputs = _draw_inputs(impl, case, causal=True, **SWEEP, large_scores=True)
    for T in _lengths(inputs):
        short = truncated(inputs, T)
        call = describe_call("attention", short)
        _, weights = ATTENTION.called(impl, short, call)  # (B, H, T, T)
        assert_where(~_future(T) | (weights == 0), weights, "attention weights above the diagonal", "exactly 0", call,
                     **_zeroed_sides(weights))
        assert_equal(weights[:, :, 0], np.eye(1, T)[0], "the first query's weights", call)  # (B, H, T) vs (T,)


@invariant(
    requires=("attention",),
    hint="the softmax runs over the wrong axis (the query axis: columns sum to 1, not rows), the weights are zeroed "
    "after the softmax without renormalising, or the softmax does not subtract the row max (exp of a score above 709, "
    "88 in float32, overflows: inf/inf is NaN)",
    applies=_NO_WEIGHTS,
)
def weights_are_distributions(impl, case):
    """Each query's attention weights are a probability distribution over the keys: every entry >= 0, each row summing to 1.

    At any score size: drawn at scores up to about 1e4 and lengths up to 129.
    """
    inputs = _draw_inputs(impl, case, **LONG, large_scores=True)
    call = describe_call("attention", inputs)
    _, weights = ATTENTION.called(impl, inputs, call)  # (B, H, T, T)
    assert_where(weights >= 0, weights, "attention weights", ">= 0", call)
    # each weight carries one rounding of its dtype; T of them sum to 1, so the table's tolerance at 1 covers them
    assert_close(weights.astype(np.float64).sum(axis=-1), 1.0, "row sums of the attention weights", impl.tolerance, call,
                 columns_sum_to_one=bool(impl.tolerance.allows(weights.astype(np.float64).sum(axis=-2), 1.0).all()))


@invariant(
    requires=("attention",),
    hint="the softmax does not subtract the row max before exp: exp of a score above 709 (88 in float32, 11 in "
    "float16) overflows to inf and inf/inf is NaN; or masks are added as finite minima that overflow (finfo.min "
    "+ finfo.min = -inf, then -inf - (-inf) = NaN)",
)
def large_scores_stay_finite(impl, case):
    """With scores q·k/√D of size up to about 1e4 (every input finite, in every dtype), attention's output and weights are finite.

    The scores, and every partial sum of them, stay below 2**15 in float16 (2**17 in wider dtypes),
    so they are finite: a correct softmax (max subtracted) is finite whatever their size.
    """
    inputs = _draw_inputs(impl, case, min_score_scale=MAX_SCORE_SCALE / 16, **LONG, large_scores=True)
    call = describe_call("attention", inputs)
    out, weights = ATTENTION.called(impl, inputs, call)
    assert_finite(out, "attention output", call)
    if weights is not None:
        assert_finite(weights, "attention weights", call)


@invariant(
    requires=("attention",),
    hint="the mask is transposed (tril for triu: each token sees itself and the future) or hides a key the last "
    "token may see, so the last token does not attend to every position",
    applies=first_reason(NO_ENCODER_MODE, NO_DECODER_MODE),
)
def last_position_mask_free(impl, case):
    """The last position's output and weights are the same with causal=True and causal=False, to rounding.

    Its score row is the same in both and the mask hides none of it: the reference, and torch's SDPA
    on the CPU (measured, T up to 513), give it bitwise equal either way. But a fused kernel may take
    another path when given a mask (SDPA's flash kernel on CUDA takes no explicit mask), so rounding is allowed.
    """
    drawn = _draw_inputs(impl, case, causal=True, **SWEEP)
    tol = impl.tolerance.scaled(ROUNDINGS["attention"])  # two kernels may round differently all along the chain
    for T in _lengths(drawn):
        inputs = truncated(drawn, T)
        call = describe_call("attention", inputs, "vs causal=False")
        free = ATTENTION.called(impl, inputs, call, causal=False)
        scale = _magnitude(impl, inputs, free[1], causal=False)
        ATTENTION.assert_parts(ATTENTION.called(impl, inputs, call), free, "of the last query, causal", call,
                               {"weights": tol, "out": tol.at_scale(scale)}, select=lambda part, value: value[..., -1, :])


@invariant(
    requires=("attention",),
    hint="a mask is applied although causal=False (the flag is ignored), or the output depends on where a token sits "
    "(a positional bias, a cumulative sum over the sequence)",
    applies=NO_ENCODER_MODE,
)
def permutation_equivariance(impl, case):
    """Without the mask, permuting the tokens permutes the outputs and the weights' rows and columns the same way (to rounding)."""
    inputs = _draw_inputs(impl, case, causal=False, **LONG)
    T = inputs["x"].shape[1]
    p = np.array(case.draw(permutations(range(T)), "permutation p"))
    call = describe_call("attention", inputs, "vs the same on x[:, p]")
    out, weights = ATTENTION.called(impl, inputs, call)
    moved_out, moved_weights = ATTENTION.called(impl, inputs, call, x=inputs["x"][:, p])
    tol = impl.tolerance.scaled(2)  # the softmax and weights @ v sum the same terms in another order
    if weights is not None:
        assert_close(moved_weights, weights[:, :, p][..., p], "weights on x[:, p]", tol, call)
    assert_close(moved_out, out[:, p], "output on x[:, p]", tol.at_scale(_magnitude(impl, inputs, weights)), call)


@invariant(
    requires=("attention",),
    hint="the output is not merged_heads @ W_o alone: a residual (x + ...) or a bias is added inside attention, or "
    "W_o is not applied",
)
def zero_output_projection(impl, case):
    """With W_o = 0 attention's output is exactly 0, whatever x and the other weights."""
    inputs = _draw_inputs(impl, case, **LONG, large_scores=True)
    call = describe_call("attention", inputs, "with W_o = 0")
    out, _ = ATTENTION.called(impl, inputs, call, W_o=np.zeros_like(inputs["W_o"]))
    assert_equal(out, 0.0, "attention output with W_o = 0", call)


@invariant(
    requires=("attention",),
    hint="the weights depend on W_v (keys or queries projected with W_v: a copy-paste slip), or the values pass "
    "through a nonlinearity before they are averaged",
)
def linear_in_values(impl, case):
    """attention is linear in W_v: out(a·W_v + b·W_v') = a·out(W_v) + b·out(W_v') for the same x, W_q, W_k and W_o, to rounding."""
    inputs = _draw_inputs(impl, case, **LONG)
    other = case.draw(weight_matrices(inputs["W_v"].shape), "W_v'")
    a, b = (case.draw(sampled_from((-1.0, 1.0)), f"sign of {c}") * case.draw(st.floats(0.5, 2.0), f"|{c}|") for c in "ab")
    call = describe_call("attention", inputs, f"with W_v = a·W_v + b·W_v', a={a!r}, b={b!r}")
    mixed = a * impl.as_seen(inputs["W_v"]) + b * impl.as_seen(other)
    out, weights = ATTENTION.called(impl, inputs, call)
    other_out, _ = ATTENTION.called(impl, inputs, call, W_v=other)
    mixed_out, _ = ATTENTION.called(impl, inputs, call, W_v=mixed)
    expected = a * out.astype(np.float64) + b * other_out.astype(np.float64)
    # four roundings on the values' path (the mixed W_v on the way in, x @ W_v, weights @ v, @ W_o) in each of
    # three outputs, each at the scale of its own terms
    scale = sum(abs(c) * _magnitude(impl, inputs, weights, W_v=W) for c, W in ((a, inputs["W_v"]), (b, other), (1.0, mixed)))
    assert_close(mixed_out, expected, "out(a·W_v + b·W_v')", impl.tolerance.scaled(4).at_scale(scale), call)


@invariant(
    requires=("attention",),
    hint="tokens attend across batch items: the batch is packed into one sequence without a block-diagonal mask, or "
    "a reshape or transpose mixes the batch axis with the sequence or head axes",
)
def batch_items_independent(impl, case):
    """Changing one batch item leaves every other item's outputs and weights exactly unchanged."""
    inputs = _draw_inputs(impl, case, min_batch=2, **LONG, large_scores=True)
    x = inputs["x"]  # (B, T, d)
    B, T, d = x.shape
    item = case.draw(integers(0, B - 1), "changed batch item")
    changed = x.copy()
    changed[item] = case.draw(float_arrays((T, d), **PERTURBATION_SCALES), "new batch item")
    while largest_score_sum(changed, inputs["W_q"], inputs["W_k"], inputs["n_heads"]) > _score_bound(impl):
        changed[item] /= 2  # exact: keeps the new item's scores within the bound (finite in float16)
    keep = np.arange(B) != item
    call = describe_call("attention", inputs, f"with batch item {item} replaced")
    ATTENTION.assert_parts(ATTENTION.called(impl, inputs, call, x=changed), ATTENTION.called(impl, inputs, call),
                           f"of the batch items other than {item}", call, select=lambda part, value: value[keep])


@invariant(
    requires=("attention",),
    hint="heads are split or merged with the wrong reshape (reshape(B, T, D, H) instead of (B, T, H, D) interleaves "
    "the heads' features), or the transpose between the head and sequence axes is missing; or the scores are not "
    "scaled by 1/√d_head (each one-head call here gets W_q·√H so that its 1/√d is the head's 1/√D)",
)
def multi_head_is_sum_of_heads(impl, case):
    """Multi-head attention equals the sum over heads h of one-head attention on head h's slice:
    columns h·D:(h+1)·D of W_q, W_k, W_v and those rows of W_o.

    Each head runs through the implementation itself as a one-head call of the same width, with
    the other heads' columns (and W_o's rows) zeroed and W_q times √H, so that its 1/√d is the
    head's 1/√D; its weights must be that head's weights. Holds to rounding.
    """
    inputs = _draw_inputs(impl, case, min_heads=2, **LONG)
    x, W_q, W_k, W_v, W_o, H, causal = ATTENTION.arguments_of(inputs)
    d = x.shape[-1]
    D = d // H
    call = describe_call("attention", inputs, "vs the sum of its heads as one-head calls")
    out, weights = ATTENTION.called(impl, inputs, call)
    total = np.zeros(out.shape)  # (B, T, d)
    tol = impl.tolerance.scaled(ROUNDINGS["attention"])  # the one-head calls reach the same values by other roundings (W_q·√H, 1/√d)
    for h in range(H):
        keep = (np.arange(d) // D == h).astype(np.float64)  # (d,): head h's features
        head = dict(inputs, W_q=W_q * keep * np.sqrt(H), W_k=W_k * keep, W_v=W_v * keep, W_o=W_o * keep[:, None], n_heads=1)
        head_out, head_weights = ATTENTION.called(impl, head, f"{call} (head {h})")
        total += head_out
        if weights is not None:
            assert_close(weights[:, h], head_weights[:, 0], f"weights of head {h}", tol, call)
    assert_close(out, total, "multi-head output", tol.at_scale(_magnitude(impl, inputs, weights)), call)


@invariant(
    requires=("attention",),
    hint="the scores are not scaled by 1/√d_head (unscaled, or by 1/√d_model or 1/d_head), part of attention runs in "
    "a lower precision than its inputs (scores or softmax in float16 inside: .half(), autocast), or another convention "
    "differs from GPT-2's attention (x @ W, heads as contiguous column blocks, W_o after merging)",
)
def agrees_with_reference(impl, case):
    """attention's output and weights agree with the float64 reference (to 1e-10 in float64, the dtype tolerance otherwise).

    This is what pins the 1/√d_head scale, which no law above can see.
    """
    inputs = _draw_inputs(impl, case, **LONG)
    call = describe_call("attention", inputs)
    expected = reference_answer(impl, "attention", *ATTENTION.arguments_of(inputs))  # (out, weights)
    tol = reference_tolerance(impl, factor=ROUNDINGS["attention"])  # float64 keeps the course's fixed 1e-10
    ATTENTION.assert_parts(ATTENTION.called(impl, inputs, call), expected, "", call,
                           {"weights": tol, "out": tol.at_scale(_magnitude(impl, inputs, expected[1]))})
