"""The suite's own arithmetic that may overflow by design warns nothing into a user's run: a RuntimeWarning is the user's code."""

from __future__ import annotations

import warnings

import numpy as np
import pytest

import invariants.reference.numpy as ref
from invariants.asserts import InvariantViolation, assert_close, assert_equal
from invariants.tolerance import tolerance_for


@pytest.fixture
def runtime_warnings_are_errors():
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)
        yield


@pytest.mark.parametrize("check", [lambda a, e: assert_equal(a, e, "out"), lambda a, e: assert_close(a, e, "out", tolerance_for("float64"))])
def test_a_large_error_over_a_zero_expected_value_is_reported_without_a_warning(runtime_warnings_are_errors, check):
    with pytest.raises(InvariantViolation, match=r"max abs error 1e\+03, max rel error inf"):
        check(np.array([1e3, 0.0]), np.zeros(2))  # 1e3 / tiny overflows: the relative error is inf


def test_infinities_beside_a_mismatch_are_reported_without_a_warning(runtime_warnings_are_errors):
    with pytest.raises(InvariantViolation, match=r"worst at index \(1,\): got 1, expected 2"):
        assert_equal(np.array([np.inf, 1.0]), np.array([np.inf, 2.0]), "out")  # inf - inf where they agree


def test_the_reference_softmax_of_a_fully_masked_row_is_nan_without_a_warning(runtime_warnings_are_errors):
    out = ref.softmax(np.array([[-np.inf, -np.inf], [0.0, -np.inf]]))
    assert np.isnan(out[0]).all() and out[1].tolist() == [1.0, 0.0]
