"""Direct draws: hypothesis's own strategies and random choices, drawn without its engine, for the long soak.

Of a soak example's time, about a third is hypothesis's engine (its tree of the choices made so far, the
mutation of earlier examples, the bookkeeping per example) and half is drawing, where each choice opens
spans, records a node and feeds the tree. `DirectData` is hypothesis's ConjectureData with that
bookkeeping left out: the same strategies call the same provider with the same constraints, so an example
is drawn from the same distribution as hypothesis's random generation, and its choices (`recorded`)
replay in hypothesis's own ConjectureData to the same values, so hypothesis can shrink a failure it did
not find (tests/test_direct.py replays every invariant's examples). `DirectProvider` draws a bytes
choice of variable length in one call: hypothesis draws such a length byte by byte, each byte a choice
of its own through ConjectureData (about 190 µs for the 64 bytes an array draws on average), and here
the length comes from the same geometric law in a plain loop.

Both lean on hypothesis's internals (6.131 and later; pinned in constraints.txt). `available()` says
whether they are there; where not, the runner searches with hypothesis's engine alone.
"""

from __future__ import annotations

import functools
import math

try:
    from hypothesis.control import BuildContext
    from hypothesis.database import InMemoryExampleDatabase, choices_to_bytes
    from hypothesis.errors import UnsatisfiedAssumption
    from hypothesis.internal.conjecture.data import ConjectureData
    from hypothesis.internal.conjecture.providers import COLLECTION_DEFAULT_MAX_SIZE, INTEGERS_DISTRIBUTION, HypothesisProvider
    from hypothesis.internal.conjecture.utils import _calc_p_continue
    from hypothesis.internal.floats import float_to_int, int_to_float
    from hypothesis.strategies._internal.core import BuildsStrategy
    from hypothesis.strategies._internal.lazy import unwrap_strategies
    from hypothesis.strategies._internal.strategies import MappedStrategy
except ImportError:  # another hypothesis: the runner uses its engine throughout
    ConjectureData = HypothesisProvider = None


def available():
    """Whether this hypothesis has the internals direct draws use."""
    return ConjectureData is not None


if available():

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

    def database_of(key, choices):
        """An example database from which hypothesis, its test stored under `key`, replays `choices` and then shrinks them.

        They go in the secondary corpus: hypothesis takes a failure from the primary one as shrunk already.
        """
        database = InMemoryExampleDatabase()
        database.save(key + b".secondary", choices_to_bytes(choices))
        return database
