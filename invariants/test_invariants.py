"""The invariant suite: every registered invariant, run against the implementation chosen by --impl.

    pytest --pyargs invariants --impl reference.torch --invariants-profile ci
"""

import pytest

from invariants.plugin import selection
from invariants.registry import all_invariants
from invariants.repro import write_repro
from invariants.runner import run_invariant


def pytest_generate_tests(metafunc):
    """One test per registered invariant, its id naming the run's dtype: test_invariant[attention.causal_non_leakage-float32]."""
    dtype = selection(metafunc.config).dtype
    metafunc.parametrize("inv", all_invariants(), ids=lambda inv: f"{inv.name}-{dtype}")


def test_invariant(inv, impl, invariant_settings, record_outcome, repro_dir, record_property):
    outcome = run_invariant(inv, impl, settings=invariant_settings)
    record_outcome(outcome)
    if outcome.status == "skipped":
        pytest.skip(outcome.reason)
    if not outcome.passed:
        script = write_repro(outcome, impl, repro_dir) if repro_dir else None
        if script:
            record_property("repro", str(script))  # --invariants-json embeds the script
        pytest.fail(outcome.report + (f"\nrepro: python {script}" if script else ""), pytrace=False)
