"""The one door to hypothesis's internals: every private hypothesis name the suite uses is here, and nowhere else.

Hypothesis's guide says its internals are not API: they change in patch releases, without deprecation.
So the runner and the strategies use hypothesis's public API and this module. Each name below says what
it is for and the first release that has it as it is used here; tests/test_hypothesis_internals.py uses
each the way the suite does, with a message naming it when it breaks, on the pinned hypothesis
(constraints.txt) and on the newest release (`tox -e hypothesis-newest`), and pyproject's floor is the
oldest release that passes it. Where this hypothesis lacks a name, AVAILABLE is False, MISSING says
which, and the suite uses the public API alone: the engine throughout, st.data()'s own draw, a plain map,
no pool pinned.

The documented extension point, a backend in AVAILABLE_PROVIDERS chosen by `settings(backend=...)`, cannot
stand in for these: under any backend but "hypothesis" the engine drops its mutations of earlier examples
and its tree of novel prefixes and asks the backend for every input (`using_hypothesis_backend` in its
engine), which would change every example the ci profile draws; and direct draws leave the engine out,
which a backend cannot.

Direct draws (the soak past hypothesis's engine, docs/power.md): `DirectData` is hypothesis's
ConjectureData without the engine's bookkeeping (spans, the tree, observations, printer records): the
same strategies call the same provider with the same constraints, so an example comes from the same
distribution as hypothesis's random generation, and its choices (`recorded`) replay in hypothesis's own
ConjectureData to the same values, so hypothesis shrinks a failure it did not find. `DirectProvider`
draws a variable-length bytes choice in one call (hypothesis draws its length byte by byte, one choice
each: about 190 µs for an array's 64 bytes) from the same geometric law.
"""

from __future__ import annotations

import functools
import math
from contextlib import contextmanager

from hypothesis.database import InMemoryExampleDatabase

try:
    # The context composites and flatmaps draw in, BuildContext(data, wrapped_test=...) (6.133.2).
    from hypothesis.control import BuildContext

    # The example database's encoding of a choice sequence (6.124.9), for hypothesis to replay a direct draw's failure.
    from hypothesis.database import choices_to_bytes

    # What a rejected draw raises, and what ends one early: both undocumented (6.100 or older).
    from hypothesis.errors import StopTest, UnsatisfiedAssumption  # noqa: F401 - the runner's, through this module

    # The module whose _get_local_constants (6.131.1) gives the literals of loaded local modules, mixed into draws.
    from hypothesis.internal.conjecture import providers as _providers

    # Direct draws subclass it; for_choices replays their choices (6.123.5); _draw(choice_type, constraints, *, observe,
    # forced) (6.131.25), _pooled_constraints (6.130.7) and start_span/stop_span (6.128.1) are overridden.
    from hypothesis.internal.conjecture.data import ConjectureData
    from hypothesis.internal.conjecture.providers import (
        COLLECTION_DEFAULT_MAX_SIZE,  # a bytes choice's default max_size, as ConjectureData.draw_bytes has it (6.124.1)
        CONSTANTS_CACHE,  # the values the local literals allow, per choice kind (6.131.1): cleared around the pin
        INTEGERS_DISTRIBUTION,  # the integer law _draw_integer_from_distribution inverts (6.152.9)
        Constants,  # what _get_local_constants returns (6.131.9): an empty one is the pin
        # The random provider direct draws subclass (6.124.9): _maybe_draw_constant (6.131.1), _random (6.124.9),
        # _draw_integer_from_distribution (6.152.9).
        HypothesisProvider,
    )

    # many()'s probability of one more element for an average size: the law of a bytes choice's length (6.100 or older).
    from hypothesis.internal.conjecture.utils import _calc_p_continue

    # One NaN object per float draw, as ConjectureData makes it (6.100 or older).
    from hypothesis.internal.floats import float_to_int, int_to_float

    # A test function's example-database key, a digest of its source, signature and DIGEST (6.100 or older): how hypothesis's
    # pytest plugin and HypoFuzz key a parametrized @given test (invariants.examples_db.FuzzTargetKeys renames those keys).
    from hypothesis.internal.reflection import function_digest

    # Drawn without their printer records: a builds's target, args and kwargs (6.100 or older).
    from hypothesis.strategies._internal.core import BuildsStrategy

    # The strategy a lazy one stands for, as hypothesis draws it (6.100 or older).
    from hypothesis.strategies._internal.lazy import unwrap_strategies

    # Drawn without its warnings filter, span and printer record: a map's mapped_strategy and pack (6.100 or older).
    from hypothesis.strategies._internal.strategies import MappedStrategy
except ImportError as missing:  # another hypothesis: the public API alone
    AVAILABLE, MISSING = False, str(missing)
else:
    AVAILABLE, MISSING = True, None

# Attributes hypothesis reads or sets on objects of ours (all 6.100 or older):
DIGEST = "_hypothesis_internal_add_digest"  # bytes mixed into a test's example-database key (parametrized cases)
DATABASE_KEY = "_hypothesis_internal_database_key"  # a test's example-database key, set outright
SECONDARY = b".secondary"  # the database key's suffix for examples to replay and shrink (the primary ones count as shrunk)
CONJECTURE_DATA = "conjecture_data"  # st.data()'s object's ConjectureData
# And strategies' own: validate(), is_empty and do_draw(data), undocumented (6.100 or older), called by unwrapped() and DirectData.


def draw_of(data):
    """draw(strategy, label) on st.data()'s object: straight to its ConjectureData, or its own draw where there is none.

    DataObject.draw wraps every draw in a check that the strategy left the global random alone (two
    copies of random's state) and formats a note for the final replay; the choices drawn are the same
    either way. The runner's Case records and reports the draws itself, and an invariant draws about 20
    times per example, so the direct draw saves about a tenth of an example's CPU time (docs/power.md).
    """
    conjecture_data = getattr(data, CONJECTURE_DATA, None) if AVAILABLE else None
    if conjecture_data is None:
        return data.draw
    return lambda strategy, label: conjecture_data.draw(strategy)


def set_database_key(test, key, *, digest=False):
    """Store `test`'s examples under `key`: mixed into its own key (`digest`, for a function shared by many tests) or as it."""
    setattr(test, DIGEST if digest else DATABASE_KEY, key)


def pytest_item_key(item):
    """The example-database key of a @given test's pytest item, as hypothesis's pytest plugin and HypoFuzz give it: digest and node id."""
    if not AVAILABLE:
        raise RuntimeError(f"keying a fuzz target needs a hypothesis internal this release lacks: {MISSING}")
    inner = item.obj.hypothesis.inner_test
    set_database_key(inner, item.nodeid.encode(), digest=True)
    return function_digest(inner)


def database_of(key, choices):
    """An example database from which hypothesis, its test stored under `key`, replays `choices` and then shrinks them."""
    database = InMemoryExampleDatabase()
    database.save(key + SECONDARY, choices_to_bytes(choices))
    return database


@contextmanager
def no_local_constants():
    """Hypothesis draws now and then from the literals of every local module imported so far; pin that pool empty meanwhile.

    Without this a derandomized (ci) run would draw differently in a process that imported other modules
    first (a host's own code, the implementation under test, the rest of this suite under xdist), and the
    same invariant on the same code could pass in one run and fail in the next. It is a swap of a function
    of hypothesis's, process-wide for its duration: runs in threads of one process would share it.
    """
    if not AVAILABLE:
        yield
        return
    loaded_modules_constants, empty = _providers._get_local_constants, Constants()
    CONSTANTS_CACHE.cache.clear()  # it holds the pool's values per choice kind
    _providers._get_local_constants = lambda: empty
    try:
        yield
    finally:
        _providers._get_local_constants = loaded_modules_constants
        CONSTANTS_CACHE.cache.clear()


def unwrapped(strategy):
    """The strategy a (lazy) strategy stands for, validated: what hypothesis itself draws from; `strategy` where that is not found."""
    strategy.validate()
    return unwrap_strategies(strategy) if AVAILABLE else strategy


if AVAILABLE:

    class DirectProvider(HypothesisProvider):
        """Hypothesis's provider, with a bytes choice's length drawn in one loop instead of one choice per byte."""

        def draw_bytes(self, min_size=0, max_size=8 * 1024):
            constant = self._maybe_draw_constant("bytes", {"min_size": min_size, "max_size": max_size})
            if constant is not None:
                return constant
            # The law of hypothesis's many(): min_size forced, then go on with probability p_continue up to max_size.
            # The steps taken are geometric, P(k >= n) = p_continue**n, so one uniform U gives k = floor(log U / log p_continue).
            average = min(max(min_size * 2, min_size + 5), 0.5 * (min_size + max_size))
            p_continue = _calc_p_continue(average - min_size, max_size - min_size)
            extra = max_size - min_size
            if p_continue <= 0 or extra == 0:
                steps = 0
            elif p_continue >= 1:
                steps = extra
            else:
                steps = min(int(math.log(1.0 - self._random.random()) / math.log(p_continue)), extra)  # 1 - U in (0, 1]
            return self._random.randbytes(min_size + steps)

        def _draw_integer_from_distribution(self, min_value, max_value):
            # Hypothesis's law for a bounded range: p uniform between the CDF at its two ends, the integer nearest the inverse CDF of p.
            # The two ends are computed once per range here (hypothesis computes them on every draw); the same random() calls.
            ends = _cdf_ends(min_value, max_value)
            if ends is None:  # unbounded, or too narrow in CDF space: hypothesis's own fallbacks
                return super()._draw_integer_from_distribution(min_value, max_value)
            lo, hi = ends
            while (p := lo + self._random.random() * (hi - lo)) in (0, 1):
                pass
            return min(max(round(INTEGERS_DISTRIBUTION.inverse_cdf(p)), min_value), max_value)

    @functools.lru_cache(maxsize=4096)
    def _cdf_ends(min_value, max_value):
        """(CDF at min_value - 1/2, CDF at max_value + 1/2) of hypothesis's integer law, or None where it falls back to another."""
        if min_value is None or max_value is None:
            return None
        try:
            lo, hi = INTEGERS_DISTRIBUTION.cdf(min_value - 0.5), INTEGERS_DISTRIBUTION.cdf(max_value + 0.5)
        except OverflowError:
            return None
        return (lo, hi) if hi - lo >= 1e-13 else None

    class DirectData(ConjectureData):
        """ConjectureData that draws and records choices, nothing else: no spans, no tree, no observations, no printer records."""

        def __init__(self, random):
            super().__init__(random=random, provider=DirectProvider)
            self.recorded = []  # the choices, in order: what hypothesis replays

        def draw(self, strategy, label=None, observe_as=None):
            unwrapped = _unwrapped(strategy)
            if unwrapped is None:
                self.mark_invalid(f"empty strategy {strategy!r}")
            self.depth += 1
            try:
                kind = type(unwrapped)
                if kind is MappedStrategy and not isinstance(unwrapped.pack, type):
                    return self._draw_mapped(unwrapped)
                if kind is BuildsStrategy and (unwrapped.args or unwrapped.kwargs):
                    return self._draw_built(unwrapped)
                return unwrapped.do_draw(self)
            finally:
                self.depth -= 1

        def _draw_mapped(self, mapped):
            """MappedStrategy.do_draw without its warnings filter, span and printer record: the same draws, the same three tries."""
            for _ in range(3):
                try:
                    return mapped.pack(self.draw(mapped.mapped_strategy))
                except UnsatisfiedAssumption:
                    continue
            raise UnsatisfiedAssumption

        def _draw_built(self, builds):
            """BuildsStrategy.do_draw without its argument labels and printer record: each argument drawn in order, then the call."""
            args = [self.draw(arg) for arg in builds.args]
            kwargs = {name: self.draw(value) for name, value in builds.kwargs.items()}
            return builds.target(*args, **kwargs)

        def draw_integer(self, min_value=None, max_value=None, *, weights=None, shrink_towards=0, forced=None, observe=True):
            """ConjectureData.draw_integer straight to the provider, without its argument checks and constraint pooling."""
            if forced is None:
                forced = self.provider.draw_integer(min_value, max_value, weights=weights, shrink_towards=shrink_towards)
            if observe:
                self.recorded.append(forced)
            return forced

        def draw_bytes(self, min_size=0, max_size=COLLECTION_DEFAULT_MAX_SIZE, *, forced=None, observe=True):
            """ConjectureData.draw_bytes straight to the provider, without its argument checks and constraint pooling."""
            if forced is None:
                forced = self.provider.draw_bytes(min_size, max_size)
            if observe:
                self.recorded.append(forced)
            return forced

        def start_span(self, label):
            self.depth += 1

        def stop_span(self, *, discard=False):
            self.depth -= 1

        def _pooled_constraints(self, choice_type, constraints):
            return constraints

        def _draw(self, choice_type, constraints, *, observe, forced):
            value = forced if forced is not None else getattr(self.provider, f"draw_{choice_type}")(**constraints)
            if choice_type == "float" and math.isnan(value):  # as ConjectureData: one NaN object per draw
                value = int_to_float(float_to_int(value))
            if observe:
                self.recorded.append(value)
            return value

    _UNWRAPPED = {}  # id(strategy) -> (strategy, unwrapped): the strategy is held, so its id is not reused
    _MAX_UNWRAPPED = 16384  # strategies built per example (a drawn config's params) would otherwise pile up

    def _unwrapped(strategy):
        """The strategy validated and unwrapped, None if it is empty; remembered, since unwrapping costs more than many a draw."""
        found = _UNWRAPPED.get(id(strategy))
        if found is None:
            strategy.validate()  # InvalidArgument propagates, as from hypothesis's own draw, and nothing is remembered
            if len(_UNWRAPPED) >= _MAX_UNWRAPPED:
                _UNWRAPPED.clear()
            found = _UNWRAPPED[id(strategy)] = (strategy, None if strategy.is_empty else unwrap_strategies(strategy))
        return found[1]

    def build_context(data):
        """The context composites and flatmaps expect while they draw."""
        return BuildContext(data, wrapped_test=None)
