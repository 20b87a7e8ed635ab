"""Laws written once over the protocol table: one invariant per entry it applies to, drawn from the entry's valid inputs.

    KEEPS_DTYPE = per_entry(__name__, "keeps_dtype", assert_keeps_dtype, statement, hint)   # invariants.laws.dtypes

One invariant per function, so that a partial implementation skips exactly what it lacks and a failure names the
function; invariants.laws.dtypes, invariants.laws.shapes and invariants.laws.finite are written this way.
"""

from __future__ import annotations

from invariants.inputs import VALID_INPUTS
from invariants.protocol import FUNCTIONS
from invariants.registry import invariant


def per_entry(component, suffix, assert_law, statement, hint, applies=lambda entry: bool(entry.floating)):
    """{name: the invariant <component>.<name>_<suffix>} for every entry it applies to (by default those with floating answers).

    Each draws VALID_INPUTS[name] and calls assert_law(impl, name, args); statement(entry) is its one-sentence
    docstring and hint(entry) its hint. `component` is the module's __name__, which names the component.
    """

    def law(entry):
        def check(impl, case):
            assert_law(impl, entry.name, VALID_INPUTS[entry.name](impl, case))

        check.__name__ = check.__qualname__ = f"{entry.name}_{suffix}"
        check.__module__, check.__doc__ = component, statement(entry)
        return invariant(requires=(entry.name,), hint=hint(entry))(check)

    return {name: law(entry) for name, entry in FUNCTIONS.items() if applies(entry)}


def parts_named(entry, parts):
    """How a statement names an entry's answer: 'its answer' for a single part, else its `parts` joined ('out and weights')."""
    return "its answer" if len(entry.outputs) == 1 else " and ".join(parts)
