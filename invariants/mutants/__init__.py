"""The mutant zoo: realistic bugs, each the reference with one function replaced.

    @mutant(replaces="layer_norm", killed_by="norms.layer_norm_known_values", bug="unbiased variance (divides by d - 1)")
    def unbiased_layer_norm(x, gain, bias, eps=1e-5):
        ...

registers the mutant "norms.unbiased_layer_norm" (zoo module, function name). Its
implementation is a fresh copy of reference.numpy (or reference.torch, backend="torch")
with that function swapped in, so everything built on it (the block, the model) inherits
the bug. `killed_by` is the invariant whose hint names the bug: the project's tests assert
that it fails on the mutant. A module that registers one is a zoo module: all_mutants() finds it
by listing this package (ZOO_MODULES), with no list to edit.
"""

from __future__ import annotations

import importlib
import importlib.util
import re
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from invariants.protocol import Implementation

# How a zoo module shows itself, at the top level of its source: a function registered with @mutant(...).
_REGISTERS = re.compile(r"^@mutant\(", re.MULTILINE)


def discover_zoo(folder=Path(__file__).parent):
    """The zoo's modules, sorted by name: every module of this package that registers a mutant with @mutant at its top level,
    read from its source without importing it. The catalogues kept apart (documented, reach) build their Mutants directly,
    and the tools (matrix, course_checks) register none, so none of them is in the zoo."""
    return tuple(path.stem for path in sorted(Path(folder).glob("*.py")) if _REGISTERS.search(path.read_text(encoding="utf-8")))


ZOO_MODULES = discover_zoo()
MUTANTS: dict = {}


@dataclass(frozen=True)
class Mutant:
    name: str  # "<zoo module>.<slug of the bug>"
    bug: str  # what is wrong, as a student would say it
    killed_by: str  # the invariant whose hint names this bug
    backend: str
    replaces: str  # the protocol (or helper) function swapped in the reference copy
    function: Callable = field(repr=False)
    dtype: str = "float64"  # the dtype its bug shows in (a numpy float64 scalar promotes float32 only)
    also_named_by: tuple = ()  # other invariants whose hints name this bug in so many words (and which fail on it)

    @property
    def named_by(self):
        """Every invariant whose hint names this bug: a diagnosis naming one of them names the bug."""
        return (self.killed_by, *self.also_named_by)

    def namespace(self):
        """A fresh copy of the reference module with the broken function swapped in."""
        source = importlib.import_module(f"reference.{self.backend}")
        name = f"_mutant_{re.sub(r'[^0-9a-zA-Z]', '_', self.name)}"
        spec = importlib.util.spec_from_file_location(name, source.__file__)
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
        setattr(module, self.replaces, self.function)
        return module

    def implementation(self, *, dtype=None, device="cpu"):
        """The mutant as an Implementation, in its own dtype unless told otherwise."""
        return Implementation(self.namespace(), label=f"mutant {self.name}", backend=self.backend, device=device, dtype=dtype or self.dtype)


def mutant(*, replaces, killed_by, bug, backend="numpy", dtype="float64", also_named_by=()):
    """Register the decorated function as a broken replacement for the reference function `replaces`."""

    def register(function):
        name = f"{function.__module__.rsplit('.', 1)[-1]}.{function.__name__}"
        if name in MUTANTS:
            raise ValueError(f"mutant {name} is registered twice")
        MUTANTS[name] = Mutant(name, bug, killed_by, backend, replaces, function, dtype, tuple(also_named_by))
        return function

    return register


def all_mutants():
    """Every mutant in the zoo, module by module in the order of their names."""
    for zoo in ZOO_MODULES:
        importlib.import_module(f"invariants.mutants.{zoo}")
    return list(MUTANTS.values())
