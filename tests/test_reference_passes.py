"""The reference passes every invariant that applies to it (ci profile), in the dtypes CI can afford.

The full matrix (every dtype, CUDA) is `tox`; this keeps the reference honest in the tests CI runs.
"""

import pytest

from invariants import all_invariants, load_implementation, run_invariant
from invariants.profiles import profile_settings

CONFIGS = [("reference.numpy", "float64"), ("reference.torch", "float32"), ("reference.torch", "bfloat16")]
CI = profile_settings("ci")


@pytest.mark.parametrize("target, dtype", CONFIGS, ids=lambda v: v)
@pytest.mark.parametrize("inv", all_invariants(), ids=lambda inv: inv.name)
def test_reference_passes(inv, target, dtype):
    impl = load_implementation(target, dtype=dtype)
    outcome = run_invariant(inv, impl, settings=CI)
    if outcome.status == "skipped":
        assert "does not provide" not in outcome.reason, "the reference provides every protocol function"
        pytest.skip(outcome.reason)
    if not outcome.passed:
        pytest.fail(outcome.report, pytrace=False)
