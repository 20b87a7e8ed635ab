"""The suite has teeth: each mutant in the zoo fails the invariant whose hint names its bug."""

import pytest

from invariants import REGISTRY, all_invariants, run_invariant
from invariants.profiles import profile_settings
from mutants import all_mutants

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
