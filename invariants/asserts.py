"""Named assertions whose failures are data: what was checked, on which call, got, expected, and the figures of the miss.

A cheap vectorised test comes first; the per-element figures (mismatch count and share, the worst index,
actual vs expected there, max abs and rel error, the tolerance, the error in float32 roundings) are computed
only when it fails. Each helper raises InvariantViolation, an AssertionError whose `measured` holds those
fields and whose message is rendered from them once (render_violation: `<what>=<got>, but should be
<expected> [<call>]` and a line per figure). The runner decorates it with the invariant's statement, the
example and the hint; every reader of a figure reads `measured`, never the message.
"""

from __future__ import annotations

import numpy as np

from invariants.answers import FLOATS, TEXT, Either

FLOAT32_EPS = float(np.finfo(np.float32).eps)
FIELDS = ("check", "what", "got", "expected", "call", "requirement", "mismatched", "violating", "size", "worst_index", "worst_got",
          "worst_expected", "max_abs_error", "max_rel_error", "float32_units", "atol", "rtol", "dtype", "first_index", "options")  # the assertions'


class InvariantViolation(AssertionError):
    """An implementation broke an invariant; `measured` holds what was checked and the figures as data (JSON-ready), the message is their text.

    measured: "check" (type, shape, dtype, finite, exact, close, condition, value, form), "what", "got", "expected", "call";
    for a value comparison "mismatched", "size", "worst_index", "worst_got", "worst_expected", "max_abs_error", "max_rel_error",
    "float32_units" (the largest error in float32 roundings of the expected values' scale) and for "close" "atol", "rtol",
    "dtype"; what a law adds about its counterexample ("keys_seen", "window", "position", "first_position", ...).
    """

    def __init__(self, message="", **measured):
        super().__init__(message or render_violation(measured))
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


def render_violation(measured):
    """The message of a violation, from its fields: the one place their wording lives."""
    suffix = f" [{measured['call']}]" if measured.get("call") else ""
    lines = [f"{measured.get('what', 'value')}={measured.get('got', '?')}, but should be {measured.get('expected', '?')}{suffix}"]
    if "worst_index" in measured:
        n, size = measured["mismatched"], measured["size"]
        lines += [f"  mismatched {n} of {size} elements ({100 * n / max(size, 1):.1f}%); {measured['requirement']}", f"  {render_worst(measured)}",
                  f"  max abs error {_figure(measured['max_abs_error'], 3)}, max rel error {_figure(measured['max_rel_error'], 3)}"]
    elif "violating" in measured:
        n, size = measured["violating"], measured["size"]
        share = "are not finite" if measured.get("check") == "finite" else f"violate it ({100 * n / max(size, 1):.1f}%)"
        lines.append(f"  {n} of {size} elements {share}")
    lines += [f"  {render_violation(option)}".replace("\n", "\n  ") for option in measured.get("options", ())]
    counterexample = {key: value for key, value in measured.items() if key not in FIELDS}
    if counterexample:
        lines.append("  measured: " + ", ".join(f"{key}={value}" for key, value in counterexample.items()))
    return "\n".join(lines)


def _figure(value, digits=9):
    """A measured number as a failure shows it; "nan", "inf" and "-inf" as the runner's JSON-ready figures name them."""
    return f"{float(value):.{digits}g}" if isinstance(value, (int, float, np.number)) else str(value)


def render_worst(measured):
    """The worst element of a value comparison, in words ('' for a violation without one)."""
    if "worst_index" not in measured:
        return ""
    return f"worst at index {tuple(measured['worst_index'])}: got {_figure(measured['worst_got'])}, expected {_figure(measured['worst_expected'])}"


def _fail(what, got, expected, call, **measured):
    raise InvariantViolation(**measured, what=what, got=got, expected=expected, call=call)


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
            check="finite", violating=int(bad.sum()), size=int(actual.size),
        )
    return actual


def _mismatch(actual, expected, mismatched, requirement):
    """The figures of a value comparison that failed: how many elements missed, the worst one, the largest errors."""
    a = actual.astype(np.float64, copy=False)
    e = np.broadcast_to(np.asarray(expected, dtype=np.float64), a.shape)
    with np.errstate(over="ignore", invalid="ignore"):  # an error over a zero expected value is inf; inf - inf is NaN: both reported
        abs_err = np.abs(a - e)
        rel_err = abs_err / np.maximum(np.abs(e), np.finfo(np.float64).tiny)
    score = np.where(np.isnan(abs_err), np.inf, abs_err)  # a NaN is the worst mismatch of all
    worst = int(np.argmax(np.where(mismatched, score, -1.0)))
    finite = np.isfinite(abs_err)
    max_abs = float(abs_err[finite].max()) if finite.any() else float("nan")
    scale = float(np.abs(e[np.isfinite(e)]).max(initial=0.0))
    with np.errstate(over="ignore"):  # an error against an expected value of zero is inf float32 roundings
        float32_units = float(np.float64(max_abs) / (FLOAT32_EPS * max(scale, np.finfo(np.float64).tiny))) if finite.all() else float("inf")
    return {"requirement": requirement, "mismatched": int(mismatched.sum()), "size": int(a.size), "worst_index": list(_index(worst, a.shape)),
            "worst_got": float(a.flat[worst]), "worst_expected": float(e.flat[worst]), "max_abs_error": max_abs,
            "max_rel_error": float(rel_err[finite].max()) if finite.any() else float("nan"),
            "float32_units": float32_units}


def assert_equal(actual, expected, what, call=None):
    """actual == expected elementwise, exactly (-0.0 == +0.0; NaN never equals anything)."""
    __tracebackhide__ = True
    actual = as_array(actual, what, call)
    expected = _comparable(actual, expected, what, call)
    if np.array_equal(actual, np.broadcast_to(expected, actual.shape)):
        return
    mismatched = ~(actual == expected)
    _fail(what, "different values", "exactly equal (bitwise, == per element)", call, check="exact",
          **_mismatch(actual, expected, mismatched, "exact equality required"))


def assert_close(actual, expected, what, tol, call=None, **measured):
    """|actual - expected| <= tol.atol + tol.rtol·|expected| elementwise (a Tolerance); NaN fails. `measured`: what the law adds."""
    __tracebackhide__ = True
    actual = as_array(actual, what, call)
    expected = _comparable(actual, expected, what, call)
    a, e = actual.astype(np.float64), expected.astype(np.float64)
    ok = tol.allows(a, e)
    if ok.all():
        return
    _fail(what, "values out of tolerance", f"close to the expected values within {tol}", call, check="close", atol=float(tol.atol),
          rtol=float(tol.rtol), dtype=tol.dtype, **_mismatch(a, e, ~ok, f"tolerance {tol}"), **measured)


def assert_where(condition, actual, what, expected, call=None, **measured):
    """condition (a boolean array over actual) holds everywhere; `expected` describes it, e.g. '>= 0'. `measured`: what the law adds."""
    __tracebackhide__ = True
    actual = as_array(actual, what, call)
    condition = np.broadcast_to(np.asarray(condition, dtype=bool), actual.shape)
    if condition.all():
        return
    bad = ~condition
    first = int(np.flatnonzero(bad)[0])
    index = _index(first, actual.shape)
    _fail(_at(what, index), _fmt(actual.flat[first]), expected, call, check="condition", violating=int(bad.sum()), size=int(actual.size),
          first_index=list(index), **measured)


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
        options = []
        for option in form.forms:
            try:
                return assert_form(actual, option, what)
            except InvariantViolation as exc:
                options.append(exc.measured)
        _fail(what, "none of its forms", "one of them", call, check="form", options=options)
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
