"""The invariants as fuzz targets for HypoFuzz: each registered invariant one @given test, run against the --impl chosen.

    hypothesis fuzz -n 2 --no-dashboard -- --pyargs invariants.fuzz --impl reference.numpy --examples-db redis://host:6379/0

(`tox -e fuzz` runs that on the reference.) The same invariants, drawn through the same strategies in the
same order as invariants.runner draws them, so a failure a worker finds is a choice sequence the runner
replays: every ci or dev run given the same --examples-db replays it first, shrunk (invariants.examples_db
says under which key, and why that key survives a new release). Not collected by `pytest --pyargs
invariants` (its name is not test_*.py); collecting it loads a hypothesis profile whose database is the
shared one (invariants.plugin), since HypoFuzz fuzzes only tests on the default database.
"""

import pytest
from hypothesis import given
from hypothesis import strategies as st

from invariants.hypothesis_internals import draw_of
from invariants.plugin import selection
from invariants.registry import all_invariants
from invariants.runner import Case


def pytest_generate_tests(metafunc):
    """The implementation chosen (--impl, --impl-dtype, ...) as a parameter, not the `impl` fixture: HypoFuzz tears fixtures down between targets."""
    chosen = selection(metafunc.config)
    metafunc.parametrize("implementation", [pytest.param(chosen.impl, id=f"{chosen.target} {chosen.dtype}")])


@pytest.mark.parametrize("inv", all_invariants(), ids=lambda inv: inv.name)
@given(data=st.data())
def test_fuzz_target(inv, implementation, data):
    inv(implementation, Case(draw_of(data)))  # a failure carries the runner's report, the shrunk example's, beside hypothesis's traceback
