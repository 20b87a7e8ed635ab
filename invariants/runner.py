"""Run one invariant against one implementation under hypothesis, and word its failure.

pytest-free on purpose: the plugin, the gate and the mutation matrix all call run_invariant
and turn its three outcomes (return, InvariantSkipped, InvariantFailure) into their own.
"""

from __future__ import annotations

import time
import unittest

import numpy as np
from hypothesis import given
from hypothesis import seed as hypothesis_seed
from hypothesis import strategies as st

from invariants.asserts import InvariantViolation
from invariants.protocol import ImplementationError, OutputError

MAX_VALUES_SHOWN = 24  # arrays up to this many elements are printed whole in a failure


class InvariantSkipped(unittest.SkipTest):
    """The invariant does not apply to this implementation; the message says why.

    A SkipTest, so hypothesis re-raises it at once when a check raises it mid-search.
    """


class InvariantFailure(AssertionError):
    """The implementation broke the invariant (or could not be called); the message is the report."""

    def __init__(self, message, *, kind, examples_to_failure=None, seconds_to_failure=None):
        super().__init__(message)
        self.kind = kind  # "violation" (wrong answer) or "error" (raised, bad output type)
        self.examples_to_failure = examples_to_failure  # examples run up to the first failing one, inclusive
        self.seconds_to_failure = seconds_to_failure


class Case:
    """Draws an invariant's inputs and remembers them, labelled, for the failure report."""

    def __init__(self, draw):
        self._draw = draw
        self.drawn = {}

    def draw(self, strategy, label):
        value = self._draw(strategy, label=label)
        self.drawn[label] = value
        return value


def describe_value(value):
    """Shapes and dtypes first; small arrays in full."""
    if isinstance(value, np.ndarray):
        head = f"{value.dtype} {tuple(value.shape)}"
        if value.size <= MAX_VALUES_SHOWN:
            return f"{head} {np.array2string(value.ravel(), precision=6, separator=', ')}"
        return head
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k}: {describe_value(v)}" for k, v in value.items()) + "}"
    if isinstance(value, (list, tuple)) and any(isinstance(v, (np.ndarray, dict)) for v in value):
        return f"[{len(value)} × " + describe_value(value[0]) + "]" if value else "[]"
    return repr(value)


def describe_case(case):
    return [f"  {label}: {describe_value(value)}" for label, value in case.drawn.items()]


def format_failure(inv, impl, problem, case):
    lines = [
        f"{inv.name}: {inv.statement}",
        f"implementation: {impl!r}",
        "example (shrunk):",
        *(describe_case(case) if case is not None else ["  (none drawn)"]),
        str(problem),
        f"hint: {inv.hint}",
    ]
    return "\n".join(lines)


def run_invariant(inv, impl, *, settings=None, seed=None):
    """Search for a counterexample to `inv` on `impl`; raise InvariantSkipped or InvariantFailure, or return.

    `settings` is a hypothesis.settings object; the loaded profile is used when it is None.
    `seed` (an int) fixes hypothesis's randomness for this run (use with derandomize=False).
    Returns the number of examples run.
    """
    reason = inv.skip_reason(impl)
    if reason:
        raise InvariantSkipped(reason)
    examples = 0
    first_failure = None  # (examples, seconds) at the first failing example, before shrinking
    start = time.perf_counter()

    def body(data):
        nonlocal examples, first_failure
        examples += 1
        case = Case(data.draw)
        try:
            inv(impl, case)
        except (InvariantViolation, ImplementationError, OutputError) as exc:
            exc.case = case
            first_failure = first_failure or (examples, time.perf_counter() - start)
            raise

    body._hypothesis_internal_add_digest = inv.name.encode()  # one example-database key per invariant
    test = given(st.data())(body)
    if settings is not None:
        test = settings(test)
    if seed is not None:
        test = hypothesis_seed(seed)(test)
    try:
        test()
    except (InvariantViolation, ImplementationError, OutputError) as exc:
        message = _with_notes(format_failure(inv, impl, exc, getattr(exc, "case", None)), exc)
        kind = "violation" if isinstance(exc, InvariantViolation) else "error"
        at_examples, at_seconds = first_failure or (examples, time.perf_counter() - start)
        raise InvariantFailure(message, kind=kind, examples_to_failure=at_examples, seconds_to_failure=at_seconds) from None
    return examples


def _with_notes(message, exc):
    """Append hypothesis's own notes (the reproduce_failure blob), minus the repeated example."""
    notes = [n for n in getattr(exc, "__notes__", []) if "reproduce_failure" in n or n.startswith("You can")]
    return "\n".join([message, *notes])
