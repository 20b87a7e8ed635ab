"""The softmax, activation and feed-forward strategies: bad arguments are refused by name, and the promised inputs occur."""

import numpy as np
import pytest
from hypothesis import find, given, settings
from hypothesis import strategies as st

from invariants.strategies._validation import InvalidArgument
from invariants.strategies.activation import activation_inputs, paddings
from invariants.strategies.feed_forward import feed_forward_weights, hidden_states
from invariants.strategies.softmax import large_logits, logits, shifts, targets

FEW = settings(max_examples=40, database=None, deadline=None)
SEARCH = settings(max_examples=300, database=None, deadline=None)

BAD_ARGUMENTS = [
    (logits, {"min_ndim": 0}, "min_ndim=0 must be at least 1"),
    (logits, {"min_ndim": 3, "max_ndim": 2}, "min_ndim=3 is larger than max_ndim=2"),
    (logits, {"max_side": 1.5}, "max_side=1.5 must be an int"),
    (logits, {"min_vocab": 0}, "min_vocab=0 must be at least 1"),
    (logits, {"min_vocab": 9, "max_vocab": 4}, "min_vocab=9 is larger than max_vocab=4"),
    (logits, {"min_scale": 0.0}, "min_scale=0.0 must be positive"),
    (logits, {"max_scale": float("inf")}, "max_scale=inf must be a finite number"),
    (logits, {"min_scale": 5.0, "max_scale": 1.0}, "min_scale=5.0 is larger than max_scale=1.0"),
    (logits, {"patterns": ()}, "patterns=() must be a non-empty tuple"),
    (logits, {"patterns": "uniform"}, "patterns='uniform' must be a non-empty tuple"),
    (logits, {"patterns": ("uniform", "sorted")}, "patterns=('uniform', 'sorted') holds 'sorted'"),
    (large_logits, {"magnitude": -1.0}, "magnitude=-1.0 must be positive"),
    (large_logits, {"magnitude": 1e5}, "magnitude=100000.0 must be at most 6e4"),
    (large_logits, {"min_vocab": 3, "max_vocab": 2}, "min_vocab=3 is larger than max_vocab=2"),
    (lambda **kw: shifts((2, 1), **kw), {"max_abs": -1.0}, "max_abs=-1.0 must be at least 0"),
    (lambda **kw: shifts((2, 1), **kw), {"max_abs": 9.0, "dyadic": True}, "max_abs=9.0 must be at most 8 with dyadic=True"),
    (lambda **kw: shifts((2, -1), **kw), {}, "shape[1]=-1 must be a non-negative int"),
    (lambda **kw: targets(np.zeros((2, 0))), {}, "logits_array with shape (2, 0)"),
    (lambda **kw: targets([[0.0, 1.0]]), {}, "logits_array with shape None must be a numpy array"),
    (activation_inputs, {"min_abs": 0.0}, "min_abs=0.0 must be positive"),
    (activation_inputs, {"min_abs": 2.0, "max_abs": 1.0}, "min_abs=2.0 is larger than max_abs=1.0"),
    (activation_inputs, {"max_abs": 50.0}, "max_abs=50.0 must be at most 40"),
    (activation_inputs, {"min_side": 0}, "min_side=0 must be at least 1"),
    (paddings, {"max_length": -1}, "max_length=-1 must be at least 0"),
    (hidden_states, {"min_batch": 0}, "min_batch=0 must be at least 1"),
    (hidden_states, {"min_seq": 4, "max_seq": 2}, "min_seq=4 is larger than max_seq=2"),
    (hidden_states, {"max_d": True}, "max_d=True must be an int"),
    (hidden_states, {"min_scale": -1.0}, "min_scale=-1.0 must be positive"),
    (lambda **kw: feed_forward_weights(0, **kw), {}, "d_model=0 must be at least 1"),
    (lambda **kw: feed_forward_weights(4, **kw), {"min_hidden": 0}, "min_hidden=0 must be at least 1"),
    (lambda **kw: feed_forward_weights(4, **kw), {"min_hidden": 20}, "min_hidden=20 is larger than max_hidden=16"),
]


@pytest.mark.parametrize(("strategy", "kwargs", "message"), BAD_ARGUMENTS, ids=lambda v: v if isinstance(v, str) else None)
def test_bad_arguments_are_refused_by_name(strategy, kwargs, message):
    with pytest.raises(InvalidArgument) as refused:
        strategy(**kwargs)
    assert message in str(refused.value)


# -- logits -----------------------------------------------------------------------------------


@FEW
@given(logits(masked=True))
def test_masked_logits_keep_a_finite_entry_per_row(x):
    assert np.isfinite(x).any(axis=-1).all()
    assert not np.isnan(x).any() and not np.isposinf(x).any()


@pytest.mark.parametrize(
    ("description", "condition"),
    [
        ("a uniform row of V >= 2", lambda x: x.shape[-1] >= 2 and np.all(x == x[..., :1])),
        ("a tied maximum", lambda x: x.shape[-1] >= 2 and np.all((x == x.max(axis=-1, keepdims=True)).sum(axis=-1) >= 2)),
        ("a dominant logit", lambda x: x.shape[-1] >= 2 and np.all(np.sort(x, axis=-1)[..., -1] - np.sort(x, axis=-1)[..., -2] > 5)),
        ("V = 1", lambda x: x.shape[-1] == 1),
        ("three axes", lambda x: x.ndim == 3),
    ],
)
def test_logits_reach_their_edge_cases(description, condition):
    find(logits(), condition, settings=SEARCH)


def test_masked_logits_reach_a_row_with_one_finite_entry():
    find(logits(masked=True, min_vocab=3), lambda x: np.any(np.isfinite(x).sum(axis=-1) == 1), settings=SEARCH)


@FEW
@given(st.data())
def test_dyadic_logits_plus_dyadic_shifts_are_exact_in_bfloat16(data):
    torch = pytest.importorskip("torch")
    x = data.draw(logits(dyadic=True))
    c = data.draw(shifts(x.shape[:-1] + (1,), dyadic=True))
    total = x + c
    assert np.all(np.abs(x) <= 8) and np.all(x * 16 == np.round(x * 16))
    assert np.all(np.abs(c) <= 8) and np.all(c * 16 == np.round(c * 16))
    assert np.array_equal(torch.as_tensor(total).to(torch.bfloat16).double().numpy(), total)


@FEW
@given(large_logits())
def test_large_logits_reach_the_magnitude_and_stay_finite_in_float16(x):
    peak = np.abs(x).max()
    assert 1e4 - 100 <= peak <= 1e4 + 100
    assert np.isfinite(x.astype(np.float16)).all()


def test_large_logits_include_the_courses_all_1e4_row():
    find(large_logits(), lambda x: x.shape[-1] >= 2 and np.all(x == 1e4), settings=SEARCH)


@FEW
@given(st.data())
def test_targets_index_the_vocabulary(data):
    x = data.draw(logits())
    t = data.draw(targets(x))
    assert isinstance(t, np.ndarray) and t.dtype == np.int64 and t.shape == x.shape[:-1]
    assert np.all((0 <= t) & (t < x.shape[-1]))


def test_targets_reach_the_row_maximum_and_minimum():
    x = np.array([[0.0, 3.0, -2.0], [5.0, 1.0, 2.0]])
    find(targets(x), lambda t: np.array_equal(t, [1, 0]), settings=SEARCH)
    find(targets(x), lambda t: np.array_equal(t, [2, 1]), settings=SEARCH)


# -- activation inputs ------------------------------------------------------------------------


@FEW
@given(activation_inputs(min_abs=1e-2, max_abs=5.0))
def test_activation_inputs_stay_in_their_magnitude_range(x):
    magnitude = np.abs(x[x != 0])
    assert np.all((magnitude >= 1e-2 * (1 - 1e-12)) & (magnitude <= 5.0 * (1 + 1e-12)))


@pytest.mark.parametrize(
    ("description", "condition"),
    [
        ("exact zeros among non-zeros", lambda x: (x == 0).any() and (x != 0).any()),
        ("one value repeated", lambda x: x.size >= 2 and np.all(x == x.flat[0]) and x.flat[0] != 0),
        ("values of both signs", lambda x: (x > 0).any() and (x < 0).any()),
        ("a value below 0.01 and one above 10", lambda x: (np.abs(x[x != 0]) < 0.01).any() and (np.abs(x) > 10).any()),
    ],
)
def test_activation_inputs_reach_their_edge_cases(description, condition):
    find(activation_inputs(), condition, settings=SEARCH)


# -- feed-forward -----------------------------------------------------------------------------


@FEW
@given(hidden_states(max_batch=2, max_seq=4, max_d=5))
def test_hidden_states_respect_their_bounds(x):
    B, T, d = x.shape
    assert 1 <= B <= 2 and 1 <= T <= 4 and 1 <= d <= 5


def test_hidden_states_reach_a_single_token():
    find(hidden_states(), lambda x: x.shape[:2] == (1, 1), settings=SEARCH)


@FEW
@given(st.integers(1, 8).flatmap(lambda d: st.tuples(st.just(d), feed_forward_weights(d))))
def test_feed_forward_weights_default_to_gpt2s_width(d_and_params):
    d, p = d_and_params
    assert p["W1"].shape == (d, 4 * d) and p["b1"].shape == (4 * d,)
    assert p["W2"].shape == (4 * d, d) and p["b2"].shape == (d,)


def test_feed_forward_weights_reach_one_hidden_unit():
    find(feed_forward_weights(3, min_hidden=1, max_hidden=12), lambda p: p["W1"].shape == (3, 1), settings=SEARCH)
