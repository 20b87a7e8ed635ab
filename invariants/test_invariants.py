"""The invariant suite: every registered invariant, run against the implementation chosen by --impl.

    pytest --pyargs invariants --impl reference.torch --invariants-profile ci
"""

import pytest

from invariants.registry import all_invariants
from invariants.runner import run_invariant


@pytest.mark.parametrize("inv", all_invariants(), ids=lambda inv: inv.name)
def test_invariant(inv, impl, invariant_settings, record_outcome):
    outcome = run_invariant(inv, impl, settings=invariant_settings)
    record_outcome(outcome)
    if outcome.status == "skipped":
        pytest.skip(outcome.reason)
    if not outcome.passed:
        pytest.fail(outcome.report, pytrace=False)
