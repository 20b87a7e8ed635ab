"""Valid inputs: one drawer per protocol function that answers arrays, registered in the component module whose HOLDS lists it."""

import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from invariants.inputs import VALID_INPUTS
from invariants.protocol import FUNCTIONS
from invariants.registry import COMPONENTS, all_invariants

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "invariants"
ARRAYS = sorted(name for name, entry in FUNCTIONS.items() if entry.answers_arrays)  # floats, ids or counts
all_invariants()  # every component module imported: every drawer registered


def _registrations(function):
    """The files of the package that register a drawer for `function`, once per registration."""
    pattern = re.compile(rf'^@valid_inputs\("{function}"\)$', re.MULTILINE)
    return [path.relative_to(PACKAGE).as_posix() for path in sorted(PACKAGE.rglob("*.py"))
            for _ in pattern.finditer(path.read_text(encoding="utf-8"))]


def test_the_functions_with_drawers_are_those_that_answer_arrays():
    assert sorted(VALID_INPUTS) == ARRAYS
    assert {name for name, entry in FUNCTIONS.items() if entry.floating} < set(ARRAYS)  # and the ids and counts besides


@pytest.mark.parametrize("function", ARRAYS)
def test_each_drawer_is_registered_once_in_a_module_that_holds_its_function(function):
    holders = [component for component, holds in COMPONENTS.items() if function in holds]
    module = VALID_INPUTS[function].__module__
    assert module.removeprefix("invariants.laws.") in holders, f"{function}'s drawer is in {module}, not in one of {holders}"
    assert _registrations(function) == [f"{module.removeprefix('invariants.').replace('.', '/')}.py"]


def test_a_lookup_imports_the_module_that_holds_the_function():
    code = ("import sys; from invariants.inputs import VALID_INPUTS; assert 'invariants.laws.moe' not in sys.modules; "
            "print(VALID_INPUTS['load_balancing_loss'].__module__)")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert (done.returncode, done.stdout.strip()) == (0, "invariants.laws.moe"), done.stderr


def test_a_function_without_valid_inputs_is_refused_by_name():
    with pytest.raises(KeyError, match=r"no valid inputs for 'gpt_param_count': no component module registers them"):
        VALID_INPUTS["gpt_param_count"]  # held by invariants.laws.counts, but its answer is a lone int, not arrays


def test_the_contributing_page_shows_the_qk_norm_drawer_as_it_is():
    section = (ROOT / "docs" / "contributing.md").read_text(encoding="utf-8").split("## Adding a component")[1]
    snippet = textwrap.dedent(section.split("```python\n")[1].split("```")[0]).replace("  # from invariants.inputs", "")
    assert snippet.startswith('@valid_inputs("qk_norm_attention")\n')
    assert snippet in (PACKAGE / "laws" / "qk_norm.py").read_text(encoding="utf-8")
