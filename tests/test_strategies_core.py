"""strategies.core and strategies.norms: bad arguments are refused with a message naming them; draws keep their promises."""

import numpy as np
import pytest
from hypothesis import given, settings

from strategies import InvalidArgument, attention_shapes, dtypes, float_arrays, norm_rows, scale_factors, weights

BAD_ARGUMENTS = [
    (attention_shapes, dict(min_seq=5, max_seq=3), "min_seq=5 is larger than max_seq=3"),
    (attention_shapes, dict(min_batch=0), "min_batch=0 must be at least 1"),
    (attention_shapes, dict(max_heads=2.5), "max_heads=2.5 must be an int"),
    (attention_shapes, dict(min_d_head=True), "min_d_head=True must be an int"),
    (float_arrays, dict(shape=(2,), min_scale=0.0), "min_scale=0.0 must be positive"),
    (float_arrays, dict(shape=(2,), min_scale=3.0, max_scale=1.0), "min_scale=3.0 is larger than max_scale=1.0"),
    (float_arrays, dict(shape=(2,), max_scale=float("inf")), "max_scale=inf must be a finite number"),
    (weights, dict(shape=(2, 2), gain=-1.0), "gain=-1.0 must be positive"),
    (norm_rows, dict(min_d=1), "min_d=1 must be at least 2"),
    (norm_rows, dict(min_rows=4, max_rows=2), "min_rows=4 is larger than max_rows=2"),
    (norm_rows, dict(min_row_std=2.0, max_row_std=1.0), "min_row_std=2.0 is larger than max_row_std=1.0"),
    (norm_rows, dict(max_offset=-1.0), "max_offset=-1.0 must be at least 0"),
    (scale_factors, dict(min_exponent=3, max_exponent=-3), "min_exponent=3 is larger than max_exponent=-3"),
    (dtypes, dict(backend="jax"), "backend='jax' is not one of 'numpy', 'torch'"),
]


@pytest.mark.parametrize("strategy, kwargs, message", BAD_ARGUMENTS, ids=lambda v: v if isinstance(v, str) else None)
def test_bad_argument_is_refused_with_a_message_that_names_it(strategy, kwargs, message):
    with pytest.raises(InvalidArgument) as refused:
        strategy(**kwargs)
    assert message in str(refused.value)


@settings(max_examples=200, database=None, derandomize=True)
@given(attention_shapes())
def test_attention_shapes_are_valid_by_construction(shape):
    assert shape.d_model == shape.n_heads * shape.d_head
    assert 1 <= shape.seq <= 8 and 1 <= shape.n_heads <= 4 and 1 <= shape.d_head <= 8


def test_attention_shapes_reach_the_edge_cases():
    seen = set()

    @settings(max_examples=300, database=None, derandomize=True)
    @given(attention_shapes())
    def collect(shape):
        seen.update({"seq 1"} if shape.seq == 1 else set())
        seen.update({"d_head 1"} if shape.d_head == 1 else set())
        seen.update({"one head"} if shape.n_heads == 1 else set())
        seen.update({"n_heads = d_model"} if shape.n_heads == shape.d_model and shape.n_heads > 1 else set())

    collect()
    assert seen == {"seq 1", "d_head 1", "one head", "n_heads = d_model"}


@settings(max_examples=200, database=None, derandomize=True)
@given(norm_rows(min_row_std=0.5, max_row_std=2.0, max_offset=3.0))
def test_norm_rows_have_the_promised_spread_and_offset(x):
    std = x.std(axis=-1)
    assert np.all((std >= 0.5 * (1 - 1e-9)) & (std <= 2.0 * (1 + 1e-9)))
    assert np.all(np.abs(x.mean(axis=-1)) <= 3.0 * std * (1 + 1e-9))


@settings(max_examples=100, database=None, derandomize=True)
@given(scale_factors(powers_of_two=True))
def test_power_of_two_scale_factors_scale_exactly(c):
    assert c != 0 and np.log2(abs(c)) == round(np.log2(abs(c)))
    x = np.random.default_rng(0).standard_normal(16)
    assert np.array_equal((x * c) / c, x)


@settings(max_examples=50, database=None, derandomize=True)
@given(float_arrays((3, 4), min_scale=2.0, max_scale=2.0))
def test_float_arrays_have_the_shape_and_scale(x):
    assert x.shape == (3, 4) and x.dtype == np.float64 and np.all(np.isfinite(x))
