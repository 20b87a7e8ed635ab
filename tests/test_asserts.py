"""The assertion helpers: each fails when it should, and its message follows the one grammar."""

import numpy as np
import pytest

from invariants.asserts import (
    InvariantViolation,
    assert_close,
    assert_dtype,
    assert_equal,
    assert_finite,
    assert_shape,
    assert_value,
    assert_where,
)
from invariants.tolerance import LAYER_NORM_TYPICAL_CONDITION, MEASURED_SUM_LENGTH, Tolerance, layer_norm_condition, tolerance_for


def message_of(fn, *args, **kwargs):
    with pytest.raises(InvariantViolation) as failure:
        fn(*args, **kwargs)
    return str(failure.value)


def test_equal_passes_on_equal_arrays_and_signed_zeros():
    assert_equal(np.array([0.0, 1.5]), np.array([-0.0, 1.5]), "out")


def test_equal_reports_the_worst_element_with_its_index():
    got = np.array([[1.0, 2.0], [3.0, 4.5]])
    text = message_of(assert_equal, got, np.array([[1.0, 2.0], [3.0, 4.0]]), "out", "f(x)")
    assert text.splitlines()[0] == "out=different values, but should be exactly equal (bitwise, == per element) [f(x)]"
    assert "mismatched 1 of 4 elements (25.0%)" in text
    assert "worst at index (1, 1): got 4.5, expected 4" in text
    assert "max abs error 0.5" in text


def test_equal_never_accepts_nan_even_against_nan():
    text = message_of(assert_equal, np.array([np.nan]), np.array([np.nan]), "out")
    assert text.startswith("out[0]=nan, but should be finite")
    text = message_of(assert_equal, np.array([1.0]), np.array([np.nan]), "out")
    assert text.startswith("the value out is compared with[0]=nan, but should be finite")


def test_equal_reports_a_shape_mismatch():
    text = message_of(assert_equal, np.zeros((2, 3)), np.zeros((3, 2)), "out")
    assert text.startswith("shape of out=(2, 3), but should be (3, 2)")


def test_close_states_the_tolerance_and_the_errors():
    tol = Tolerance(1e-3, 1e-6, "float32")
    assert_close(np.array([1.0005]), np.array([1.0]), "y", tol)
    text = message_of(assert_close, np.array([1.0, 1.1]), np.array([1.0, 1.0]), "y", tol, "g(x)")
    assert text.splitlines()[0].endswith("within atol=1e-06 + rtol=0.001·|expected| (float32) [g(x)]")
    assert "worst at index (1,): got 1.1, expected 1" in text
    assert "max rel error 0.1" in text


def test_close_fails_on_nan_naming_its_index():
    text = message_of(assert_close, np.array([1.5, np.nan]), np.array([1.0, 1.0]), "y", tolerance_for("float64"))
    assert text.startswith("y[1]=nan, but should be finite")


def test_sixteen_bit_tolerances_are_normwise():
    tol = tolerance_for("bfloat16")
    assert_close(np.array([100.0, 0.5]), np.array([100.0, 0.0]), "y", tol)  # 0.5 <= 1.6e-2 · 100
    assert "rtol=0.016·max|expected|" in str(tol)


def test_layer_norm_condition_is_large_only_for_rows_of_nearly_equal_values():
    spread = np.array([[-1.0, 0.0, 1.0]])  # max|row| 1, std √(2/3)
    assert layer_norm_condition(spread, 1e-5) == pytest.approx(np.sqrt(1.5), rel=1e-4)
    assert layer_norm_condition(np.array([[-0.2327, -0.2427, -0.2403]]), 1e-5) > 40  # the soak's failing row
    assert layer_norm_condition(np.array([[5.0], [-3.0]]), 1e-5) == 1.0  # one feature: centred exactly to 0
    assert layer_norm_condition(np.zeros((0, 4)), 1e-5) == 1.0


def test_conditioned_tolerance_grows_only_beyond_the_typical_condition():
    table = tolerance_for("float32")
    assert table.conditioned(LAYER_NORM_TYPICAL_CONDITION / 2) == table
    tenfold = table.conditioned(10 * LAYER_NORM_TYPICAL_CONDITION)
    assert (tenfold.atol, tenfold.rtol) == pytest.approx((10 * table.atol, 10 * table.rtol))


def test_a_tolerance_summed_over_long_sequences_grows_in_proportion_beyond_the_measured_length():
    table = tolerance_for("float32")
    assert table.summed_over(1) == table.summed_over(MEASURED_SUM_LENGTH) == table
    long = table.summed_over(16 * MEASURED_SUM_LENGTH)
    assert (long.atol, long.rtol) == pytest.approx((16 * table.atol, 16 * table.rtol))


def test_shape_finite_where_and_value():
    assert message_of(assert_shape, np.zeros(3), (4,), "out").startswith("shape of out=(3,), but should be (4,)")
    assert message_of(assert_shape, [1, 2], (2,), "out").startswith("type of out=list, but should be an array")
    text = message_of(assert_finite, np.array([1.0, np.inf, np.nan]), "out")
    assert text.startswith("out[1]=inf, but should be finite") and "2 of 3 elements are not finite" in text
    text = message_of(assert_where, np.array([True, False]), np.array([0.5, -0.25]), "weights", ">= 0")
    assert text.startswith("weights[1]=-0.25, but should be >= 0")
    assert message_of(assert_value, np.asarray(7), 8, "count").startswith("count=7, but should be 8")


def test_dtype_names_both_dtypes_and_where_the_expected_one_comes_from():
    assert_dtype(np.zeros(2, dtype=np.float32), "float32", "out")
    assert_dtype(np.asarray(np.float16(1.0)), np.float16, "loss")  # 0-d arrays too
    text = message_of(assert_dtype, np.zeros(2), np.float32, "layer_norm(x, gain, bias, eps)", "layer_norm(x float32 (1, 2), ...)",
                      why="the input dtype")
    assert text == "dtype of layer_norm(x, gain, bias, eps)=float64, but should be float32 (the input dtype) [layer_norm(x float32 (1, 2), ...)]"
    assert message_of(assert_dtype, np.zeros(1, dtype=np.int64), "float64", "f(x)") == "dtype of f(x)=int64, but should be float64"
    assert message_of(assert_dtype, (np.zeros(1),), "float64", "f(x)").startswith("type of f(x)=tuple, but should be an array")


def test_a_call_is_described_by_its_entry_alone():
    """describe_call shows the params the entry lists in `shown` (arrays by shape, masks and index lists by value), the rest by name."""
    from invariants.protocol import describe_call

    x, q, k = np.zeros((2, 3, 4)), np.zeros((1, 2, 3, 4)), np.zeros((1, 1, 3, 4))
    assert describe_call("attention", {"x": x, "n_heads": 2, "causal": True}, "vs causal=False") == (
        "attention(x[2, 3, 4], W_q, W_k, W_v, W_o, n_heads=2, causal=True) vs causal=False")
    masked = {"q": q, "k": k, "causal": True, "key_mask": np.array([[True, False, True]]), "window": None}
    assert describe_call("gqa_attention", masked) == "gqa_attention(q[1, 2, 3, 4], k[1, 1, 3, 4], v, causal=True, key_mask=[101], window=None)"
    every = describe_call("layer_norm", (np.zeros((3, 5)), np.ones(5), np.zeros(5), 1e-05), every=True, dtype="float32")
    assert every == "layer_norm(x[3, 5] float32, gain[5] float32, bias[5] float32, eps=1e-05)"
    with pytest.raises(ValueError):  # positional arguments are the whole call, in protocol order
        describe_call("layer_norm", (x,))
