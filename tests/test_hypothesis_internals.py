"""Conformance: each private hypothesis name in invariants/hypothesis_internals.py still does what the suite uses it for.

Run on the pinned hypothesis (tox -e tests) and on the newest release (tox -e hypothesis-newest); a failure names
the name that changed, so the fix starts in that one module.
"""

from __future__ import annotations

import inspect
import random
from types import SimpleNamespace

import hypothesis
import pytest
from hypothesis import Phase, assume, given, settings
from hypothesis import strategies as st
from hypothesis.database import InMemoryExampleDatabase
from hypothesis.errors import InvalidArgument

from invariants import hypothesis_internals as internals


@pytest.fixture(autouse=True)
def _every_name_found(request):
    """Where a name is missing, the first test fails naming it and the rest skip."""
    if not internals.AVAILABLE and request.node.name != "test_every_name_is_found":
        pytest.skip(f"this hypothesis lacks an internal name: {internals.MISSING}")


def _changed(name, what):
    return f"hypothesis {hypothesis.__version__} changed {name}: {what} (invariants/hypothesis_internals.py relies on it)"


def _parameters(function):
    return list(inspect.signature(function).parameters)


def test_every_name_is_found():
    assert internals.AVAILABLE, _changed("an internal name", internals.MISSING)


def test_conjecture_data_draws_through_the_provider_and_replays_the_choices_recorded():
    data = internals.DirectData(random.Random(0))
    assert isinstance(data.provider, internals.DirectProvider), _changed("ConjectureData(random=, provider=)", "the provider class is not used")
    drawn = [data.draw_integer(0, 100), data.draw_boolean(), data.draw_float(allow_nan=False), data.draw_bytes(1, 8)]
    assert len(data.recorded) == 4, _changed("ConjectureData._draw", f"the overridden _draw saw {len(data.recorded) - 2} of 2 draws")
    replay = internals.ConjectureData.for_choices(data.recorded)
    again = [replay.draw_integer(0, 100), replay.draw_boolean(), replay.draw_float(allow_nan=False), replay.draw_bytes(1, 8)]
    assert again == drawn, _changed("ConjectureData.for_choices", f"replayed {again}, drew {drawn}")
    assert replay.choices == tuple(data.recorded), _changed("ConjectureData.choices", "not the choices replayed")


@pytest.mark.parametrize(("method", "parameters"), [
    ("_draw", ["self", "choice_type", "constraints", "observe", "forced"]),
    ("_pooled_constraints", ["self", "choice_type", "constraints"]),
    ("start_span", ["self", "label"]),
    ("stop_span", ["self", "discard"]),
    ("draw_integer", ["self", "min_value", "max_value", "weights", "shrink_towards", "forced", "observe"]),
    ("draw_bytes", ["self", "min_size", "max_size", "forced", "observe"]),
])
def test_the_conjecture_data_methods_direct_draws_override_keep_their_signatures(method, parameters):
    found = getattr(internals.ConjectureData, method, None)
    assert found is not None, _changed(f"ConjectureData.{method}", "it is gone")
    assert _parameters(found) == parameters, _changed(f"ConjectureData.{method}", f"its parameters are {_parameters(found)}")


def test_a_span_opened_by_a_strategy_is_closed_and_the_depth_comes_back():
    data = internals.DirectData(random.Random(1))
    with internals.build_context(data):
        data.draw(st.lists(st.tuples(st.integers(), st.booleans()), max_size=4))
    assert data.depth == 0, _changed("ConjectureData.start_span/stop_span", f"depth {data.depth} after a draw")


def test_the_provider_s_private_draws_answer_as_direct_draws_call_them():
    provider = internals.DirectData(random.Random(2)).provider
    assert provider._random is not None, _changed("HypothesisProvider._random", "no random.Random on a test case's provider")
    constant = provider._maybe_draw_constant("bytes", {"min_size": 0, "max_size": 8}, p=1.0)
    assert constant is None or isinstance(constant, bytes), _changed("HypothesisProvider._maybe_draw_constant", f"gave {constant!r}")
    base = internals.HypothesisProvider._draw_integer_from_distribution
    assert _parameters(base) == ["self", "min_value", "max_value"], _changed("HypothesisProvider._draw_integer_from_distribution",
                                                                            f"its parameters are {_parameters(base)}")
    assert all(3 <= base(provider, 3, 9) <= 9 for _ in range(100))
    p = internals.INTEGERS_DISTRIBUTION.cdf(5.5)
    assert 0 < p < 1 and round(internals.INTEGERS_DISTRIBUTION.inverse_cdf(p)) in (5, 6), _changed("INTEGERS_DISTRIBUTION", "cdf/inverse_cdf")


def test_a_bytes_choice_s_defaults_and_length_law_are_hypothesis_s():
    default = inspect.signature(internals.ConjectureData.draw_bytes).parameters["max_size"].default
    assert default == internals.COLLECTION_DEFAULT_MAX_SIZE, _changed("COLLECTION_DEFAULT_MAX_SIZE", f"draw_bytes's default is {default}")
    p = internals._calc_p_continue(32.0, 224)
    assert 0 < p < 1, _changed("_calc_p_continue(desired_avg, max_size)", f"gave {p}")


def test_nan_round_trips_through_its_bits():
    nan = internals.int_to_float(internals.float_to_int(float("nan")))
    assert nan != nan, _changed("float_to_int/int_to_float", f"gave {nan}")


def test_a_map_and_a_builds_unwrap_to_the_classes_direct_draws_take_apart():
    def double(n):
        return 2 * n

    mapped = internals.unwrap_strategies(st.integers(0, 3).map(double))
    assert type(mapped) is internals.MappedStrategy and mapped.pack is double and mapped.mapped_strategy is not None, \
        _changed("MappedStrategy(mapped_strategy, pack)", f"unwrapped to {type(mapped).__name__}")
    built = internals.unwrap_strategies(st.builds(divmod, st.integers(1, 9), b=st.integers(1, 9)))
    assert type(built) is internals.BuildsStrategy and built.target is divmod and len(built.args) == 1 and set(built.kwargs) == {"b"}, \
        _changed("BuildsStrategy(target, args, kwargs)", f"unwrapped to {type(built).__name__}")
    assert internals.unwrapped(st.integers()) is not st.integers(), _changed("unwrap_strategies", "a lazy strategy came back as itself")


def test_strategies_validate_and_say_whether_they_are_empty():
    assert st.nothing().is_empty and not st.integers().is_empty, _changed("SearchStrategy.is_empty", "wrong")
    with pytest.raises(InvalidArgument):
        internals.unwrapped(st.integers(5, 1))


def test_a_composite_and_a_flatmap_draw_inside_a_build_context():
    @st.composite
    def pairs(draw):
        n = draw(st.integers(1, 5))
        return n, draw(st.integers(0, n).flatmap(lambda k: st.just(k)))

    data = internals.DirectData(random.Random(3))
    with internals.build_context(data):
        n, k = data.draw(pairs())
    assert 0 <= k <= n <= 5, _changed("BuildContext(data, wrapped_test=None)", f"drew {(n, k)}")


def test_a_rejected_draw_and_an_empty_one_raise_what_the_runner_catches():
    data = internals.DirectData(random.Random(4))
    with pytest.raises(internals.UnsatisfiedAssumption):
        with internals.build_context(data):
            data.draw(st.integers().map(lambda n: assume(False)))
    with pytest.raises(internals.StopTest):
        internals.DirectData(random.Random(4)).draw(st.nothing())


def test_choices_saved_under_a_database_key_are_replayed_first():
    key, seen = b"conformance", []

    @settings(database=internals.database_of(key, [7]), phases=(Phase.reuse,), max_examples=1)
    @given(st.integers(0, 100))
    def replayed(n):
        seen.append(n)

    internals.set_database_key(replayed, key)
    replayed()
    assert seen == [7], _changed(f"the database key attribute {internals.DATABASE_KEY} or the {internals.SECONDARY!r} corpus", f"saw {seen}")


class _Keys(InMemoryExampleDatabase):
    def __init__(self):
        super().__init__()
        self.keys = set()

    def save(self, key, value):
        self.keys.add(key)
        super().save(key, value)


def test_a_digest_gives_one_function_a_database_key_per_test():
    keys = []
    for digest in (b"a", b"b"):
        database = _Keys()

        def test(n):
            assert n < 5

        internals.set_database_key(test, digest, digest=True)
        with pytest.raises(AssertionError):
            settings(database=database, max_examples=50)(given(st.integers(0, 10))(test))()
        keys.append(database.keys)
    assert keys[0] and keys[1] and keys[0].isdisjoint(keys[1]), _changed(internals.DIGEST, "one database key for two digests")


def test_a_pytest_item_s_key_is_the_one_its_failures_are_saved_under():
    database = _Keys()

    @settings(database=database, max_examples=50)
    @given(st.integers(0, 10))
    def test(n):
        assert n < 5

    keys = {internals.pytest_item_key(SimpleNamespace(obj=test, nodeid=f"x.py::test[{p}]")) for p in "ab"}  # the last one set stays
    with pytest.raises(AssertionError):
        test()
    assert len(keys) == 2 and internals.pytest_item_key(SimpleNamespace(obj=test, nodeid="x.py::test[b]")) in database.keys, _changed(
        "function_digest", "a pytest item's failures are saved under another key than the one HypoFuzz computes")


def test_st_data_s_object_holds_the_conjecture_data_it_draws_from():
    drawn = []

    @settings(max_examples=3, database=None)
    @given(st.data())
    def test(data):
        assert isinstance(getattr(data, internals.CONJECTURE_DATA, None), internals.ConjectureData), \
            _changed(f"st.data()'s {internals.CONJECTURE_DATA}", "not a ConjectureData")
        drawn.append(internals.draw_of(data)(st.integers(0, 9), "n"))

    test()
    assert drawn and all(0 <= n <= 9 for n in drawn)


def test_the_pool_of_local_literals_is_pinned_empty_and_given_back():
    """The pin's effect on draws is tests/test_runner.py's (a host module full of literals changes nothing); here its parts."""
    loaded_modules_constants = internals._providers._get_local_constants
    assert isinstance(loaded_modules_constants(), internals.Constants), _changed("_get_local_constants", "it returns no Constants")
    with internals.no_local_constants():
        pinned = internals._providers._get_local_constants()
        assert not any(pinned.set_for_type(kind) for kind in ("integer", "float", "bytes", "string")), _changed("Constants", "not empty")
        assert len(internals.CONSTANTS_CACHE.cache) == 0, _changed("CONSTANTS_CACHE.cache", "not cleared")
    assert internals._providers._get_local_constants is loaded_modules_constants, _changed("_get_local_constants", "not given back")
