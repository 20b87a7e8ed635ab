"""Invariants of gelu: the odd part is x, gelu(0) = 0, the ReLU bounds, elementwise, the course's values, tanh vs erf.

Both GELU forms are correct: the exact x·Φ(x) = 0.5·x·(1 + erf(x/√2)) (torch's default) and the
tanh approximation 0.5·x·(1 + tanh(√(2/π)·(x + 0.044715·x³))) (GPT-2's, the reference's). They
differ by at most 4.73e-4 (at x ≈ ±2.70), so no check here demands one form over the other,
unless the implementation declares one (GELU_FORM = "tanh" or "erf"): gelu_agrees_with_reference
then holds it to that form, which is how a wrong declaration fails loudly (in float32 and float64,
where the forms are told apart; in 16 bits they round to the same values).
"""

from __future__ import annotations

import numpy as np
from hypothesis.extra.numpy import array_shapes

import invariants.reference.numpy as ref
from invariants.asserts import assert_close, assert_equal, assert_shape, assert_where
from invariants.conventions import rounding_dtype
from invariants.inputs import valid_inputs
from invariants.laws.reference_check import assert_close_to_a_gelu_form, gelu_forms
from invariants.registry import invariant
from invariants.strategies.activation import activation_inputs, paddings
from invariants.tolerance import Tolerance, agreement_tolerance

LESSON = 30  # where a lesson meets this component: the registry's order (test ids, the kill matrix's first failure)
HOLDS = ("gelu",)  # the protocol functions whose laws it holds

TANH_VS_ERF = 4.8e-4  # max |tanh form - erf form| over all x is 4.73e-4
RELU_GAP = 0.171  # max (relu(x) - gelu(x)) = -min gelu: 0.16997 (erf form, x = -0.7518), 0.17004 (tanh form, x = -0.7525)
COURSE_VALUES = ((1.0, 0.841), (-3.0, -0.004), (10.0, 10.0), (0.0, 0.0))  # the course's GELU(z), to 3 decimals

@valid_inputs("gelu")
def gelu_arguments(impl, case):
    """An array of up to 2 axes of moderate values."""
    return (case.draw(activation_inputs(max_ndim=2, max_side=4), "x"),)


def _widened(tol, extra):
    """tol with `extra` added to its atol: a stated allowance on top of the rounding."""
    return Tolerance(tol.rtol, tol.atol + extra, tol.dtype)


def _at_input_scale(tol, seen):
    """tol widened by rtol·max|x|: for x < 0 both forms compute 0.5·x·(1 + t) with t near -1, and 1 + t
    cancels, so a correct GELU computed in the dtype is off by about rtol·|x| where its output is tiny
    (bfloat16's tanh form gives GELU(-3) = -0.0059, not -0.0040)."""
    return tol.at_scale(float(np.abs(seen).max(initial=0.0)))


@invariant(
    requires=("gelu",),
    hint="the odd part of gelu is not x: the 0.5 is dropped (x·(1 + tanh(...))), or the gate is not a CDF of a symmetric distribution",
)
def gelu_odd_part_is_identity(impl, case):
    """gelu(x) - gelu(-x) = x for every x (true of both the tanh and the erf form), to rounding relative to |x|."""
    x = case.draw(activation_inputs(), "x")
    call = "gelu(x) - gelu(-x)"
    pos = assert_shape(impl.gelu(x), x.shape, "gelu(x)", call).astype(np.float64)
    neg = assert_shape(impl.gelu(-x), x.shape, "gelu(-x)", call).astype(np.float64)
    assert_close(pos - neg, impl.as_seen(x), "gelu(x) - gelu(-x)", impl.tolerance, call)  # relative to |x|: the expected value is x


@invariant(
    requires=("gelu",),
    hint="gelu(0) is not 0: the gate Φ(x) is returned without the factor x, or a bias is added",
)
def gelu_zero_is_zero(impl, case):
    """gelu(0) = 0 exactly, at every position of an all-zero array."""
    x = np.zeros(case.draw(array_shapes(min_dims=1, max_dims=3, max_side=6), "shape"))
    call = f"gelu(np.zeros({x.shape}))"
    assert_equal(assert_shape(impl.gelu(x), x.shape, "gelu(0)", call), 0.0, "gelu(0)", call)


@invariant(
    requires=("gelu",),
    hint="the sign inside is flipped (0.5·x·(1 - tanh(...)) is x - gelu(x), near 0 for large x), or the 0.5 is dropped (up to 2x)",
)
def gelu_between_relu_bounds(impl, case):
    """relu(x) - 0.171 <= gelu(x) <= relu(x) for every x, with one dtype tolerance at |x| as slack.

    The maths: gelu(x) = x·Φ(x) <= relu(x), and relu(x) - gelu(x) = -gelu(-|x|) <= 0.1700 (the
    depth of gelu's dip, both forms). The slack (atol + rtol·|x|) lets a fast tanh or erf
    kernel, or the final rounding to a 16-bit dtype, land a rounding step beyond either bound.
    """
    x = case.draw(activation_inputs(), "x")
    call = "gelu(x)"
    y = assert_shape(impl.gelu(x), x.shape, "gelu(x)", call).astype(np.float64)
    seen = impl.as_seen(x)
    relu = np.maximum(seen, 0.0)
    slack = impl.tolerance.atol + impl.tolerance.rtol * np.abs(seen)
    assert_where(y <= relu + slack, y, "gelu(x)", f"<= relu(x) (slack {impl.tolerance})", call)
    assert_where(y >= relu - RELU_GAP - slack, y, "gelu(x)", f">= relu(x) - {RELU_GAP} (slack {impl.tolerance})", call)


@invariant(
    requires=("gelu",),
    hint="gelu is not elementwise: it normalises or mixes values across the array, or depends on the array's shape",
)
def gelu_elementwise(impl, case):
    """gelu of an element does not depend on its neighbours or on the array's shape: reversed, flattened and padded, it agrees to rounding.

    Not bitwise: torch's own F.gelu gives answers one ulp apart for the same value in the
    vectorised body and the scalar tail of its loop (measured on CPU, float32 and float64).
    """
    x = case.draw(activation_inputs(), "x")
    before, after = case.draw(paddings(), "values before"), case.draw(paddings(), "values after")
    n = x.size
    call = "gelu(concatenate([before, x.ravel()[::-1], after])) vs gelu(x)"
    alone = assert_shape(impl.gelu(x), x.shape, "gelu(x)", call)
    moved = impl.gelu(np.concatenate([before, x.ravel()[::-1], after]))
    assert_shape(moved, (len(before) + n + len(after),), "gelu of the padded vector", call)
    again = moved[len(before) : len(before) + n][::-1].reshape(x.shape)
    tol = _at_input_scale(impl.tolerance, impl.as_seen(x))
    assert_close(again, alone, "gelu(x) computed at other positions", tol, call)


@invariant(
    requires=("gelu",),
    hint="another activation stands in for GELU: ReLU gives 1 and 0 at x = 1 and -3, SiLU 0.731 and -0.142; GELU gives 0.841 and -0.004",
)
def gelu_known_values(impl, case):
    """The course's values: GELU(1) = 0.841, GELU(-3) = -0.004, GELU(10) = 10.0 and GELU(0) = 0, to three decimals."""
    x = np.array([z for z, _ in COURSE_VALUES])
    got = assert_shape(impl.gelu(x), x.shape, "gelu(x)", "gelu([1, -3, 10, 0])")
    for i, (z, value) in enumerate(COURSE_VALUES):  # one at a time: a 16-bit tolerance relative to max|expected| = 10 would hide GELU(1)
        tol = _widened(_at_input_scale(impl.tolerance, np.array([z])), 5e-4)  # the course rounds to 3 decimals
        assert_close(got[i : i + 1], value, f"GELU({z:g})", tol, "gelu([1, -3, 10, 0])")


@invariant(
    requires=("gelu",),
    hint="a tanh-form constant is wrong: it is √(2/π) (not √(π/2)) and 0.044715 (not 0.44715), or erf's argument is not x/√2",
)
def gelu_close_to_erf_form(impl, case):
    """gelu(x) is within 4.8e-4 (plus the dtype tolerance relative to max|x|) of the exact GELU x·Φ(x), so either form passes."""
    x = case.draw(activation_inputs(), "x")
    call = "gelu(x) vs 0.5·x·(1 + erf(x/√2))"
    got = assert_shape(impl.gelu(x), x.shape, "gelu(x)", call)
    seen = impl.as_seen(x)
    assert_close(got, ref.gelu_erf(seen), "gelu(x)", _widened(_at_input_scale(impl.tolerance, seen), TANH_VS_ERF), call)


@invariant(
    requires=("gelu",),
    hint="gelu is neither the tanh form 0.5·x·(1 + tanh(√(2/π)·(x + 0.044715·x³))) nor the erf form 0.5·x·(1 + erf(x/√2)) "
         "computed in full, or it is the other form than the one GELU_FORM declares",
)
def gelu_agrees_with_reference(impl, case):
    """gelu agrees with the float64 tanh form (the reference) or erf form: to 1e-10 in float64, the dtype tolerance otherwise, relative to max|x|.

    An implementation uses one form throughout, so the whole array is held to one form: the one
    GELU_FORM declares, else the closer one.
    """
    x = case.draw(activation_inputs(), "x")
    call = "gelu(x)"
    got = assert_shape(impl.gelu(x), x.shape, "gelu(x)", call)
    seen = impl.as_seen(x)
    forms = {form: ref.gelu_of(form)(seen) for form in gelu_forms(impl)}
    tol = _at_input_scale(agreement_tolerance(rounding_dtype(impl)), seen)
    assert_close_to_a_gelu_form(impl, got, forms, "gelu(x)", tol, call, other_answer=lambda form: ref.gelu_of(form)(seen))
