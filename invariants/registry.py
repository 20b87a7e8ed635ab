"""The registry of invariants: one entry per property, declared where its check is written.

    @invariant(requires=("attention",), hint="the mask is applied after the softmax ...")
    def causal_non_leakage(impl, case):
        '''Changing tokens at positions >= j leaves attention outputs at positions < j exactly equal.'''
        ...

The docstring's first sentence is the statement a student reads; the hint names the likely
bug. `case.draw(strategy, label)` draws inputs (labelled in the failure report); `impl`
is an invariants.protocol.Implementation. An Invariant is callable as inv(impl, case), so it
can be used inside anyone's own hypothesis test.
"""

from __future__ import annotations

import ast
import importlib
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from invariants.failure_text import IMPLEMENTATION_FAILURES, describe_case, format_failure

# How a component module declares itself, at the top level of its source: LESSON = <number>, HOLDS = (<names>,).
_DECLARATIONS = {"LESSON": re.compile(r"^LESSON = ([0-9.]+)", re.MULTILINE), "HOLDS": re.compile(r"^HOLDS = (\([^)]*\))", re.MULTILINE)}


def discover_components(folder=Path(__file__).parent / "laws"):
    """{component: the protocol functions whose laws it holds}, in lesson order: every module of this package that declares
    HOLDS (a tuple of protocol function names) and LESSON (a number: where a lesson meets it), read from its source without
    importing it (component modules import this one)."""
    found = []
    for path in sorted(Path(folder).glob("*.py")):
        text = path.read_text(encoding="utf-8")
        declared = {name: pattern.search(text) for name, pattern in _DECLARATIONS.items()}
        if not any(declared.values()):
            continue
        if not all(declared.values()):
            raise ValueError(f"component module invariants/laws/{path.name} must declare both HOLDS and LESSON at its top level")
        lesson, holds = (ast.literal_eval(declared[name].group(1)) for name in ("LESSON", "HOLDS"))
        found.append((lesson, path.stem, tuple(holds)))
    lessons = [lesson for lesson, _, _ in found]
    if len(set(lessons)) != len(lessons):
        raise ValueError(f"two component modules declare the same LESSON: {sorted(lessons)}")
    return {component: holds for _, component, holds in sorted(found)}


# One module per component, in the order a lesson meets them, with the protocol functions whose laws it holds
# (invariants.diagnosis reads what each builds on from their entries); dtypes holds a law over every entry.
COMPONENTS = discover_components()

REGISTRY: dict = {}


@dataclass(frozen=True)
class Invariant:
    """A property every correct implementation has, and the bug its failure points to."""

    name: str  # "<component>.<property>", e.g. "attention.causal_non_leakage"
    component: str
    statement: str  # one sentence
    hint: str  # the likely bug when it fails
    requires: tuple  # protocol functions it calls
    backends: tuple  # backends it applies to ("torch" only for autograd checks)
    in_process: bool  # needs the implementation's own callables (autograd, training), not just answers
    check: Callable = field(repr=False)
    applies: Callable = field(default=None, repr=False)  # impl -> a reason it does not apply, or None

    def __call__(self, impl, case):
        """Run the check on one case; a failure raises with the whole report (statement, implementation, example, problem, hint) as its note,
        for a check called from anyone's own hypothesis test (the runner calls `check` and words the report once, for the shrunk case)."""
        try:
            return self.check(impl, case)
        except IMPLEMENTATION_FAILURES as exc:
            exc.__notes__ = [*getattr(exc, "__notes__", ()), format_failure(self, impl, exc, describe_case(case, impl.dtype))]
            raise

    def skip_reason(self, impl):
        """Why this invariant cannot run on impl (missing functions, another backend), or None."""
        if impl.backend not in self.backends:
            return f"{self.name} needs the {' or '.join(self.backends)} backend (this run is {impl.backend})"
        if self.in_process and not impl.in_process:
            return f"{self.name} needs the implementation's own callables (autograd); {impl.label} answers from another process"
        return impl.missing(self.requires) or (self.applies(impl) if self.applies else None)


def invariant(*, requires, hint, backends=("numpy", "torch"), in_process=False, applies=None):
    """Register the decorated check(impl, case) as an Invariant named after its module and function.

    in_process=True marks checks that call impl.raw(name) (autograd through the implementation).
    applies(impl) returns a reason the invariant does not apply (a dtype it is ill-posed in, a
    convention the implementation declares), or None; the run is then skipped with that reason.
    """

    def register(check):
        component = check.__module__.rsplit(".", 1)[-1]
        doc = (check.__doc__ or "").strip()
        if not doc or not hint:
            raise ValueError(f"invariant {check.__name__} needs a one-sentence docstring and a hint")
        statement = " ".join(doc.split("\n\n")[0].split())
        inv = Invariant(f"{component}.{check.__name__}", component, statement, hint, tuple(requires), tuple(backends), in_process, check, applies)
        if inv.name in REGISTRY:
            raise ValueError(f"invariant {inv.name} is registered twice")
        REGISTRY[inv.name] = inv
        return inv

    return register


def all_invariants():
    """Every registered invariant, component by component (importing the component modules)."""
    for component in COMPONENTS:
        importlib.import_module(f"invariants.laws.{component}")
    order = {component: i for i, component in enumerate(COMPONENTS)}
    return sorted(REGISTRY.values(), key=lambda inv: order[inv.component])
