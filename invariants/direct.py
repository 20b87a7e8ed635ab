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

import math

try:
    from hypothesis.control import BuildContext
    from hypothesis.database import InMemoryExampleDatabase, choices_to_bytes
    from hypothesis.internal.conjecture.data import ConjectureData
    from hypothesis.internal.conjecture.providers import HypothesisProvider
    from hypothesis.internal.conjecture.utils import _calc_p_continue
    from hypothesis.internal.floats import float_to_int, int_to_float
    from hypothesis.strategies._internal.lazy import unwrap_strategies
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
            average = min(max(min_size * 2, min_size + 5), 0.5 * (min_size + max_size))
            p_continue = _calc_p_continue(average - min_size, max_size - min_size)
            size, uniform = min_size, self._random.random
            while size < max_size and uniform() < p_continue:
                size += 1
            return self._random.randbytes(size)

    class DirectData(ConjectureData):
        """ConjectureData that draws and records choices, nothing else: no spans, no tree, no observations."""

        def __init__(self, random):
            super().__init__(random=random, provider=DirectProvider)
            self.recorded = []  # the choices, in order: what hypothesis replays

        def draw(self, strategy, label=None, observe_as=None):
            unwrapped = _unwrapped(strategy)
            if unwrapped is None:
                self.mark_invalid(f"empty strategy {strategy!r}")
            self.depth += 1
            try:
                return unwrapped.do_draw(self)
            finally:
                self.depth -= 1

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
