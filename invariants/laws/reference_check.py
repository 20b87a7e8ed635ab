"""Agreement with the float64 numpy reference: the check that pins conventions no law can
(the 1/√d_head scale, the GELU form, the tie rule), and the numpy–torch and CPU–CUDA matrix.

The reference follows what the implementation declares (invariants/conventions.py): its
LayerNorm eps, and its GELU form. Both GELU forms are correct; an implementation that declares
no GELU_FORM is held to either form's reference over the whole call (one form for the whole
block or model, never element by element, so code that mixes the forms still fails), and one
that declares a form is held to that form alone.
"""

from __future__ import annotations

import numpy as np

import invariants.reference.numpy as ref
from invariants.asserts import as_array, assert_close
from invariants.conventions import declared, rounding_dtype
from invariants.strategies.norms import quiet_rows
from invariants.tolerance import agreement_tolerance


def gelu_forms(impl):
    """The GELU forms impl's answers may follow: the one its GELU_FORM declares, else both ("tanh", "erf")."""
    form = declared(impl, "GELU_FORM")
    return ref.GELU_FORMS if form is None else (form,)


def reference_answer(impl, name, *args, **options):
    """The reference's float64 answer on exactly the values the implementation receives; options go to the reference (gelu_form, eps)."""
    return getattr(ref, name)(*impl.as_seen(args), **options)


def reference_answers(impl, name, *args, **options):
    """{form: the reference's answer computed with that GELU form}, for each form in gelu_forms(impl)."""
    return {form: reference_answer(impl, name, *args, gelu_form=form, **options) for form in gelu_forms(impl)}


def assert_close_to_a_gelu_form(impl, got, answers, what, tol, call, *, other_answer=None):
    """got is within tol of answers[form] for one form, over the whole array; else it fails against the closest.

    answers: {form: expected} (reference_answers). other_answer(form) gives the answer in a form impl
    does not declare; where given and got matches it, the report says the declaration looks wrong.
    """
    __tracebackhide__ = True
    got = as_array(got, what, call)
    if all(np.shape(expected) == got.shape for expected in answers.values()):
        values = got.astype(np.float64)
        if any(tol.allows(values, expected).all() for expected in answers.values()):
            return
        closest = min(answers, key=lambda form: np.nanmax(np.abs(values - answers[form]), initial=0.0))
    else:
        closest = next(iter(answers))  # assert_close reports the shape
    if len(answers) > 1:
        note = f"held to the {closest}-form GELU, the closer one: either form passes, one form for the whole call"
    else:
        note = f"held to the {closest}-form GELU that {impl.label} declares (GELU_FORM = {closest!r})"
        others = [form for form in ref.GELU_FORMS if form != closest]
        if other_answer is not None and got.shape == np.shape(answers[closest]):
            for form in others:
                if tol.allows(got.astype(np.float64), other_answer(form)).all():
                    note += f"; it agrees with the {form} form instead: is GELU_FORM declared wrongly?"
    assert_close(got, answers[closest], f"{what} ({note})", tol, call)


def at_quiet_rows(x, got, answers):
    """(got, answers) at the rows of x (..., d) below 256 where loud ones (strategies.norms.loud_rows) stand beside them, else None.

    A 16-bit comparison is norm-wise, at the whole answer's largest value: a loud row's would hide errors of unit size in
    the others (a key or value from a loud row's norm gone wrong), so a check holds them again at their own scale.
    answers: {name: expected}, or a function of no arguments giving them (computed only where loud rows are).
    """
    quiet = quiet_rows(x)  # (...)
    if not quiet.any() or quiet.all():
        return None
    answers = answers() if callable(answers) else answers
    return np.asarray(got)[quiet], {name: np.asarray(a)[quiet] for name, a in answers.items()}


def reference_tolerance(impl, *, factor=1.0, condition=1.0):
    """The tolerance assert_agrees_with_reference holds impl's answers to, read from the rounding they carry (rounding_dtype):
    factor and condition grow it below float64 rounding only.

    condition: a number, or a function of no arguments giving it (a forward pass: computed only where it is used).
    """
    tol = agreement_tolerance(rounding_dtype(impl))
    if tol.dtype == "float64":
        return tol
    return tol.scaled(factor).conditioned(condition() if callable(condition) else condition)


def assert_agrees_with_reference(impl, name, args, got, what, *, factor=1.0, condition=1.0, call=None, options=None, gelu=False):
    """got (impl's answer to name(*args)) is within the agreement tolerance of the reference's.

    factor scales the tolerance for dtypes below float64 in checks that compose many roundings, and
    condition (a layer_norm_condition) grows it further for ill-conditioned inputs (Tolerance.conditioned);
    float64 always uses the fixed 1e-10 of the course's numpy–torch agreement check. options go to the
    reference (e.g. eps); gelu=True marks a function built on GELU, compared with each form
    gelu_forms(impl) allows (see assert_close_to_a_gelu_form).
    """
    __tracebackhide__ = True
    options = options or {}
    tol = reference_tolerance(impl, factor=factor, condition=condition)
    if not gelu:
        assert_close(got, reference_answer(impl, name, *args, **options), what, tol, call)
        return
    answers = reference_answers(impl, name, *args, **options)
    assert_close_to_a_gelu_form(impl, got, answers, what, tol, call,
                                other_answer=lambda form: reference_answer(impl, name, *args, gelu_form=form, **options))
