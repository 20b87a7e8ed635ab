"""Named assertions with one grammar for failures: `<what>=<got>, but should be <expected> [<call>]`.

A cheap vectorised test comes first; the per-element detail (mismatch count and share, the
worst index, actual vs expected there, max abs and rel error, the tolerance) is computed only
when it fails. Each helper raises InvariantViolation, an AssertionError the runner decorates
with the invariant's statement, the example and the hint.
"""

from __future__ import annotations

import numpy as np

from invariants.answers import FLOATS, TEXT, Either


class InvariantViolation(AssertionError):
    """An implementation broke an invariant; the message says what, where and by how much, and `measured` holds the figures as data.

    measured: "check" (which assertion: type, shape, dtype, finite, exact, close, condition, value, form), for "close" its
    "atol" and "rtol", and what a law adds (rope's "float32_sized"). A reader that needs a figure reads it here, never the message.
    """

    def __init__(self, message="", **measured):
        super().__init__(message)
        self.measured = measured


def _fmt(value):
    if isinstance(value, np.ndarray) and value.ndim == 0:
        value = value.item()
    if isinstance(value, (float, np.floating)):
        return f"{float(value):.9g}"
    if isinstance(value, np.integer):
        return str(int(value))
    return repr(value)


def _index(flat_index, shape):
    return tuple(int(i) for i in np.unravel_index(flat_index, shape)) if shape else ()


def _at(what, index):
    """what[i, j], or just what for a 0-d array."""
    return f"{what}[{', '.join(map(str, index))}]" if index else what


def _fail(what, got, expected, call, details=(), **measured):
    suffix = f" [{call}]" if call else ""
    lines = [f"{what}={got}, but should be {expected}{suffix}", *details]
    raise InvariantViolation("\n".join(lines), **measured)


def as_array(value, what, call=None):
    """value as a numpy array; a tuple, dict or string where an array belongs is a violation."""
    __tracebackhide__ = True
    if isinstance(value, np.ndarray):
        return value
    _fail(f"type of {what}", type(value).__name__, "an array", call, check="type")


def _comparable(actual, expected, what, call):
    """expected as an array that broadcasts to actual's shape, else a shape violation; NaN on either side is named first."""
    __tracebackhide__ = True
    expected = np.asarray(expected)
    if actual.dtype.kind in "fc" and np.isnan(actual).any():
        assert_finite(actual, what, call)
    if expected.dtype.kind in "fc" and np.isnan(expected).any():
        assert_finite(expected, f"the value {what} is compared with", call)
    try:
        fits = np.broadcast_shapes(actual.shape, expected.shape) == actual.shape
    except ValueError:
        fits = False
    if not fits:
        _fail(f"shape of {what}", tuple(actual.shape), tuple(expected.shape), call, check="shape")
    return expected


def assert_shape(actual, shape, what, call=None):
    """actual is an array of exactly `shape`."""
    __tracebackhide__ = True
    actual = as_array(actual, what, call)
    if tuple(actual.shape) != tuple(shape):
        _fail(f"shape of {what}", tuple(actual.shape), tuple(shape), call, check="shape")
    return actual


def assert_dtype(actual, expected, what, call=None, *, why=None):
    """actual is an array of exactly dtype `expected` (a numpy dtype or its name); `why` says where that dtype comes from."""
    __tracebackhide__ = True
    actual = as_array(actual, what, call)
    expected = np.dtype(expected)
    if actual.dtype != expected:
        _fail(f"dtype of {what}", actual.dtype.name, f"{expected.name} ({why})" if why else expected.name, call, check="dtype")
    return actual


def assert_finite(actual, what, call=None):
    """Every element of actual is finite (no NaN, no ±inf)."""
    __tracebackhide__ = True
    actual = as_array(actual, what, call)
    bad = ~np.isfinite(actual)
    if bad.any():
        first = int(np.flatnonzero(bad)[0])
        _fail(
            _at(what, _index(first, actual.shape)),
            _fmt(actual.flat[first]),
            "finite",
            call,
            [f"  {int(bad.sum())} of {actual.size} elements are not finite"],
            check="finite",
        )
    return actual


def _mismatch_details(actual, expected, mismatched, requirement):
    a = actual.astype(np.float64, copy=False)
    e = np.broadcast_to(np.asarray(expected, dtype=np.float64), a.shape)
    with np.errstate(over="ignore", invalid="ignore"):  # an error over a zero expected value is inf; inf - inf is NaN: both reported
        abs_err = np.abs(a - e)
        rel_err = abs_err / np.maximum(np.abs(e), np.finfo(np.float64).tiny)
    score = np.where(np.isnan(abs_err), np.inf, abs_err)  # a NaN is the worst mismatch of all
    worst = int(np.argmax(np.where(mismatched, score, -1.0)))
    n_bad = int(mismatched.sum())
    finite = np.isfinite(abs_err)
    max_abs = float(abs_err[finite].max()) if finite.any() else float("nan")
    max_rel = float(rel_err[finite].max()) if finite.any() else float("nan")
    index = _index(worst, a.shape)
    return [
        f"  mismatched {n_bad} of {a.size} elements ({100 * n_bad / max(a.size, 1):.1f}%); {requirement}",
        f"  worst at index {index}: got {_fmt(a.flat[worst])}, expected {_fmt(e.flat[worst])}",
        f"  max abs error {max_abs:.3g}, max rel error {max_rel:.3g}",
    ]


def assert_equal(actual, expected, what, call=None):
    """actual == expected elementwise, exactly (-0.0 == +0.0; NaN never equals anything)."""
    __tracebackhide__ = True
    actual = as_array(actual, what, call)
    expected = _comparable(actual, expected, what, call)
    if np.array_equal(actual, np.broadcast_to(expected, actual.shape)):
        return
    mismatched = ~(actual == expected)
    _fail(what, "different values", "exactly equal (bitwise, == per element)", call,
          _mismatch_details(actual, expected, mismatched, "exact equality required"), check="exact")


def assert_close(actual, expected, what, tol, call=None, **measured):
    """|actual - expected| <= tol.atol + tol.rtol·|expected| elementwise (a Tolerance); NaN fails. `measured`: what the law adds."""
    __tracebackhide__ = True
    actual = as_array(actual, what, call)
    expected = _comparable(actual, expected, what, call)
    a, e = actual.astype(np.float64), expected.astype(np.float64)
    ok = tol.allows(a, e)
    if ok.all():
        return
    _fail(what, "values out of tolerance", f"close to the expected values within {tol}", call,
          _mismatch_details(a, e, ~ok, f"tolerance {tol}"), check="close", atol=float(tol.atol), rtol=float(tol.rtol), **measured)


def assert_where(condition, actual, what, expected, call=None):
    """condition (a boolean array over actual) holds everywhere; `expected` describes it, e.g. '>= 0'."""
    __tracebackhide__ = True
    actual = as_array(actual, what, call)
    condition = np.broadcast_to(np.asarray(condition, dtype=bool), actual.shape)
    if condition.all():
        return
    bad = ~condition
    first = int(np.flatnonzero(bad)[0])
    index = _index(first, actual.shape)
    _fail(_at(what, index), _fmt(actual.flat[first]), expected, call,
          [f"  {int(bad.sum())} of {actual.size} elements violate it ({100 * bad.sum() / actual.size:.1f}%)"], check="condition")


def assert_value(actual, expected, what, call=None):
    """A scalar answer (a count, a string, a verdict) equals the expected one exactly."""
    __tracebackhide__ = True
    got = actual.item() if isinstance(actual, np.ndarray) and actual.ndim == 0 else actual
    if got != expected:
        _fail(what, _fmt(got), _fmt(expected), call, check="value")


def assert_form(actual, form, what, call=None):
    """actual has `form` (invariants.answers): a str for TEXT, any fitting form of an Either, else an array of its shape and dtype kind."""
    __tracebackhide__ = True
    if isinstance(form, Either):
        problems = []
        for option in form.forms:
            try:
                return assert_form(actual, option, what)
            except InvariantViolation as exc:
                problems.append(str(exc))
        _fail(what, "none of its forms", "one of them", call, [f"  {p}" for p in problems], check="form")
    if form == TEXT:
        if not isinstance(actual, str):
            _fail(f"type of {what}", type(actual).__name__, "str", call, check="type")
        return actual
    if form.shape is None and isinstance(actual, (bool, int, float, np.number, np.bool_)):  # a scalar as a Python or numpy number
        return actual
    actual = as_array(actual, what, call)
    if actual.dtype.kind not in form.kinds:
        _fail(f"dtype of {what}", actual.dtype.name, "a float dtype" if form.kinds == FLOATS else "a real number dtype", call, check="dtype")
    if not form.fits_shape(actual.shape):
        _fail(f"shape of {what}", tuple(actual.shape), "a scalar" if form.shape is None else form.shape_text(), call, check="shape")
    return actual
