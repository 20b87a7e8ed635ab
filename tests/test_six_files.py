"""A component is its six files (issue 37): the law registry, the mutant zoo and the strategies' exports each find its module
by listing their package, so adding one edits no list elsewhere."""

import importlib
import pkgutil
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import invariants.mutants
import invariants.strategies
from invariants.strategies.__main__ import typing_stub

ROOT = Path(__file__).resolve().parent.parent

# A throwaway component's three discovered files (its other three, the protocol entry and the references, are its own by
# definition): a law, a strategy and a mutant of an existing function.
TOY = {
    "invariants/laws/toy.py": '''
        from invariants.registry import invariant

        LESSON = 999
        HOLDS = ("softmax",)


        @invariant(requires=("softmax",), hint="the toy bug")
        def toy_law(impl, case):
            """A toy law."""
        ''',
    "invariants/strategies/toy.py": '''
        from hypothesis import strategies as st

        __all__ = ["toy_inputs"]


        def toy_inputs():
            return st.just({})
        ''',
    "invariants/mutants/toy.py": '''
        from invariants.mutants import mutant


        @mutant(replaces="softmax", killed_by="toy.toy_law", bug="the toy bug")
        def toy_softmax(x, axis=-1):
            return x
        ''',
}

# Run in a copy of the project with the toy's files added, as a contributor would have it.
CHECK_THE_TOY = """
import invariants, strategies
from invariants.mutants import all_mutants
from invariants.registry import COMPONENTS, all_invariants
from invariants.strategies.__main__ import typing_stub

assert invariants.__file__.startswith(sys.argv[1]), invariants.__file__
assert "toy" in COMPONENTS and "toy.toy_law" in {law.name for law in all_invariants()}
assert "toy.toy_softmax" in {m.name for m in all_mutants()}
assert "toy_inputs" in strategies.__all__ and strategies.toy_inputs().example() == {}
assert "from invariants.strategies.toy import toy_inputs" in typing_stub()
"""


def test_the_zoo_is_every_module_that_registers_a_mutant():
    """Importing every module of invariants.mutants registers mutants of ZOO_MODULES only, some of each, in the order of their names."""
    zoo = invariants.mutants.all_mutants()
    for module in pkgutil.iter_modules(invariants.mutants.__path__):
        importlib.import_module(f"invariants.mutants.{module.name}")
    assert list(invariants.mutants.MUTANTS.values()) == zoo, "a module outside ZOO_MODULES registered a mutant"
    assert list(dict.fromkeys(m.name.split(".")[0] for m in zoo)) == list(invariants.mutants.ZOO_MODULES) == sorted(invariants.mutants.ZOO_MODULES)
    assert not {"documented", "reach", "matrix", "course_checks"} & set(invariants.mutants.ZOO_MODULES)


def test_a_name_two_strategies_modules_export_is_refused(monkeypatch):
    """Two modules exporting one name would leave `strategies` with whichever was listed last: the package refuses to load."""
    monkeypatch.setattr(invariants.strategies, "component_modules", lambda: ["core", "core"])
    with pytest.raises(ImportError, match=r"invariants.strategies.core exports \[.*'GRID'"):
        invariants.strategies._exports()


def test_the_typing_stub_is_current():
    """invariants/strategies/__init__.pyi spells out for type checkers what the package exports at run time."""
    stub = Path(invariants.strategies.__file__).with_name("__init__.pyi")
    assert stub.read_text(encoding="utf-8") == typing_stub(), "regenerate it: python -m invariants.strategies > invariants/strategies/__init__.pyi"


def test_a_new_component_needs_no_edit_outside_its_files(tmp_path):
    """A law module, a strategies module and a zoo module added to a copy of the project are registered, exported and zoo'd."""
    for package in ("invariants", "strategies", "reference"):
        shutil.copytree(ROOT / package, tmp_path / package, ignore=shutil.ignore_patterns("__pycache__"))
    for path, text in TOY.items():
        (tmp_path / path).write_text(textwrap.dedent(text).lstrip(), encoding="utf-8")
    run = subprocess.run([sys.executable, "-c", "import sys\n" + CHECK_THE_TOY, str(tmp_path)], cwd=tmp_path, capture_output=True, text=True,
                         timeout=120)
    assert run.returncode == 0, run.stderr
