"""Declared conventions: module-level constants with which an implementation says how it differs from the reference without being wrong.

    TOP_K_TIES = "any"          # in the implementation's module (or adapter class)

A declaration picks which reference applies or which invariants run; it never loosens a
tolerance or turns a false law true. An invariant skipped because of a declaration says so
with a `Declared` reason, and the run's summary counts those skips apart.
"""

from __future__ import annotations

from dataclasses import dataclass


class Declared(str):
    """A skip reason that comes from a declared convention (counted apart in the summary)."""


@dataclass(frozen=True)
class Convention:
    """One declarable constant: its allowed values, the value assumed when it is absent, and what it changes."""

    name: str
    allowed: tuple  # the allowed values
    default: object
    changes: str  # one sentence: which invariants or strategies it changes

    def problem(self, value):
        """Why `value` cannot be declared for this convention, or None."""
        if any(value == a and type(value) is type(a) for a in self.allowed):
            return None
        return f"{self.name} = {value!r} is not allowed: expected {' or '.join(map(repr, self.allowed))}"


CONVENTIONS = {
    c.name: c
    for c in (
        Convention("TOP_K_TIES", ("lower", "any"), "lower",
                   "'any': the tie-rule invariant is skipped and the gates are checked against any valid top-k set"),
    )
}


def read_declarations(namespace):
    """{name: value} for every convention `namespace` declares; ValueError naming the first bad value."""
    found = {}
    for name, convention in CONVENTIONS.items():
        if hasattr(namespace, name):
            value = getattr(namespace, name)
            problem = convention.problem(value)
            if problem:
                raise ValueError(problem)
            found[name] = value
    return found


def declared(impl, name):
    """The value `impl` declares for convention `name`, or the convention's default."""
    return impl.declarations.get(name, CONVENTIONS[name].default)
