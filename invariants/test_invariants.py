"""The invariant suite: every registered invariant, run against the implementation chosen by --impl.

    pytest --pyargs invariants --impl reference.torch --hypothesis-profile ci
"""

import pytest

from invariants.registry import all_invariants
from invariants.runner import InvariantFailure, InvariantSkipped, run_invariant


@pytest.mark.parametrize("inv", all_invariants(), ids=lambda inv: inv.name)
def test_invariant(inv, impl, request):
    try:
        # Read by the plugin's summary line; pytest's JUnit XML writes it as the property `examples`.
        request.node.user_properties.append(("examples", run_invariant(inv, impl)))
        return
    except InvariantSkipped as exc:
        skipped, failed = str(exc), None
    except InvariantFailure as exc:
        skipped, failed = None, str(exc)
    if skipped:  # raised outside the except blocks, so no chained traceback is printed
        pytest.skip(skipped)
    pytest.fail(failed, pytrace=False)
