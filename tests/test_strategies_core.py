"""strategies.core and strategies.norms: bad arguments are refused with a message naming them; draws keep their promises."""

import numpy as np
import pytest
from hypothesis import find, given, settings
from hypothesis import seed as hypothesis_seed
from hypothesis import strategies as st

from invariants.strategies import (
    EITHER_SIDE,
    LONG_LENGTHS,
    InvalidArgument,
    attention_shapes,
    dtypes,
    float_arrays,
    norm_rows,
    scale_factors,
    swept_lengths,
    weights,
)
from invariants.strategies.core import (
    GRID,
    array_dicts,
    byte_arrays,
    grid_reader,
    grid_values,
    just,
    none,
    one_of,
    permutations,
    sampled_from,
    weight_part,
)
from invariants.strategies.moe import _ks

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
    (attention_shapes, dict(long_lengths=(0,)), "long_lengths=(0,) holds 0"),
    (attention_shapes, dict(long_lengths=17), "long_lengths=17 must be a tuple"),
    (norm_rows, dict(min_row_std=1.0, max_row_std=1.5), "max_row_std=1.5 must be at least 2·min_row_std=2.0"),
    (norm_rows, dict(max_row_std=1e5), "max_row_std=100000.0 must be at most 4096"),
    (norm_rows, dict(zero_rows=1), "zero_rows=1 must be True or False"),
    (grid_values, dict(shape=(2, -1)), "shape[1]=-1 must be at least 0"),
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


def test_swept_lengths_cover_either_side_of_every_tile_up_to_the_drawn_one():
    assert LONG_LENGTHS == (15, 16, 17, 31, 32, 33, 63, 64, 65, 127, 128, 129)
    assert swept_lengths(129) == EITHER_SIDE == (15, 17, 31, 33, 63, 65, 127, 129)
    assert swept_lengths(65) == (15, 17, 31, 33, 63, 65)
    assert swept_lengths(5) == (5,) and swept_lengths(33) == (33,) and swept_lengths(64) == (64,)


def test_attention_shapes_draw_long_ones_at_small_widths_and_shrink_to_short_ones():
    seen = []

    @settings(max_examples=100, database=None, derandomize=True)
    @given(attention_shapes(long_lengths=LONG_LENGTHS))
    def collect(shape):
        seen.append(shape)

    collect()
    long = [s for s in seen if s.seq in LONG_LENGTHS and s.seq > 8]
    assert len(long) >= 30 and all(s.batch <= 2 and s.d_model <= 8 for s in long)
    assert find(attention_shapes(long_lengths=LONG_LENGTHS), lambda s: s.seq > 100).seq == 127  # the smallest long length above 100


def test_grid_values_shrink_value_by_value_towards_zeros_and_ones():
    steady = settings(database=None, derandomize=True)
    assert set(find(grid_values((3,)), lambda x: x.sum() > 0, settings=steady).tolist()) <= {0.0, 1.0, -1.0}
    assert find(float_arrays((2, 2)), lambda x: (x != 0).all(), settings=steady).tolist() == [[1.0, 1.0], [1.0, 1.0]]
    assert find(grid_values((4,)), lambda x: (x != 0).sum() >= 2, settings=steady).tolist().count(0.0) == 2


def test_array_dicts_read_each_array_from_its_own_bytes_and_shrink_value_by_value():
    steady = settings(database=None, derandomize=True)
    parts = [("W", (2, 3), grid_reader(0.5)), ("g", (3,), lambda b: 1.0 + b)]
    drawn = find(array_dicts(parts), lambda d: d["W"].any() and d["g"].max() > 1, settings=steady)
    assert list(drawn) == ["W", "g"] and drawn["W"].shape == (2, 3) and drawn["g"].shape == (3,)
    assert sorted(drawn["W"].ravel().tolist()) == [0.0] * 5 + [0.5]  # the simplest non-zero grid value, 1, times 0.5
    assert sorted(drawn["g"].tolist()) == [1.0, 1.0, 2.0]  # byte 1, once


def test_a_weight_part_is_drawn_at_the_scale_of_weights():
    steady = settings(database=None, derandomize=True)
    from_part = find(array_dicts([weight_part("W", (4, 2), gain=2.0)]), lambda d: d["W"].any(), settings=steady)["W"]
    assert from_part.max() == find(weights((4, 2), gain=2.0), lambda w: w.any(), settings=steady).max() == 1.0  # 2 / √4


@settings(max_examples=50, database=None, derandomize=True)
@given(byte_arrays((3, 200)))
def test_large_byte_arrays_fill_past_the_drawn_bytes_without_a_period(b):
    assert b.shape == (3, 200) and b.dtype == np.uint8
    if len(np.unique(b[0, :32])) > 16:  # random bytes drawn: the rest is no repetition of one block
        assert not np.array_equal(b[1, :64], b[1, 64:128])


@settings(max_examples=100, database=None, derandomize=True)
@given(norm_rows(zero_rows=True))
def test_zero_rows_are_exact_zeros_and_the_others_keep_their_spread(x):
    zero = (x == 0).all(axis=-1)
    assert np.all(x[~zero].std(axis=-1) >= 0.1 * (1 - 1e-9))


def test_the_grid_is_normal_shaped_and_sorted_simplest_first():
    assert GRID[:4].tolist() == [0.0, 0.0, 1.0, -1.0] and abs(GRID.mean()) < 0.01 and 0.95 < GRID.std() < 1.05
    assert np.all(GRID * 64 == np.round(GRID * 64)) and np.abs(GRID).max() < 3


def _drawn(strategy, seed, n=40):
    """The first n values `strategy` draws under hypothesis seed `seed` (a fresh search each time)."""
    values = []

    @settings(max_examples=n, database=None, derandomize=False)
    @given(st.data())
    def record(data):
        values.append(data.draw(strategy))

    hypothesis_seed(seed)(record)()
    return values


def test_cached_constructors_return_one_strategy_per_set_of_arguments_keyed_by_a_float_bits():
    assert sampled_from(("a", "b")) is sampled_from(("a", "b"))
    assert just(0.0) is not just(-0.0) and just(1) is not just(True)
    assert just(float("nan")) is just(float("nan"))  # keyed by its bits: one entry, however often asked
    assert permutations(range(3)) is permutations(range(3))
    assert sampled_from(["a", "b"]) is not sampled_from(["a", "b"])  # a list cannot be a key: built afresh, never wrong


def test_cached_constructors_draw_what_hypothesis_own_draw():
    """The same examples, seed for seed: the cached strategies are hypothesis's, built once (docs/power.md)."""
    cases = [
        (lambda: st.tuples(sampled_from(("x", "y", "z")), just(3), permutations(range(4))),
         lambda: st.tuples(st.sampled_from(("x", "y", "z")), st.just(3), st.permutations(range(4)))),
        (lambda: one_of(none(), sampled_from((15, 17))), lambda: st.one_of(st.none(), st.sampled_from((15, 17)))),
        # k of moe_shapes where k can only be 1: three branches still (one_of draws a strategy given twice once)
        (lambda: st.tuples(_ks(1, 1), st.integers(0, 10**6)),
         lambda: st.tuples(st.one_of(st.just(1), st.just(1), st.integers(1, 1)), st.integers(0, 10**6))),
    ]
    for ours, theirs in cases:
        assert _drawn(ours(), seed=3) == _drawn(theirs(), seed=3)
