"""Invariants of finiteness: every floating answer to valid, moderate inputs is finite (no NaN, no ±inf).

One invariant per protocol function with floating answers, so that a partial implementation skips
exactly what it lacks and a failure names the function. It is well-posed on what the valid drawers
(invariants.inputs.VALID_INPUTS) draw: moderate values far from every dtype's overflow, eps as
declared, causal or windowed rows that always see their own key. A row that sees no key
(gqa_attention's padded keys) must be finite under every FULLY_MASKED_ROWS convention (zeros,
uniform, any finite values: never NaN), so no drawn case is excluded: a correct implementation
is finite on all of them, in every dtype.
"""

from __future__ import annotations

from invariants.asserts import assert_finite
from invariants.laws.table_laws import parts_named, per_entry
from invariants.protocol import FUNCTIONS

LESSON = 190  # after dtypes and shapes: the first failure of the zoo's earlier mutants stays where it was
HOLDS = ()  # every floating entry's finiteness law (invariants.protocol.FUNCTIONS)

HINT = ("{name} answered NaN or ±inf to moderate inputs: an exponential of unshifted scores (no max subtracted), a division "
        "by a zero sum or variance (eps missing or outside the root), -inf from a mask meeting -inf (inf - inf), or a 16-bit overflow")


def assert_answer_finite(impl, name, args):
    """Call impl.<name>(*args) and check that each floating part of the answer is finite."""
    __tracebackhide__ = True
    entry = FUNCTIONS[name]
    call, parts = entry.answered(impl, args)
    for label, part, value, _ in parts:
        if part in entry.floating:
            assert_finite(value, label, call)


ANSWER_FINITE = per_entry(
    __name__, "answer_finite", assert_answer_finite,
    statement=lambda entry: f"{entry.signature} returns {parts_named(entry, entry.floating)} finite on moderate valid inputs.",
    hint=lambda entry: HINT.format(name=entry.name))
