"""The reference passes every invariant that applies to it (ci profile), in the dtypes CI can afford.

The full matrix (every dtype, CUDA) is `tox`; this keeps the reference honest in the tests CI runs.
"""

import pytest
from hypothesis import settings

from invariants import all_invariants, load_implementation, run_invariant
from invariants.runner import InvariantFailure, InvariantSkipped

CONFIGS = [("reference.numpy", "float64"), ("reference.torch", "float32"), ("reference.torch", "bfloat16")]
CI = settings.get_profile("ci")


@pytest.mark.parametrize("target, dtype", CONFIGS, ids=lambda v: v)
@pytest.mark.parametrize("inv", all_invariants(), ids=lambda inv: inv.name)
def test_reference_passes(inv, target, dtype):
    impl = load_implementation(target, dtype=dtype)
    try:
        run_invariant(inv, impl, settings=CI)
    except InvariantSkipped as skipped:
        assert "does not provide" not in str(skipped), "the reference provides every protocol function"
        pytest.skip(str(skipped))
    except InvariantFailure as failure:
        pytest.fail(str(failure), pytrace=False)
