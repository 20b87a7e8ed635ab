"""A failure worded for a reader: the drawn example described (shapes first) and the whole report, from the fields.

    format_failure(inv, impl, problem, describe_case(case, impl.dtype))   # statement, implementation, example, problem, hint

Below the registry and the runner, which both word failures with it: Invariant.__call__ (a check called from anyone's
own hypothesis test) and the runner's Outcome.report. A renderer: what it gives is shown, never read back.
"""

from __future__ import annotations

import numpy as np

from invariants.asserts import InvariantViolation
from invariants.boundary import rounded
from invariants.protocol import ImplementationError, OutputError

MAX_VALUES_SHOWN = 24  # arrays up to this many elements are printed whole in a failure
IMPLEMENTATION_FAILURES = (InvariantViolation, ImplementationError, OutputError)  # what a check raises when the code is wrong


def describe_value(value, dtype=None):
    """Shapes and dtypes first; small arrays in full. dtype: the run's, for floating arrays drawn in float64 and shown as the
    implementation receives them (rounded to it, and named by it: bfloat16 too, which numpy holds in float32)."""
    if isinstance(value, np.ndarray):
        received = dtype is not None and value.dtype.kind == "f"
        shown = rounded(value, dtype) if received else value
        head = f"{dtype if received else value.dtype} {tuple(value.shape)}"
        if value.size <= MAX_VALUES_SHOWN:
            return f"{head} {np.array2string(shown.ravel(), precision=6, separator=', ')}"
        return head
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k}: {describe_value(v, dtype)}" for k, v in value.items()) + "}"
    if isinstance(value, (list, tuple)) and any(isinstance(v, (np.ndarray, dict)) for v in value):
        return f"[{len(value)} × " + describe_value(value[0], dtype) + "]" if value else "[]"
    return repr(value)


def describe_case(case, dtype=None):
    """((label, description), ...) for a Case, () for none; floating arrays as a run in `dtype` receives them (describe_value)."""
    return tuple((label, describe_value(value, dtype)) for label, value in case.drawn.items()) if case is not None else ()


def format_failure(inv, impl, problem, example, notes=()):
    """The failure report: statement, implementation, the example (shapes first), the problem, the hint, then notes."""
    lines = [
        f"{inv.name}: {inv.statement}",
        f"implementation: {impl!r}",
        "example (shrunk):",
        *([f"  {label}: {text}" for label, text in example] or ["  (none drawn)"]),
        str(problem),
        f"hint: {inv.hint}",
        *notes,
    ]
    return "\n".join(lines)
