"""Invariants of softmax and cross_entropy: a distribution per row, shift invariance, masks, large logits, ln V.

Masked entries are checked at logits of size 1e4 too (rows shifted by ±1e4 around their -inf
entries), where a -inf replaced by a finite -1e4 (GPT-2's masked_bias) gets a probability.
"""

from __future__ import annotations

import numpy as np
from hypothesis import strategies as st

from invariants.asserts import assert_close, assert_equal, assert_finite, assert_shape, assert_where
from invariants.conventions import rounding_dtype
from invariants.inputs import valid_inputs
from invariants.laws.reference_check import assert_agrees_with_reference, reference_answer
from invariants.registry import invariant
from invariants.strategies.core import integers, sampled_from
from invariants.strategies.softmax import large_logits, logits, shifts, targets
from invariants.tolerance import agreement_tolerance

LESSON = 10  # where a lesson meets this component: the registry's order (test ids, the kill matrix's first failure)
HOLDS = ("softmax", "cross_entropy")  # the protocol functions whose laws it holds

COURSE_VOCAB = 28  # the P01 character vocabulary: ' .abcdefghijklmnopqrstuvwxyz'


@valid_inputs("softmax")
def softmax_arguments(impl, case):
    """Logits of up to 2 axes of moderate values and any valid axis, negative ones included."""
    x = case.draw(logits(max_ndim=2, max_vocab=8), "x")
    return x, case.draw(integers(-x.ndim, x.ndim - 1), "axis")


@valid_inputs("cross_entropy")
def cross_entropy_arguments(impl, case):
    """(N, V) logits of moderate values and a target class for each row."""
    x = case.draw(logits(min_ndim=2, max_ndim=2, max_side=4, max_vocab=8), "logits")  # (N, V)
    return x, case.draw(targets(x), "targets")


def _loss_logits(**kwargs):
    """Logits (..., V) with at least one leading axis, as the loss takes them: (tokens, V) or (B, T, V)."""
    return logits(min_ndim=2, **kwargs)


def _peak(x):
    """max |x| over the finite entries (0 for none): the size that rounding inside lse(x) - x_t is relative to."""
    finite = np.abs(x[np.isfinite(x)])
    return float(finite.max()) if finite.size else 0.0


@invariant(
    requires=("softmax",),
    hint="the sum is taken over the wrong axis (`axis` is ignored, or axis 0 / the batch is normalised), or exp(x) is not divided by its own sum, "
    "or log-probabilities are returned (log_softmax's rows do not sum to 1)",
)
def softmax_rows_sum_to_one(impl, case):
    """softmax(x, axis) sums to 1 along `axis`, for every axis of x."""
    x = case.draw(logits(), "x")
    axis = case.draw(integers(-x.ndim, x.ndim - 1), "axis")
    call = f"softmax(x, axis={axis})"
    p = assert_shape(impl.softmax(x, axis), x.shape, "softmax(x)", call)
    tol = impl.tolerance.at_scale(1.0)  # each entry is rounded relative to itself; the entries add up to 1
    assert_close(np.asarray(p.astype(np.float64).sum(axis=axis)), 1.0, f"sum of softmax(x) along axis {axis}", tol, call)


@invariant(
    requires=("softmax",),
    hint="the output is not exp(x)/Σexp(x): log-probabilities (log_softmax) or unnormalised exp(x) are returned",
)
def softmax_entries_in_unit_interval(impl, case):
    """Every entry of softmax(x) lies in [0, 1], exactly: exp is never negative and never exceeds the sum it is part of."""
    x = case.draw(logits(), "x")
    call = "softmax(x, -1)"
    p = assert_shape(impl.softmax(x, -1), x.shape, "softmax(x)", call)
    assert_where(p >= 0, p, "softmax(x)", ">= 0", call)
    assert_where(p <= 1, p, "softmax(x)", "<= 1", call)


@invariant(
    requires=("softmax",),
    hint="the output is not a function of the differences x_i - x_j alone: exp is replaced (x/Σx), or a constant is added after the exp",
)
def softmax_shift_invariance(impl, case):
    """Adding a constant c to a row leaves its softmax unchanged: softmax(x + c) = softmax(x).

    Logits and shifts are multiples of 1/16 below 16 in size, so x + c is exact in every dtype
    and any difference comes from the implementation.
    """
    x = case.draw(logits(dyadic=True), "x")  # (..., V)
    c = case.draw(shifts(x.shape[:-1] + (1,), dyadic=True), "c (one per row)")  # (..., 1)
    call = "softmax(x + c, -1) vs softmax(x, -1)"
    assert_close(impl.softmax(x + c, -1), impl.softmax(x, -1), "softmax(x + c)", impl.tolerance, call)


@invariant(
    requires=("softmax",),
    hint=(
        "the row maximum is not subtracted before exp: exp(1e4) overflows to inf and inf/inf is NaN, exp(-1e4) underflows to 0 "
        "and 0/0 is NaN (exp(x - logsumexp(x)) stays finite but rounds logsumexp at the scale of 1e4)"
    ),
)
def softmax_large_logits(impl, case):
    """softmax of logits of size 1e4 (rows shifted by ±1e4, or spread over ±1e4) is finite and agrees with the reference."""
    x = case.draw(large_logits(), "x")
    call = "softmax(x, -1)"
    p = assert_finite(assert_shape(impl.softmax(x, -1), x.shape, "softmax(x)", call), "softmax(x)", call)
    assert_agrees_with_reference(impl, "softmax", (x, -1), p, "softmax(x)", call=call)


@invariant(
    requires=("softmax",),
    hint="masked logits get a floor or an epsilon (clipping probabilities, exp(x) + ε) instead of exactly 0, or -inf is "
    "replaced by a finite value (-1e4, GPT-2's masked_bias; finfo.min) that gets a probability once the row's other "
    "logits are as low; exp(-inf) is 0 and must stay 0",
)
def softmax_masked_entries_are_zero(impl, case):
    """Entries whose logit is -inf get probability exactly 0 (every row keeps at least one finite logit).

    Exact at any size: the finite logits are drawn as they come, or with every row shifted by ±1e4
    (finite in every dtype: at most about 1.02e4), where a finite stand-in for -inf stops being small.
    """
    x = case.draw(logits(masked=True), "x")
    shift = case.draw(sampled_from((0.0, -1e4, 1e4)), "shift of every finite logit")
    x = x + shift  # -inf stays -inf
    call = f"softmax(x, -1) with -inf entries, the others shifted by {shift:g}"
    p = assert_finite(assert_shape(impl.softmax(x, -1), x.shape, "softmax(x)", call), "softmax(x)", call)
    masked = np.isinf(x)
    assert_equal(p[masked], 0.0, "softmax(x) at the -inf logits", call)


@invariant(
    requires=("softmax",),
    hint="a convention differs from exp(x)/Σexp(x) along the given axis, or it is computed in a lower precision than "
    "its input (float16 inside: .half(), astype(np.float16), autocast), which leaves about 3 decimal digits",
)
def softmax_agrees_with_reference(impl, case):
    """softmax agrees with the float64 reference (to 1e-10 in float64, the dtype tolerance otherwise)."""
    x = case.draw(logits(masked=case.draw(st.booleans(), "masked")), "x")
    axis = -1 if np.isinf(x).any() else case.draw(integers(-x.ndim, x.ndim - 1), "axis")
    got = impl.softmax(x, axis)
    assert_agrees_with_reference(impl, "softmax", (x, axis), got, "softmax(x)", call=f"softmax(x, axis={axis})")


def _loss_tolerance(impl, x):
    """The agreement tolerance widened by rtol·max|x|: lse(x) - x_t, a correct way to compute the loss,
    cancels two numbers of size max|x|, so it may lose rtol·max|x| even when the loss is small."""
    return agreement_tolerance(rounding_dtype(impl)).at_scale(_peak(impl.as_seen(x)))


@invariant(
    requires=("cross_entropy",),
    hint="the loss is summed over tokens instead of averaged, taken in bits (log2) instead of nats, or is not -log softmax",
)
def cross_entropy_uniform_is_log_vocab(impl, case):
    """cross_entropy of logits that are equal within each row is ln V nats, whatever the targets.

    Not bitwise: ln V is rounded to the implementation's dtype, the mean over tokens rounds, and
    lse(x) - x_t cancels two numbers of size |x|; the tolerance covers these roundings only.
    """
    x = case.draw(_loss_logits(patterns=("uniform",)), "x")  # (..., V), each row constant
    t = case.draw(targets(x), "targets")
    V = x.shape[-1]
    call = f"cross_entropy(x, targets) with V={V}"
    loss = assert_shape(impl.cross_entropy(x, t), (), "cross_entropy(x, targets)", call)
    tol = impl.tolerance.at_scale(_peak(impl.as_seen(x)))
    assert_close(loss, np.log(V), f"cross_entropy of uniform logits (ln {V} = {np.log(V):.4f})", tol, call)


@invariant(
    requires=("cross_entropy",),
    hint="the loss overflows or averages wrongly: the course's uniform logits over V = 28 give ln 28 = 3.3322 nats, at 0 and at 1e4",
)
def cross_entropy_known_values(impl, case):
    """The course's figures: all-zero logits over V = 28 (2×5 tokens) give 3.3322 nats, and so do all-1e4 logits (1 token)."""
    t = np.arange(10).reshape(2, 5) % COURSE_VOCAB  # (2, 5)
    for value, shape, tgt in ((0.0, (2, 5, COURSE_VOCAB), t), (1e4, (1, 1, COURSE_VOCAB), t[:1, :1])):
        x = np.full(shape, value)
        call = f"cross_entropy(np.full({shape}, {value:g}), targets)"
        loss = assert_shape(impl.cross_entropy(x, tgt), (), "cross_entropy", call)
        assert_close(loss, np.log(COURSE_VOCAB), "cross_entropy (3.3322 nats in the course)", _loss_tolerance(impl, x), call)


@invariant(
    requires=("cross_entropy",),
    hint="the loss is not built from log-probabilities: raw logits or probabilities are picked instead of log_softmax, or the sign is flipped, "
    "or log-sum-exp subtracts the row max and does not add it back, or skips the max (log Σexp(x) rounds below the target's logit: -1e-17)",
)
def cross_entropy_non_negative(impl, case):
    """cross_entropy >= 0 exactly: every log-probability is <= 0, since lse(x) >= max(x) >= x_t in any rounding.

    Half the examples put every target's logit at one small value u (0.01 to 0.5) and the rest of its row
    40 or more below it, where each row's loss is 0 to rounding: there log Σexp(x) without the max is
    log(exp(u)), which rounds below u for about 4 in 10 such u in float64 (the max-subtracted form gives
    u + log(1 + ~0) >= u).
    """
    x = case.draw(_loss_logits(), "x")
    t = case.draw(targets(x), "targets")
    if case.draw(st.booleans(), "targets far above the rest of their rows"):
        u = case.draw(st.floats(0.01, 0.5), "the targets' logit u")
        x = x - x.max(axis=-1, keepdims=True) + (u - 40)  # every logit <= u - 40
        np.put_along_axis(x, t[..., None], u, axis=-1)
    call = "cross_entropy(x, targets)"
    loss = assert_shape(impl.cross_entropy(x, t), (), "cross_entropy(x, targets)", call)
    assert_where(loss >= 0, loss, "cross_entropy(x, targets)", ">= 0", call)


@invariant(
    requires=("cross_entropy",),
    hint="the loss moves with the logits' common level: log-sum-exp subtracts the row max but does not add it back "
    "(log Σexp(x - m) instead of m + log Σexp(x - m)), or the target's raw logit is used without the log-sum-exp",
)
def cross_entropy_shift_invariance(impl, case):
    """Adding a constant c to a row of logits leaves the loss unchanged: CE(x + c, t) = CE(x, t).

    Logits and shifts are multiples of 1/16 below 16 in size, so x + c is exact in every dtype.
    """
    x = case.draw(_loss_logits(dyadic=True), "x")
    c = case.draw(shifts(x.shape[:-1] + (1,), dyadic=True), "c (one per row)")  # (..., 1)
    t = case.draw(targets(x), "targets")
    call = "cross_entropy(x + c, targets) vs cross_entropy(x, targets)"
    shifted = impl.cross_entropy(x + c, t)
    tol = impl.tolerance.at_scale(_peak(x + c))  # lse - x_t cancels numbers of size max|x + c|
    assert_close(shifted, impl.cross_entropy(x, t), "cross_entropy(x + c, targets)", tol, call)


@invariant(
    requires=("cross_entropy",),
    hint="the loss overflows at large logits: exp without subtracting the max (inf), or log(softmax(x)) instead of x - logsumexp(x) (log 0 = -inf)",
)
def cross_entropy_large_logits(impl, case):
    """cross_entropy at logits of size 1e4 (rows shifted by ±1e4, or spread over ±1e4) is finite and agrees with the reference."""
    x = case.draw(large_logits(min_ndim=2), "x")
    t = case.draw(targets(x), "targets")
    call = "cross_entropy(x, targets)"
    loss = assert_finite(assert_shape(impl.cross_entropy(x, t), (), "cross_entropy(x, targets)", call), "cross_entropy(x, targets)", call)
    assert_close(loss, reference_answer(impl, "cross_entropy", x, t), "cross_entropy(x, targets)", _loss_tolerance(impl, x), call)


@invariant(
    requires=("cross_entropy",),
    hint="a convention differs from the mean negative log-probability in nats over every target position",
)
def cross_entropy_agrees_with_reference(impl, case):
    """cross_entropy agrees with the float64 reference (to 1e-10 in float64, the dtype tolerance otherwise, both widened by rtol·max|x|)."""
    x = case.draw(_loss_logits(), "x")
    t = case.draw(targets(x), "targets")
    call = "cross_entropy(x, targets)"
    loss = impl.cross_entropy(x, t)
    assert_close(loss, reference_answer(impl, "cross_entropy", x, t), "cross_entropy(x, targets)", _loss_tolerance(impl, x), call)
