"""The suite has teeth: each mutant in the zoo fails the invariant whose hint names its bug."""

import pytest

from invariants import REGISTRY, all_invariants, run_invariant
from invariants.mutants import all_mutants
from invariants.profiles import profile_settings

all_invariants()
MUTANTS = all_mutants()
CI = profile_settings("ci")


@pytest.mark.parametrize("mutant", MUTANTS, ids=lambda m: m.name)
def test_mutant_is_killed_by_the_invariant_that_names_its_bug(mutant):
    assert mutant.killed_by in REGISTRY, f"{mutant.name} names an unknown invariant {mutant.killed_by!r}"
    inv = REGISTRY[mutant.killed_by]
    outcome = run_invariant(inv, mutant.implementation(), settings=CI)
    assert outcome.status in ("failed", "error") and not outcome.check_crashed, f"{mutant.name} survived: {outcome.status}, {outcome.reason}"
    report = outcome.report
    assert report.startswith(f"{inv.name}: "), report
    assert f"hint: {inv.hint}" in report


def test_zoo_covers_every_component():
    zoo_components = {m.killed_by.split(".")[0] for m in MUTANTS}
    invariant_components = {inv.component for inv in REGISTRY.values()}
    assert invariant_components <= zoo_components, f"no mutant is killed in {sorted(invariant_components - zoo_components)}"


ALSO_NAMED = [(m, name) for m in MUTANTS for name in m.also_named_by]


@pytest.mark.parametrize(("mutant", "name"), ALSO_NAMED, ids=[f"{m.name}-{n}" for m, n in ALSO_NAMED])
def test_an_invariant_that_also_names_a_bug_kills_it(mutant, name):
    """also_named_by widens what counts as naming the bug (for the diagnosis): each such invariant is another, and it fails too."""
    assert name in REGISTRY and name != mutant.killed_by, name
    outcome = run_invariant(REGISTRY[name], mutant.implementation(), settings=CI)
    assert outcome.status in ("failed", "error") and not outcome.check_crashed, f"{mutant.name} survived {name}: {outcome.reason}"
