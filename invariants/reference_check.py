"""Agreement with the float64 numpy reference: the check that pins conventions no law can
(the 1/√d_head scale, the tanh GELU, the tie rule), and the numpy–torch and CPU–CUDA matrix."""

from __future__ import annotations

import reference.numpy as ref
from invariants.asserts import assert_close
from invariants.tolerance import agreement_tolerance


def reference_answer(impl, name, *args):
    """The reference's float64 answer on exactly the values the implementation receives."""
    return getattr(ref, name)(*impl.as_seen(args))


def assert_agrees_with_reference(impl, name, args, got, what, *, factor=1.0, condition=1.0, call=None):
    """got (impl's answer to name(*args)) is within the agreement tolerance of the reference's.

    factor scales the tolerance for dtypes below float64 in checks that compose many roundings, and
    condition (a layer_norm_condition) grows it further for ill-conditioned inputs (Tolerance.conditioned);
    float64 always uses the fixed 1e-10 of the course's numpy–torch agreement check.
    """
    __tracebackhide__ = True
    expected = reference_answer(impl, name, *args)
    tol = agreement_tolerance(impl.dtype)
    if impl.dtype != "float64":
        tol = tol.scaled(factor).conditioned(condition)
    assert_close(got, expected, what, tol, call)
