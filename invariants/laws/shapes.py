"""Invariants of shapes: every answer has the shape and kind its arguments call for, as its protocol entry's answer_form states it.

One invariant per protocol function that answers arrays (floats, ids or counts: every one with valid inputs
to draw, invariants.inputs.VALID_INPUTS), so that a partial implementation skips exactly what it lacks and a
failure names the function. Each part of a tuple answer is held to its own form (llama_decode's
cache to either of its two), the weights left out where ATTENTION_WEIGHTS = False is declared.

Why it needs checking: the value laws compare answers that broadcast, so an output squeezed,
transposed or given an extra axis can slip past a comparison with a scalar or a row; the gate
holds a worker's declared answer to the same forms (invariants.gate.frames).
"""

from __future__ import annotations

from invariants.asserts import assert_form
from invariants.laws.table_laws import parts_named, per_entry
from invariants.protocol import FUNCTIONS

LESSON = 185  # after dtypes: the first failure of the zoo's earlier mutants stays where it was
HOLDS = ()  # the shape law of every entry that answers arrays (invariants.protocol.FUNCTIONS)

HINT = ("{name}'s answer has another shape or kind than its arguments call for: an axis squeezed (squeeze(), [0], a reduction "
        "without keepdims), axes transposed or merged (reshape instead of transpose), ints where floats belong, or a missing part")


def assert_answer_form(impl, name, args):
    """Call impl.<name>(*args) and check that each part of the answer has its entry's answer_form."""
    __tracebackhide__ = True
    call, parts = FUNCTIONS[name].answered(impl, args)
    for label, _, value, form in parts:
        assert_form(value, form, label, call)


ANSWER_SHAPE = per_entry(
    __name__, "answer_shape", assert_answer_form,
    statement=lambda entry: f"{entry.signature} returns {parts_named(entry, entry.outputs)} in the shape and dtype kind its arguments call for.",
    hint=lambda entry: HINT.format(name=entry.name), applies=lambda entry: entry.answers_arrays)
