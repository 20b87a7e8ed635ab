"""Run one invariant against one implementation under hypothesis; the result is an Outcome, whatever happens.

pytest-free on purpose: the plugin, the gate and the mutation matrix all call run_invariant
and render the same Outcome; none of them parses a message: a failure's parts (example, problem,
hint, notes) and its figures (`measured`) are fields, and its text is rendered from them.
"""

from __future__ import annotations

import os
import random
import time
import traceback
import unittest
import zlib
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import numpy as np
from hypothesis import Phase, given
from hypothesis import seed as hypothesis_seed
from hypothesis import settings as hypothesis_settings
from hypothesis import strategies as st
from hypothesis.database import MultiplexedDatabase
from hypothesis.errors import Flaky, HypothesisException

from invariants import hypothesis_internals as internals
from invariants.asserts import InvariantViolation
from invariants.conventions import Declared
from invariants.examples_db import example_key
from invariants.failure_text import IMPLEMENTATION_FAILURES, describe_case, describe_value, format_failure  # noqa: F401  (public here too)
from invariants.protocol import FUNCTIONS, ImplementationError, TransportLost

if TYPE_CHECKING:
    from hypothesis.strategies import SearchStrategy

    from invariants.protocol import Implementation
    from invariants.registry import Invariant

T = TypeVar("T")

STATUSES = ("passed", "skipped", "failed", "error")  # failed: a wrong answer; error: the implementation could not be evaluated
FAILING = ("failed", "error")  # the statuses that are evidence of a bug: a wrong answer, or none


class InvariantSkipped(unittest.SkipTest):
    """The invariant does not apply to this implementation; the message says why.

    A SkipTest, so hypothesis re-raises it at once when a check raises it mid-search.
    """


class _ShrinkLimitReached(BaseException):
    """The shrink budget is spent: stop hypothesis at once and report the smallest example so far."""


@dataclass(frozen=True)
class Outcome:
    """What one run of one invariant on one implementation came to."""

    invariant: str  # its name, e.g. "attention.causal_non_leakage"
    status: str  # one of STATUSES
    reason: str  # one line: how it held, why it was skipped, or the first line of what broke
    examples: int  # examples hypothesis ran, rejected draws included
    seconds: float
    examples_to_failure: int | None = None  # examples up to the first failing one, inclusive
    seconds_to_failure: float | None = None
    example: tuple = ()  # the shrunk case: ((label, description), ...)
    problem: str = ""  # the violated assertion with its numbers, or what the implementation did instead of answering
    hint: str = ""
    notes: tuple = ()  # what follows the hint: hypothesis's @reproduce_failure line (its `replay`), a note on the shrinking
    statement: str = ""  # the invariant's statement, for a failure
    report: str = ""  # the whole failure, worded once from the fields above (format_failure): statement, implementation, example, ...
    declared: bool = False  # skipped because of a convention the implementation declares
    lost: str | None = None  # the transport's cause when the implementation could no longer be reached
    calls: tuple = field(default=(), repr=False)  # ((name, args, answer or exception), ...): what the failing example asked and got
    check_crashed: bool = False  # an error raised by the check's own code or hypothesis, not by the implementation
    measured: dict = field(default_factory=dict)  # a failure's figures as data (measured_of); what reads them never parses `problem`

    @property
    def passed(self) -> bool:
        return self.status == "passed"


class Case:
    """Draws an invariant's inputs and remembers them, labelled, for the failure report."""

    def __init__(self, draw: Callable[..., Any]) -> None:
        self._draw = draw
        self.drawn: dict[str, Any] = {}
        self.calls: list[tuple[str, Any, Any]] = []  # (name, args, answer or exception) for each call into the implementation, in order

    def draw(self, strategy: SearchStrategy[T], label: str) -> T:
        value = self._draw(strategy, label=label)
        self.drawn[label] = value
        return value


def headline(text):
    """The first line of a text, for a one-line display (a renderer: what it gives is shown, never read back)."""
    return text.partition("\n")[0]


class _Search:
    """One hypothesis search: counts examples, remembers the first and the latest failing case, enforces a shrink budget."""

    def __init__(self, inv, impl, shrink_limit):
        self.inv, self.impl, self.shrink_limit = inv, impl, shrink_limit
        self.start = time.perf_counter()
        self.examples = 0
        self.case = None  # the case being run
        self.first_failure = None  # (examples, seconds) at the first failing example, before shrinking
        self.latest_failure = None  # (exception, case): hypothesis only tries smaller examples, so this is the smallest so far
        self.after_failure = 0
        self.limit_reached = False

    def body(self, draw):
        """One example: the invariant run on what draw(strategy, label) gives."""
        self.examples += 1
        if self.first_failure is not None:
            self.after_failure += 1
            if self.shrink_limit is not None and self.after_failure > self.shrink_limit:
                self.limit_reached = True
                raise _ShrinkLimitReached()
        self.case = Case(draw)
        self.impl.calls = self.case.calls  # recorded per example: a failing one's calls become its repro
        try:
            self.inv.check(self.impl, self.case)  # the report is worded once, for the shrunk case (outcome)
        except IMPLEMENTATION_FAILURES as exc:
            self.first_failure = self.first_failure or (self.examples, time.perf_counter() - self.start)
            self.latest_failure = (exc, self.case)
            raise
        finally:
            self.impl.calls = None

    def outcome(self, status, reason, *, problem="", case=None, notes=(), **fields):
        failing = status in FAILING
        at_examples, at_seconds = self.first_failure or (self.examples, time.perf_counter() - self.start)
        example = describe_case(case, self.impl.dtype)
        return Outcome(
            self.inv.name, status, reason, self.examples, round(time.perf_counter() - self.start, 3),
            examples_to_failure=at_examples if failing else None, seconds_to_failure=round(at_seconds, 3) if failing else None,
            example=example, problem=str(problem), hint=self.inv.hint if failing else "", notes=tuple(notes) if failing else (),
            statement=self.inv.statement if failing else "",
            report=format_failure(self.inv, self.impl, problem, example, notes) if failing else "", **fields,
        )

    def failure(self, exc, case, notes=()):
        status = "failed" if isinstance(exc, InvariantViolation) else "error"
        calls = tuple(getattr(case, "calls", ()) or ())
        return self.outcome(status, headline(str(exc)), problem=exc, case=case, notes=notes, calls=calls, measured=measured_of(exc, calls))


FIGURE_CHARS = 2_000  # a figure that is text (what was checked, the call, a value got) longer than this keeps its head and tail


def measured_of(exc, calls):
    """A failure's figures as data (strict JSON): the violation's own fields (invariants.asserts: check, what, got, expected, call,
    the errors, what its law measured), whether the implementation raised or refused the input instead of answering, and the
    windows the failing example's calls were given. Text stays text, never parsed; a non-finite number is "nan", "inf" or "-inf"."""
    windows = [args[FUNCTIONS[name].params.index("window")] for name, args, _ in calls
               if name in FUNCTIONS and "window" in FUNCTIONS[name].params and FUNCTIONS[name].params.index("window") < len(args)]
    return _json_ready({**getattr(exc, "measured", {}), "raised": isinstance(exc, ImplementationError),
                        "refused": bool(getattr(exc, "refused", False)), "windows": [None if w is None else int(w) for w in windows]})


def _json_ready(value):
    """value with numpy scalars as Python's, tuples as lists, non-finite floats as their names, and long text cut in the middle."""
    if isinstance(value, dict):
        return {str(k): _json_ready(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_json_ready(v) for v in value]
    if isinstance(value, (bool, np.bool_)):
        return bool(value)
    if isinstance(value, (int, np.integer)):
        return int(value)
    if isinstance(value, (float, np.floating)):
        return float(value) if np.isfinite(value) else str(float(value))
    if value is None:
        return None
    text = str(value)
    half = FIGURE_CHARS // 2
    return text if len(text) <= FIGURE_CHARS else f"{text[:half]}[... {len(text) - 2 * half} characters cut ...]{text[-half:]}"


def _replay_notes(exc):
    """Hypothesis's own notes on the exception (PEP 678's __notes__, where hypothesis adds them), kept whole: the @reproduce_failure line."""
    return tuple(getattr(exc, "__notes__", ()))



def _engine_examples(direct_draws):
    """A search's examples by hypothesis's engine before direct draws: 20, or None (the engine throughout) for TI_DIRECT_DRAWS=0."""
    if direct_draws not in ("0", "1"):
        raise ValueError(f"TI_DIRECT_DRAWS={direct_draws!r} must be 1 (draw directly past the engine's examples) or 0 (the engine throughout)")
    return 20 if direct_draws == "1" else None


ENGINE_EXAMPLES = _engine_examples(os.environ.get("TI_DIRECT_DRAWS", "1"))  # a longer search runs the engine for this many, then draws directly
DIRECT_REPEATS_TO_STOP = 1_000  # direct draws end once this many in a row repeat earlier ones: the inputs have run out


def run_invariant(inv: Invariant, impl: Implementation, *, settings: hypothesis_settings | None = None, seed: int | None = None,
                  shrink_limit: int | None = None, engine_examples: int | None = ENGINE_EXAMPLES) -> Outcome:
    """Search for a counterexample to `inv` on `impl` and return the Outcome; never raises for what the implementation does.

    `settings` is a hypothesis.settings object (invariants.profiles has the suite's); the loaded
    profile is used when it is None. `seed` (an int) fixes hypothesis's randomness for this run
    (use with derandomize=False). `shrink_limit` caps the examples tried after the first failure;
    the smallest counterexample found by then is reported. A search of more than `engine_examples`
    examples (the thorough soak's 10,000) runs hypothesis's engine for that many (the simplest example
    first, small ones, mutations of earlier ones) and draws the rest directly (invariants.hypothesis_internals: the
    same strategies and choices without the engine's bookkeeping: two to three times as many examples
    a second); a failure found there is handed to hypothesis, which replays and shrinks it.
    `engine_examples=None` runs the engine throughout.
    """
    if engine_examples is not None and (not isinstance(engine_examples, int) or engine_examples < 1):
        raise ValueError(f"engine_examples={engine_examples!r} must be a whole number of at least 1, or None (the engine throughout)")
    reason = inv.skip_reason(impl)
    search = _Search(inv, impl, shrink_limit)
    if reason:
        return search.outcome("skipped", str(reason), declared=isinstance(reason, Declared))
    chosen: hypothesis_settings = settings if settings is not None else hypothesis_settings.default  # type: ignore[assignment]  # a profile is loaded
    direct = 0
    if engine_examples is not None and chosen.max_examples > engine_examples and internals.AVAILABLE:
        direct = chosen.max_examples - engine_examples
    if chosen.derandomize and Phase.reuse in chosen.phases and _has_examples(chosen.database, example_key(inv.name, impl)):
        # The database's failures first (the shared one: invariants.examples_db), then the same examples as every run.
        replay = hypothesis_settings(chosen, phases=[phase for phase in (Phase.reuse, Phase.shrink) if phase in chosen.phases])
        replayed = _outcome_of(search, _hypothesis_test(search, replay, seed))
        if not replayed.passed:
            return replayed
        chosen = hypothesis_settings(chosen, database=None)
    outcome = _outcome_of(search, _hypothesis_test(search, hypothesis_settings(chosen, max_examples=chosen.max_examples - direct), seed))
    if direct and outcome.passed and search.examples >= engine_examples:  # fewer: hypothesis ran out of distinct inputs
        return _draw_directly(search, direct, chosen, seed)
    return outcome


def _has_examples(database, key):
    """Whether `database` (or None) holds examples for hypothesis to replay under `key`: failures, shrunk or not yet."""
    return database is not None and any(next(iter(database.fetch(k)), None) is not None for k in (key, key + internals.SECONDARY))


def _hypothesis_test(search, settings, seed, database_key=None):
    """The hypothesis test running `search` under `settings`, its examples stored under `database_key` (default: invariants.examples_db's)."""

    def body(data):
        search.body(internals.draw_of(data))

    internals.set_database_key(body, search.inv.name.encode(), digest=True)  # the derandomized examples: one seed per invariant
    test = given(st.data())(body)
    internals.set_database_key(test, database_key or example_key(search.inv.name, search.impl))
    # no explain phase: its notes (the lines only failing examples ran, in the suite's files) say nothing about the implementation
    test = hypothesis_settings(settings, report_multiple_bugs=False, phases=[phase for phase in settings.phases if phase != Phase.explain])(test)
    if seed is not None:
        test = hypothesis_seed(seed)(test)
    return test


def _draw_directly(search, count, settings, seed):
    """Run `count` more examples of `search` drawn directly; a failure goes to hypothesis to replay and shrink."""
    if seed is not None:
        rng = random.Random(seed)
    elif settings.derandomize:
        rng = random.Random(zlib.crc32(search.inv.name.encode()))
    else:
        rng = random.Random()
    valid = drawn = repeats = 0
    seen = set()  # hashes of the choices of every example drawn so far
    with internals.no_local_constants():
        # Stop where nearly every draw is rejected, as hypothesis's engine does, or where the inputs have run out.
        while valid < count and drawn < 10 * count and repeats < DIRECT_REPEATS_TO_STOP:
            data = internals.DirectData(rng)
            drawn += 1
            try:
                with internals.build_context(data):
                    search.body(lambda strategy, label, data=data: data.draw(strategy))
                if not data.recorded:  # it draws nothing: every example is this one
                    break
                valid += 1
                choices = hash(tuple(data.recorded))
                repeats = repeats + 1 if choices in seen else 0
                seen.add(choices)
            except (internals.StopTest, internals.UnsatisfiedAssumption):  # a rejected draw
                continue
            except (InvariantSkipped, TransportLost) as exc:  # nothing to replay: a skip, or an implementation out of reach
                return _ended_by(search, exc)
            except Exception as exc:  # noqa: BLE001 - hypothesis replays the example and words what it raises
                return _shrunk_by_hypothesis(search, settings, data.recorded, exc)
    return search.outcome("passed", f"held on {search.examples} examples")


def _shrunk_by_hypothesis(search, settings, choices, exc):
    """Replay the failing `choices` under hypothesis (its reuse phase, and its shrink phase if `settings` have one); return how that ended.

    Unseeded: hypothesis's @seed turns its example database off, and the replay comes from that database.
    """
    failing_case = search.case
    key = example_key(search.inv.name, search.impl)
    phases = (Phase.reuse, Phase.shrink) if Phase.shrink in settings.phases else (Phase.reuse,)  # the caller's choice to shrink or not
    database = internals.database_of(key, choices)
    if settings.database is not None:  # and the shrunk failure lands where later runs replay it (dev's shared database)
        database = MultiplexedDatabase(database, settings.database)
    replay = hypothesis_settings(settings, database=database, phases=phases)
    outcome = _outcome_of(search, _hypothesis_test(search, replay, None, database_key=key))
    if not outcome.passed:
        return outcome
    problem = "the implementation answered the same inputs differently on a second try (nondeterministic?)"
    return search.outcome("error", problem, problem=f"{problem}\nthe first time: {type(exc).__name__}: {exc}",
                          case=failing_case, notes=("(found by a direct draw; hypothesis's replay of it passed, so it is not shrunk)",))


def _outcome_of(search, run):
    """Run the hypothesis test `run` for `search` and word how it ended."""
    try:
        with internals.no_local_constants():
            run()
    except BaseException as exc:
        if search.limit_reached:  # hypothesis may report the stopped shrink as a flaky draw: the flag says what happened
            return search.failure(*search.latest_failure, notes=(f"(shrinking stopped after {search.shrink_limit} more examples: "
                                                                 "the smallest counterexample found so far)",))
        return _ended_by(search, exc)
    return search.outcome("passed", f"held on {search.examples} examples")


def _ended_by(search, exc):
    """The Outcome of a search that ended by raising `exc`; KeyboardInterrupt and the like propagate."""
    try:
        raise exc
    except InvariantSkipped:
        return search.outcome("skipped", str(exc), declared=isinstance(exc.args[0] if exc.args else "", Declared))
    except IMPLEMENTATION_FAILURES:
        return search.failure(exc, search.latest_failure[1] if search.latest_failure else search.case, _replay_notes(exc))
    except TransportLost as lost:
        if lost.out_of_time and search.latest_failure is not None:
            return search.failure(*search.latest_failure, notes=(f"(time ran out while shrinking: {lost.message}; "
                                                                 "this example may not be the smallest)",))
        return search.outcome("error", lost.message, problem=lost.message, case=search.case, lost=lost.cause)
    except Flaky:
        problem = "the implementation answered the same inputs differently on a second try (nondeterministic?)"
        return search.outcome("error", problem, problem=f"{problem}\n{exc}", case=search.case)
    except HypothesisException:
        problem = f"hypothesis could not search this invariant: {type(exc).__name__}: {headline(str(exc).strip())}"
        return search.outcome("error", problem, problem=problem, case=search.case, check_crashed=True)
    except Exception:  # noqa: BLE001 - the check choking on an answer is reported, never a traceback soup
        frame = traceback.extract_tb(exc.__traceback__)[-1]
        reason = f"the check itself raised {type(exc).__name__}: {exc} (at {Path(frame.filename).name}:{frame.lineno})"
        problem = f"{reason}; usually an answer of an unexpected shape or type; if the shapes look right, it is the suite's bug: please report it"
        return search.outcome("error", reason, problem=problem, case=search.case, check_crashed=True)
