"""Answers that round like the reference: a submission that runs the reference's code answers, bit for bit, as the reference does.

Source similarity (invariants.gate.similarity) reads the code, so a copy of the reference that
is compressed, encoded and executed at import shows none. Its answers cannot hide it: on the
calls the run recorded (invariants.gate.degenerate.CallLog), the gate evaluates the reference
twice, as written and in extended precision (numpy's longdouble, rounded back to the reference's
dtype). Where the two differ in any bit the call is discriminating: its bits carry the order in
which the code rounds, not just the mathematics. The evidence is the share of the discriminating
calls on which the submission's answer is the reference's to the bit, per function and overall,
and `flag` when that share reaches FLAG_SHARE over at least MIN_CALLS of them.

It is evidence for staff, never a verdict, and it shows rounding, not copying: the reference rounds
its softmax and LayerNorm unlike textbook code (times a reciprocal), so independent solutions answer
a third to a half of these calls to the bit and a copy all of them (docs/gate.md, "Answers that round
like the reference", has the measured rates). It costs nothing to evade (one ulp of noise). Where longdouble
is no wider than float64 (Windows, macOS on ARM) no call is discriminating and nothing is flagged.
"""

from __future__ import annotations

import numpy as np

from invariants.gate.degenerate import CHECKED

FLAG_SHARE = 0.95  # copies answer every discriminating call to the bit; independent code measured 0% to 67% (docs/gate.md)
MIN_CALLS = 30  # discriminating calls before a share is flagged (a full P01 run has 54 to 80 among the calls judged)
PER_FUNCTION = 24  # recorded calls judged per function: the reference runs twice on each, once without BLAS


def _floats(value):
    """The floating-point arrays of an answer or of arguments, in order, in their own dtype (tuples, lists, dicts flattened)."""
    if isinstance(value, dict):
        return [a for key in sorted(value) for a in _floats(value[key])]
    if isinstance(value, (list, tuple)):
        return [a for item in value for a in _floats(item)]
    if isinstance(value, np.ndarray) and value.dtype.kind == "f":
        return [value]
    return [np.asarray(value)] if isinstance(value, (float, np.floating)) else []  # a loss: the reference answers a numpy scalar


def _widened(value):
    """The arguments with every float array in longdouble: the same mathematics, rounded less."""
    if isinstance(value, dict):
        return {k: _widened(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(_widened(v) for v in value)
    return value.astype(np.longdouble) if isinstance(value, np.ndarray) and value.dtype.kind == "f" else value


def _same_bits(got, expected):
    """Is each array of got (attention may leave out its weights) expected's, in the same dtype and shape, value for value?"""
    return bool(got) and len(got) <= len(expected) and all(
        a.dtype == b.dtype and a.shape == b.shape and np.array_equal(a, b, equal_nan=True) for a, b in zip(got, expected, strict=False))


def _floats_of(version, args):
    try:
        return _floats(version(args))
    except Exception:  # noqa: BLE001 - a call the reference refuses says nothing
        return None


def judge_call(versions, args, answer):
    """(discriminating, bit for bit): does the reference round this call otherwise in extended precision, and is the answer its bits?

    The version is the one (GELU form, eps, ...) whose bits the answer has, else the first.
    """
    got = _floats(answer)
    answers = [(version, expected) for version in versions if (expected := _floats_of(version, args))]
    if not got or not answers:
        return False, False
    version, expected = next(((v, e) for v, e in answers if _same_bits(got, e)), answers[0])
    wide = _floats_of(version, _widened(args))
    if wide is None or len(wide) != len(expected):
        return False, False
    discriminating = not _same_bits([w.astype(e.dtype) for w, e in zip(wide, expected, strict=True)], expected)
    return discriminating, discriminating and _same_bits(got, expected)


def evidence(log):
    """{discriminating, bitwise_equal, share, flag, flag_share, min_calls, functions: {name: {calls, discriminating, bitwise_equal}}}.

    log: the run's invariants.gate.degenerate.CallLog; it asks the submission nothing.
    """
    functions = {}
    for name in CHECKED:
        calls = log.calls(name)[:PER_FUNCTION]
        if not calls:
            continue
        versions = log.versions(name)
        judged = [judge_call(versions, args, answer) for args, answer in calls]
        functions[name] = {"calls": len(calls), "discriminating": sum(d for d, _ in judged), "bitwise_equal": sum(b for _, b in judged)}
    discriminating = sum(f["discriminating"] for f in functions.values())
    equal = sum(f["bitwise_equal"] for f in functions.values())
    share = round(equal / discriminating, 3) if discriminating else None
    return {"discriminating": discriminating, "bitwise_equal": equal, "share": share,
            "flag": discriminating >= MIN_CALLS and share >= FLAG_SHARE, "flag_share": FLAG_SHARE, "min_calls": MIN_CALLS,
            "functions": functions}
