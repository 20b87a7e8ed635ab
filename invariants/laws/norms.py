"""Invariants of layer_norm and rms_norm: statistics, the exact scale law, shift, affine, row independence.

Every check passes eps = 1e-5, or the fixed eps an implementation declares (LAYER_NORM_EPS,
RMS_NORM_EPS: a norm that ignores the eps it is passed), and computes what it expects with that
eps. The scale laws need the norm at eps/c², which a fixed eps cannot give: they are skipped
(Declared) for such an implementation rather than checked at the wrong eps.

Rows of exact zeros are drawn on purpose wherever a law holds there (LN(0) = bias, rms(0) = 0), and
layer_norm_large_rows and rms_norm_large_rows draw rows of size up to about ±12,000, where x² is
past float16's largest value: a norm that squares in its input's 16-bit dtype overflows there.
"""

from __future__ import annotations

import numpy as np
from hypothesis import strategies as st

from invariants.asserts import InvariantViolation, assert_close, assert_equal, assert_finite, assert_shape
from invariants.conventions import (
    PROTOCOL_EPS,
    Declared,
    declared,
    declared_skip,
    has_layer_norm_bias,
    layer_norm_eps,
    rms_norm_eps,
)
from invariants.inputs import valid_inputs
from invariants.laws.reference_check import assert_agrees_with_reference
from invariants.protocol import ImplementationError
from invariants.registry import invariant
from invariants.strategies.core import integers
from invariants.strategies.norms import LARGEST_ROW_STD, gains_and_biases, norm_rows, scale_factors

LESSON = 20  # where a lesson meets this component: the registry's order (test ids, the kill matrix's first failure)
HOLDS = ("layer_norm", "rms_norm")  # the protocol functions whose laws it holds

LARGE_ROWS = dict(min_row_std=2.0**5, max_row_std=LARGEST_ROW_STD, max_offset=1.0)  # |x| up to ~12,000: x² > 65504 for |x| >= 256
_FIXED_LN_EPS = declared_skip("LAYER_NORM_EPS", lambda eps: eps is not None, "the scale law needs layer_norm at eps/c², not at a fixed eps")
_FIXED_RMS_EPS = declared_skip("RMS_NORM_EPS", lambda eps: eps is not None, "the scale law needs rms_norm at eps/c², not at a fixed eps")


def _shared_eps(impl):
    """One eps both norms take: the one declared fixed (either), else 1e-5; None where both are fixed, at different values."""
    fixed = {declared(impl, name) for name in ("LAYER_NORM_EPS", "RMS_NORM_EPS")} - {None}
    return PROTOCOL_EPS if not fixed else fixed.pop() if len(fixed) == 1 else None


def _different_eps(impl):
    """The skip reason of rms_norm_of_centred_is_layer_norm where the two norms' declared eps differ, or None."""
    if _shared_eps(impl) is not None:
        return None
    ln, rms = layer_norm_eps(impl), rms_norm_eps(impl)
    return Declared(f"{impl.label} declares LAYER_NORM_EPS = {ln!r} and RMS_NORM_EPS = {rms!r}: the identity needs one eps for both")


def _exact_scaling(impl):
    """Scaling by 2**k commutes with every rounding in float32/float64 on the CPU; fp16's eps is subnormal, CUDA may use rsqrt."""
    return impl.device == "cpu" and impl.dtype in ("float32", "float64")


def _plain(d):
    return np.ones(d), np.zeros(d)  # gain 1, bias 0


def gains_and_biases_for(impl, d):
    """gains_and_biases(d) for impl's layer_norm: the biases zero where it declares LAYER_NORM_BIAS = False."""
    return gains_and_biases(d) if has_layer_norm_bias(impl) else gains_and_biases(d).map(_without_bias)


def _without_bias(gain_and_bias):
    gain, bias = gain_and_bias
    return gain, np.zeros_like(bias)


@valid_inputs("layer_norm")
def layer_norm_arguments(impl, case):
    """Rows of moderate values, a gain and bias as declared, and the declared eps as a Python float."""
    x = case.draw(norm_rows(max_rows=3, max_d=8), "x")
    g, b = case.draw(gains_and_biases_for(impl, x.shape[-1]), "gain, bias")
    return x, g, b, layer_norm_eps(impl)  # a Python float, as the suite always passes eps


@valid_inputs("rms_norm")
def rms_norm_arguments(impl, case):
    """Rows of moderate values, a gain and the declared eps as a Python float."""
    x = case.draw(norm_rows(max_rows=3, max_d=8), "x")
    g, _ = case.draw(gains_and_biases(x.shape[-1]), "gain, bias")
    return x, g, rms_norm_eps(impl)


def _layer_norm(impl, x, g, b, eps, call):
    """impl.layer_norm(x, g, b, eps), checked to have x's shape."""
    return assert_shape(impl.layer_norm(x, g, b, eps), x.shape, "layer_norm output", call)


def _rms_norm(impl, x, g, eps, call):
    """impl.rms_norm(x, g, eps), checked to have x's shape."""
    return assert_shape(impl.rms_norm(x, g, eps), x.shape, "rms_norm output", call)


FAR_FROM_EPS, NEAR_EPS = 2**16, 2**6  # the mean squares, in eps's, at which errors_far_from_and_near_eps looks


def errors_far_from_and_near_eps(rerun, rows, eps):
    """{"norm_error_far", "norm_error_near", and the mean squares they were taken at, in eps's}: a failing norm's largest error
    relative to its answers' largest, again with each nonzero
    row (..., d) times a power of two (exact in every float format) that brings its mean square to about FAR_FROM_EPS·eps, then
    NEAR_EPS·eps; rerun(rows) -> (got, expected). Rounding errs alike at both (relative, scale-free); an error of eps's making
    (eps outside the root, squared, dropped: about eps/√ms or eps/ms) is 2^5 to 2^10 times larger near eps. No figures where eps
    is 0 or a rerun raises."""
    if eps <= 0:
        return {}
    mean_square = np.square(np.asarray(rows, dtype=np.float64)).mean(axis=-1, keepdims=True)  # (..., 1)
    figures = {"norm_error_far_at": FAR_FROM_EPS, "norm_error_near_at": NEAR_EPS}
    for name, multiple in (("norm_error_far", FAR_FROM_EPS), ("norm_error_near", NEAR_EPS)):
        power = np.round(0.5 * np.log2(multiple * eps / np.where(mean_square > 0, mean_square, multiple * eps)))  # 0 for a zero row
        try:
            got, expected = (np.asarray(a, dtype=np.float64) for a in rerun(rows * 2.0**power))
        except (ImplementationError, InvariantViolation):  # a refusal or a wrong shape: the failure stands without the figures
            return {}
        with np.errstate(invalid="ignore"):
            figures[name] = float(np.abs(got - expected).max() / max(np.abs(expected).max(), np.finfo(np.float64).tiny))
    return figures


@invariant(
    requires=("layer_norm",),
    hint="the variance is not the population one (divide by d, not d - 1), or the mean is not subtracted per row",
)
def layer_norm_row_statistics(impl, case):
    """Each output row of layer_norm has mean 0 and population variance σ²/(σ²+ε), σ² the row's input variance."""
    x = case.draw(norm_rows(zero_rows=True), "x")  # (rows, d)
    g, b = _plain(x.shape[-1])
    eps = layer_norm_eps(impl)
    call = f"layer_norm(x, ones, zeros, {eps})"
    y = _layer_norm(impl, x, g, b, eps, call)
    var_in = impl.as_seen(x).var(axis=-1)  # (rows,)
    tol = impl.tolerance.scaled(4).at_scale(1.0)  # statistics of d rounded values of unit size
    assert_close(y.astype(np.float64).mean(axis=-1), 0.0, "row mean of layer_norm(x)", tol, call)
    assert_close(y.astype(np.float64).var(axis=-1), var_in / (var_in + eps), "row variance of layer_norm(x)", tol, call)


@invariant(
    requires=("layer_norm",),
    hint="eps is added outside the square root (x̂ = (x - μ)/(σ + ε)) or the variance is unbiased; "
    "LN(c·x) = sign(c)·LN_{ε/c²}(x) holds only with ε inside √(σ² + ε)",
    applies=_FIXED_LN_EPS,
)
def layer_norm_scale_law(impl, case):
    """layer_norm(c·x, eps) = sign(c)·layer_norm(x, eps/c²) for every c ≠ 0, bitwise for c = ±2**k on the CPU in float32/64.

    Scaling by a power of two commutes with every rounding, so the law is exact there; for
    other c (and on CUDA, or in float16 where eps is subnormal) it holds to rounding.
    """
    x = case.draw(norm_rows(), "x")
    powers = case.draw(st.booleans(), "c is a power of two")
    c = case.draw(scale_factors(powers_of_two=powers), "c")
    g, b = _plain(x.shape[-1])
    call = f"layer_norm(c·x, ones, zeros, {PROTOCOL_EPS}) vs sign(c)·layer_norm(x, ones, zeros, {PROTOCOL_EPS}/c²) with c={c!r}"
    scaled = _layer_norm(impl, c * x, g, b, PROTOCOL_EPS, call)
    expected = np.sign(c) * _layer_norm(impl, x, g, b, PROTOCOL_EPS / c**2, call)
    if powers and _exact_scaling(impl):
        assert_equal(scaled, expected, "layer_norm(c·x)", call)
    else:
        assert_close(scaled, expected, "layer_norm(c·x)", impl.tolerance.scaled(8), call)  # c·x is rounded once more


@invariant(
    requires=("layer_norm",),
    hint="the mean is not subtracted, or it is taken over the wrong axis (batch or sequence instead of features)",
)
def layer_norm_shift_invariance(impl, case):
    """Adding a constant to a row leaves its layer_norm unchanged: LN(x + c) = LN(x)."""
    x = case.draw(norm_rows(max_offset=0.0), "x")  # rows centred, so x + c has a mean of c
    shift = case.draw(st.floats(-3, 3), "c (in units of each row's std)") * x.std(axis=-1, keepdims=True)  # (rows, 1)
    g, b = _plain(x.shape[-1])
    eps = layer_norm_eps(impl)
    call = f"layer_norm(x + c, ones, zeros, {eps}) vs layer_norm(x, ones, zeros, {eps})"
    tol = impl.tolerance.scaled(8)  # x + c rounds with |c| up to 3σ
    assert_close(_layer_norm(impl, x + shift, g, b, eps, call), _layer_norm(impl, x, g, b, eps, call), "layer_norm(x + c)", tol, call)


@invariant(
    requires=("layer_norm",),
    hint="the gain or the bias is dropped, or applied before normalising (LN(g·x + b) instead of g·LN(x) + b); "
    "a LayerNorm built without a bias (nn.LayerNorm(bias=False)) declares LAYER_NORM_BIAS = False",
)
def layer_norm_affine(impl, case):
    """layer_norm(x; g, b) = g·layer_norm(x; 1, 0) + b, gain and bias applied after normalising."""
    x = case.draw(norm_rows(zero_rows=True), "x")
    g, b = case.draw(gains_and_biases_for(impl, x.shape[-1]), "gain, bias")
    ones, zeros = _plain(x.shape[-1])
    eps = layer_norm_eps(impl)
    call = f"layer_norm(x, g, b, {eps}) vs g·layer_norm(x, ones, zeros, {eps}) + b"
    expected = impl.as_seen(g) * _layer_norm(impl, x, ones, zeros, eps, call).astype(np.float64) + impl.as_seen(b)
    assert_close(_layer_norm(impl, x, g, b, eps, call), expected, "layer_norm(x, g, b)", impl.tolerance.scaled(4), call)


@invariant(
    requires=("layer_norm",),
    hint="statistics are pooled across rows (the BatchNorm bug): normalise over the last axis only",
)
def layer_norm_rows_independent(impl, case):
    """Changing one row (token) of the input leaves every other row of layer_norm's output exactly unchanged."""
    x = case.draw(norm_rows(min_rows=2, zero_rows=True), "x")  # (rows, d)
    row = case.draw(integers(0, x.shape[0] - 1), "changed row")
    other = case.draw(norm_rows(min_rows=1, max_rows=1, min_d=x.shape[1], max_d=x.shape[1]), "new row")
    changed = x.copy()
    changed[row] = other[0]
    g, b = _plain(x.shape[-1])
    keep = np.arange(x.shape[0]) != row
    eps = layer_norm_eps(impl)
    call = f"layer_norm(x, ones, zeros, {eps}) with row {row} replaced"
    before = _layer_norm(impl, x, g, b, eps, call)
    after = _layer_norm(impl, changed, g, b, eps, call)
    assert_equal(after[keep], before[keep], f"layer_norm output rows other than {row}", call)


@invariant(
    requires=("layer_norm",),
    hint="unbiased variance (d - 1) gives (-1.162, -0.387, 0.387, 1.162); the population variance (d) gives (-1.342, -0.447, 0.447, 1.342); "
    "eps added outside the square root, or statistics pooled over more than the row, give neither",
)
def layer_norm_known_values(impl, case):
    """layer_norm(1, 2, 3, 4) = (-1.342, -0.447, 0.447, 1.342): the population variance, eps = 1e-5.

    With LAYER_NORM_EPS declared, the expected values are computed at that eps.
    """
    x = np.array([[1.0, 2.0, 3.0, 4.0]])
    g, b = _plain(4)
    eps = layer_norm_eps(impl)
    expected = (x - 2.5) / np.sqrt(1.25 + eps)  # (-1.3416, -0.4472, 0.4472, 1.3416) at eps = 1e-5
    call = f"layer_norm([[1., 2., 3., 4.]], ones, zeros, {eps})"
    got = _layer_norm(impl, x, g, b, eps, call)
    assert_close(got, expected, "layer_norm([1, 2, 3, 4])", impl.tolerance.scaled(4), call)


@invariant(
    requires=("rms_norm",),
    hint="eps is added outside the square root, or the mean (not the mean square) is used: rms(c·x) = sign(c)·rms_{ε/c²}(x) needs x/√(mean(x²) + ε)",
    applies=_FIXED_RMS_EPS,
)
def rms_norm_scale_law(impl, case):
    """rms_norm(c·x, eps) = sign(c)·rms_norm(x, eps/c²) for every c ≠ 0 (so rms_norm is odd): bitwise for powers of two on the CPU."""
    x = case.draw(norm_rows(), "x")
    powers = case.draw(st.booleans(), "c is a power of two")
    c = case.draw(scale_factors(powers_of_two=powers), "c")
    ones = np.ones(x.shape[-1])
    call = f"rms_norm(c·x, ones, {PROTOCOL_EPS}) vs sign(c)·rms_norm(x, ones, {PROTOCOL_EPS}/c²) with c={c!r}"
    scaled = _rms_norm(impl, c * x, ones, PROTOCOL_EPS, call)
    expected = np.sign(c) * _rms_norm(impl, x, ones, PROTOCOL_EPS / c**2, call)
    if powers and _exact_scaling(impl):
        assert_equal(scaled, expected, "rms_norm(c·x)", call)
    else:
        assert_close(scaled, expected, "rms_norm(c·x)", impl.tolerance.scaled(8), call)


@invariant(
    requires=("rms_norm", "layer_norm"),
    hint="rms_norm centres its input (that is layer_norm), or one of the two uses another variance or eps placement",
    applies=_different_eps,
)
def rms_norm_of_centred_is_layer_norm(impl, case):
    """rms_norm(x - mean(x)) = layer_norm(x) row by row, with gain 1, bias 0 and the same eps."""
    x = case.draw(norm_rows(zero_rows=True), "x")
    g, b = _plain(x.shape[-1])
    seen = impl.as_seen(x)
    centred = seen - seen.mean(axis=-1, keepdims=True)
    eps = _shared_eps(impl)
    call = f"rms_norm(x - mean(x), ones, {eps}) vs layer_norm(x, ones, zeros, {eps})"
    tol = impl.tolerance.scaled(8)  # the centring is rounded by the caller, not inside the function
    assert_close(_rms_norm(impl, centred, g, eps, call), _layer_norm(impl, x, g, b, eps, call), "rms_norm(x - mean(x))", tol, call)


@invariant(
    requires=("layer_norm",),
    hint="a convention differs from GPT-2's LayerNorm: population variance, eps inside the square root, gain then bias",
)
def layer_norm_agrees_with_reference(impl, case):
    """layer_norm agrees with the float64 reference (to 1e-10 in float64, the dtype tolerance otherwise).

    Both at eps = 1e-5, or at the declared LAYER_NORM_EPS; rows of zeros (LN(0) = b exactly) are drawn too.
    """
    x = case.draw(norm_rows(zero_rows=True), "x")
    g, b = case.draw(gains_and_biases_for(impl, x.shape[-1]), "gain, bias")
    eps = layer_norm_eps(impl)
    call = f"layer_norm(x, g, b, {eps})"
    got = _layer_norm(impl, x, g, b, eps, call)
    assert_agrees_with_reference(impl, "layer_norm", (x, g, b, eps), got, "layer_norm(x, g, b)", factor=4, call=call)


@invariant(
    requires=("rms_norm",),
    hint="a convention differs from RMSNorm's: divide by √(mean(x²) + ε), no centring, gain but no bias",
)
def rms_norm_agrees_with_reference(impl, case):
    """rms_norm agrees with the float64 reference (to 1e-10 in float64, the dtype tolerance otherwise).

    Both at eps = 1e-5, or at the declared RMS_NORM_EPS; rows of zeros (rms(0) = 0 exactly) are drawn too.
    """
    x = case.draw(norm_rows(zero_rows=True), "x")
    g, _ = case.draw(gains_and_biases(x.shape[-1]), "gain, bias")
    eps = rms_norm_eps(impl)
    call = f"rms_norm(x, g, {eps})"
    got = _rms_norm(impl, x, g, eps, call)
    assert_agrees_with_reference(impl, "rms_norm", (x, g, eps), got, "rms_norm(x, g)", factor=4, call=call)


_SQUARES_IN_16_BITS = ("the squares or the variance are computed in the input's float16: x² overflows past |x| ≈ 256 "
                       "(65504 is float16's largest value), so the norm divides by inf; upcast to float32 for the "
                       "statistics, as torch's kernels and transformers' RMSNorm do")


@invariant(requires=("layer_norm",), hint=f"layer_norm is not finite or not right on large rows: {_SQUARES_IN_16_BITS}")
def layer_norm_large_rows(impl, case):
    """layer_norm of rows of size up to about ±12,000 (std 32 to 4096, representable in every dtype) is finite and agrees with the reference.

    The output is scale-free, so its tolerance is the usual one (norm-wise in 16 bits); only the
    statistics' squares are large, and a correct norm computes them in a wider type.
    """
    x = case.draw(norm_rows(**LARGE_ROWS), "x")
    g, b = case.draw(gains_and_biases_for(impl, x.shape[-1]), "gain, bias")
    eps = layer_norm_eps(impl)
    call = f"layer_norm(x, g, b, {eps}) with max|x| = {np.abs(x).max():g}"
    got = assert_finite(_layer_norm(impl, x, g, b, eps, call), "layer_norm output", call)
    assert_agrees_with_reference(impl, "layer_norm", (x, g, b, eps), got, "layer_norm(x, g, b)", factor=4, call=call)


@invariant(requires=("rms_norm",), hint=f"rms_norm is not finite or not right on large rows: {_SQUARES_IN_16_BITS}")
def rms_norm_large_rows(impl, case):
    """rms_norm of rows of size up to about ±12,000 (representable in every dtype) is finite and agrees with the reference.

    mean(x²) reaches 1.5e8 there: finite in float32 and bfloat16, not in float16, where a correct
    RMSNorm upcasts before squaring.
    """
    x = case.draw(norm_rows(**LARGE_ROWS), "x")
    g, _ = case.draw(gains_and_biases(x.shape[-1]), "gain, bias")
    eps = rms_norm_eps(impl)
    call = f"rms_norm(x, g, {eps}) with max|x| = {np.abs(x).max():g}"
    got = assert_finite(_rms_norm(impl, x, g, eps, call), "rms_norm output", call)
    assert_agrees_with_reference(impl, "rms_norm", (x, g, eps), got, "rms_norm(x, g)", factor=4, call=call)
