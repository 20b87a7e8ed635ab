"""The kill matrix: the whole suite, and the course's own checks, on every mutant in the zoo.

    python -m invariants.mutants.matrix [--profile ci] [--only PATTERN] [--format table|markdown|json] [--jobs N]

For each mutant the invariants run in registry order until one fails: the matrix shows that
first failure, whether it is the invariant whose hint names the bug (`killed_by`; when it is
not, the named one is run too and its verdict shown), how many examples hypothesis needed and
how long it took (within that invariant, and from the start of the suite on that mutant). The
course checks (invariants.mutants.course_checks) run on the same mutant. The totals give the kill rate,
the median and worst examples- and seconds-to-detection, and the two kill rates' ratio.

Detection is measured on the first failing example, so the matrix skips hypothesis's
shrinking and its example database (a replayed failure would count as found in one example).
An invariant that cannot reach the mutant's replaced function is not run on it (see
could_reach; --no-prune runs them all): the reference passes it, and on the mutant it calls
the very same code, so the first failure in registry order is the same either way.
Exit status: 0 when every mutant is killed, 1 when one survives or an invariant crashed,
2 on a usage error.
"""

from __future__ import annotations

import argparse
import fnmatch
import importlib
import inspect
import json
import re
import statistics
import sys
import time
import warnings
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import asdict, dataclass, field
from functools import cache
from multiprocessing import get_context

import numpy as np
from hypothesis import Phase, Verbosity
from hypothesis import settings as hypothesis_settings

from invariants.diagnosis import leave_one_out_accuracy
from invariants.graphs import reachable_from
from invariants.mutants import all_mutants
from invariants.mutants.course_checks import CourseCheckSkipped, all_course_checks
from invariants.mutants.documented import documented_mutants, equivalent_controls
from invariants.profiles import PROFILE_NAMES, profile_settings
from invariants.protocol import FUNCTIONS
from invariants.registry import all_invariants
from invariants.runner import run_invariant

DETECTION_PHASES = (Phase.explicit, Phase.reuse, Phase.generate, Phase.target)  # no shrinking


@dataclass
class Row:
    """What the suite and the course checks did to one mutant."""

    mutant: str
    bug: str
    killed_by: str  # the invariant whose hint names the bug
    first_failure: str | None = None  # the first invariant, in registry order, that failed (None: a survivor)
    examples: int | None = None  # examples that invariant ran up to its first failing one, inclusive
    seconds: float | None = None  # seconds that invariant ran up to its first failing example
    suite_seconds: float = 0.0  # from the start of the suite on this mutant to the kill (or to the end)
    named_kills: bool | None = None  # does killed_by fail? (None: it is not registered)
    invariants_run: int = 0
    invariants_pruned: int = 0  # invariants that cannot reach the replaced function, not run
    crashes: list = field(default_factory=list)  # "<invariant>: <exception>" for invariants that raised unexpectedly
    failing: list = field(default_factory=list)  # with whole=True: every invariant that failed, in registry order (its signature)
    held: list = field(default_factory=list)  # with whole=True: every invariant that ran (or was pruned) and held
    course_failure: str | None = None  # the first course check that failed
    course_seconds: float = 0.0
    named_by: tuple = ()  # killed_by and the other invariants whose hints name the bug (Mutant.named_by)

    @property
    def killed(self):
        return self.first_failure is not None

    @property
    def named_first(self):
        return self.first_failure == self.killed_by


def _settings(profile):
    return hypothesis_settings(profile_settings(profile), database=None, phases=DETECTION_PHASES, verbosity=Verbosity.quiet)


def _kills(outcome):
    """A kill is a wrong answer or an implementation that could not be evaluated; a crash of the check itself is not."""
    return outcome.status in ("failed", "error") and not outcome.check_crashed


def _code_names(function):
    """Global names a function's code refers to: its own, its nested functions' and its closures' (decorator wrappers)."""
    names, codes = set(), [function.__code__]
    for cell in function.__closure__ or ():
        if inspect.isfunction(cell.cell_contents):
            names |= _code_names(cell.cell_contents)
    while codes:
        code = codes.pop()
        names.update(code.co_names)
        codes.extend(c for c in code.co_consts if inspect.iscode(c))
    return names


OPAQUE = "<a callable whose code cannot be read>"


def reachable(namespace, name):
    """Every module-level name of `namespace` that the function `name` can end up calling, itself included.

    A callable that is not a plain function (a partial, a builtin, an object) adds OPAQUE: it may call anything.
    """

    def callees(current):
        value = vars(namespace).get(current)
        if inspect.isfunction(value):
            return _code_names(value)
        return [OPAQUE] if callable(value) and not inspect.isclass(value) else []

    return reachable_from([name], callees)


@cache
def _mentioned(component):
    """Protocol functions an invariant module names anywhere (impl.x(...), impl.raw("x"), helpers): a superset of its calls."""
    source = inspect.getsource(importlib.import_module(f"invariants.laws.{component}"))
    return frozenset(set(re.findall(r"\w+", source)) & set(FUNCTIONS))


def could_reach(inv, namespace, replaced):
    """Can `inv` call code that reaches the function `replaced` of `namespace`? Conservative: when unsure, yes.

    An invariant calls the protocol functions it requires, and perhaps others its module names;
    if none of them reaches the replaced function, the invariant sees exactly the reference,
    which passes it.
    """
    calls = set(inv.requires) | _mentioned(inv.component)
    return any({replaced, OPAQUE} & reachable(namespace, name) for name in calls)


def examine(mutant, invariants, checks, *, profile="ci", prune=True, whole=False):
    """Run the suite (in order, up to the first failure; whole=True: all of it) and every course check on one mutant: a Row.

    Mutants overflow and divide by zero on purpose: their floating-point warnings are silenced here.
    """
    with np.errstate(all="ignore"), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return _examine(mutant, invariants, checks, profile, prune, whole)


def _examine(mutant, invariants, checks, profile, prune, whole):
    settings = _settings(profile)
    impl = mutant.implementation()
    row = Row(mutant.name, mutant.bug, mutant.killed_by, named_by=mutant.named_by)
    start = time.perf_counter()
    for inv in invariants:
        if inv.skip_reason(impl):
            continue
        if prune and not could_reach(inv, impl.namespace, mutant.replaces):
            row.invariants_pruned += 1
            row.held.append(inv.name)  # it calls exactly the reference's code, which holds
            continue
        row.invariants_run += 1
        outcome = run_invariant(inv, impl, settings=settings)
        if outcome.check_crashed:
            row.crashes.append(f"{inv.name}: {outcome.reason}")
        elif not _kills(outcome):
            row.held.append(inv.name)
            continue
        if row.first_failure is None and not outcome.check_crashed:
            row.first_failure = inv.name
            row.examples, row.seconds = outcome.examples_to_failure, outcome.seconds_to_failure
            row.suite_seconds = time.perf_counter() - start
        if not outcome.check_crashed:
            row.failing.append(inv.name)
        if not whole and row.first_failure is not None:
            break
    if row.first_failure is None:
        row.suite_seconds = time.perf_counter() - start
    named = next((inv for inv in invariants if inv.name == mutant.killed_by), None)
    if row.named_first or mutant.killed_by in row.failing:
        row.named_kills = True
    elif named is not None and not whole:
        row.named_kills = _kills(run_invariant(named, impl, settings=settings))
    start = time.perf_counter()
    for check in checks:
        try:
            check(impl)
        except CourseCheckSkipped:
            continue
        except Exception:  # the course's script stops on any error: the bug is noticed
            row.course_failure = check.name
            break
    row.course_seconds = time.perf_counter() - start
    return row


def _every_mutant():
    """The zoo, the documented bugs and the equivalent controls, by name."""
    return {m.name: m for m in [*all_mutants(), *documented_mutants(), *equivalent_controls()]}


def _examine_by_name(name, invariant_names, profile, prune, whole):
    """examine() in a worker process, which finds the mutant and the invariants by name."""
    mutants = _every_mutant()
    invariants = {inv.name: inv for inv in all_invariants()}
    return examine(mutants[name], [invariants[n] for n in invariant_names], all_course_checks(), profile=profile, prune=prune, whole=whole)


def _one_thread_each():
    """Pool workers share the cores: one torch thread each (torch, when installed, defaults to all of them)."""
    try:
        import torch
    except ImportError:
        return
    torch.set_num_threads(1)


def kill_matrix(mutants, invariants=None, checks=None, *, profile="ci", jobs=1, prune=True, whole=False, progress=None):
    """The rows of the kill matrix, one per mutant, in the zoo's order.

    With jobs > 1 the mutants are shared among worker processes, which look them (and the
    invariants) up by name: only registered mutants and invariants can be sent there, and
    they always run every course check. progress(row), if given, is called as each mutant is done.
    """
    invariants = all_invariants() if invariants is None else list(invariants)
    checks = all_course_checks() if checks is None else list(checks)
    report = progress or (lambda row: None)
    if jobs <= 1:
        rows = []
        for m in mutants:
            rows.append(examine(m, invariants, checks, profile=profile, prune=prune, whole=whole))
            report(rows[-1])
        return rows
    names = [inv.name for inv in invariants]
    with ProcessPoolExecutor(max_workers=jobs, mp_context=get_context("spawn"), initializer=_one_thread_each) as pool:
        futures = [pool.submit(_examine_by_name, m.name, names, profile, prune, whole) for m in mutants]
        for future in as_completed(futures):
            report(future.result())
        return [future.result() for future in futures]


def _rate(killed, total):
    return killed / total if total else 0.0


def signatures_of(rows):
    """{mutant: {"bug", "killed_by", "named_by", "failing", "held"}}: what invariants.diagnosis learns from (whole runs only).

    named_by keeps killed_by and those of the mutant's other naming invariants that failed in this run: one that held cannot be a diagnosis.
    """
    return {r.mutant: {"bug": r.bug, "killed_by": r.killed_by, "failing": r.failing, "held": r.held,
                       "named_by": [n for n in r.named_by or (r.killed_by,) if n == r.killed_by or n in r.failing]} for r in rows}


def summarise(rows, *, wall_seconds=None, whole=False):
    """Totals: kill rates, their ratio, median and worst examples- and seconds-to-detection; with whole rows, the diagnosis accuracy."""
    killed = [r for r in rows if r.killed]
    n_course = sum(r.course_failure is not None for r in rows)

    def spread(values):
        return {"median": statistics.median(values), "worst": max(values)} if values else {"median": None, "worst": None}

    return {
        "mutants": len(rows),
        "killed": len(killed),
        "survivors": [r.mutant for r in rows if not r.killed],
        "kill_rate": _rate(len(killed), len(rows)),
        "killed_first_by_named_invariant": sum(r.named_first for r in rows),
        "named_invariant_misses": [r.mutant for r in rows if r.named_kills is False],
        "crashes": [c for r in rows for c in r.crashes],
        "invariant_runs": sum(r.invariants_run for r in rows),
        "invariant_runs_pruned": sum(r.invariants_pruned for r in rows),
        "examples_to_detection": spread([r.examples for r in killed]),
        "seconds_to_detection": spread([r.seconds for r in killed]),
        "suite_seconds_to_detection": spread([r.suite_seconds for r in killed]),
        "course_killed": n_course,
        "course_kill_rate": _rate(n_course, len(rows)),
        "ratio": len(killed) / n_course if n_course else None,  # suite kills per course-check kill
        "wall_seconds": wall_seconds,
        **(_diagnosis_summary(rows) if whole else {}),
    }


def _diagnosis_summary(rows):
    accuracy, misses = leave_one_out_accuracy(signatures_of([r for r in rows if r.killed]))
    return {"diagnosis_accuracy": accuracy, "diagnosis_misses": [f"{m}: diagnosed {top}, named {named}" for m, top, named in misses]}


def write_signatures(rows, path):
    """Each mutant's signature (its bug, the invariant that names it, what failed and what held) as JSON, for invariants.diagnosis."""
    with open(path, "w") as out:
        json.dump(signatures_of(rows), out, indent=1, sort_keys=True)
        out.write("\n")


# -- formatting ---------------------------------------------------------------------------------

COLUMNS = ("mutant", "first invariant to fail", "named?", "examples", "seconds", "suite s", "course check")


def _cells(row):
    if not row.killed:
        first, named = "SURVIVED", "-"
    else:
        first = row.first_failure
        named = "yes" if row.named_first else f"no ({row.killed_by} {'also kills' if row.named_kills else 'does NOT kill'})"
    return (
        row.mutant,
        first,
        named,
        "-" if row.examples is None else str(row.examples),
        "-" if row.seconds is None else f"{row.seconds:.3f}",
        f"{row.suite_seconds:.2f}",
        row.course_failure or "survived",
    )


def _figure(value, unit=""):
    if value is None:
        return "n/a"
    return f"{value:.3f}{unit}" if unit else f"{value:g}"


def _totals_lines(summary):
    s = summary
    ratio = "n/a (the course checks kill none)" if s["ratio"] is None else f"{s['ratio']:.2f}×"
    lines = [
        f"suite: killed {s['killed']} of {s['mutants']} mutants (kill rate {s['kill_rate']:.1%}); "
        f"{s['killed_first_by_named_invariant']} first by the invariant that names the bug",
        f"examples to detection: median {_figure(s['examples_to_detection']['median'])}, worst {_figure(s['examples_to_detection']['worst'])}",
        f"seconds to detection (in the killing invariant): median {_figure(s['seconds_to_detection']['median'], ' s')}, "
        f"worst {_figure(s['seconds_to_detection']['worst'], ' s')}",
        f"seconds to detection (the suite from its start, in registry order): median {_figure(s['suite_seconds_to_detection']['median'], ' s')}, "
        f"worst {_figure(s['suite_seconds_to_detection']['worst'], ' s')}",
        f"invariant runs: {s['invariant_runs']} ({s['invariant_runs_pruned']} more pruned: they cannot reach the replaced function)",
        f"course checks: killed {s['course_killed']} of {s['mutants']} (kill rate {s['course_kill_rate']:.1%}); suite / course = {ratio}",
    ]
    if s["survivors"]:
        lines.append(f"SURVIVORS: {', '.join(s['survivors'])}")
    if s["named_invariant_misses"]:
        lines.append(f"the named invariant does not kill: {', '.join(s['named_invariant_misses'])}")
    lines += [f"CRASH {c}" for c in s["crashes"]]
    if "diagnosis_accuracy" in s:
        lines.append(f"diagnosis (leave-one-out: a mutant's own signature never diagnoses it): the top diagnosis names the bug "
                     f"for {s['diagnosis_accuracy']:.1%} of the killed mutants")
        lines += [f"  missed {m}" for m in s["diagnosis_misses"]]
    if s["wall_seconds"] is not None:
        lines.append(f"wall time {s['wall_seconds']:.1f} s")
    return lines


def format_table(rows, summary):
    table = [COLUMNS, *(_cells(r) for r in rows)]
    widths = [max(len(line[i]) for line in table) for i in range(len(COLUMNS))]
    text = ["  ".join(cell.ljust(w) for cell, w in zip(line, widths, strict=True)).rstrip() for line in table]
    text.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join([*text, "", *_totals_lines(summary)])


def format_markdown(rows, summary):
    def line(cells):
        return "| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |"

    text = [line(COLUMNS), line(["---"] * len(COLUMNS)), *(line(_cells(r)) for r in rows)]
    return "\n".join([*text, "", *(f"- {t}" for t in _totals_lines(summary))])


def format_json(rows, summary):
    return json.dumps({"rows": [asdict(r) for r in rows], "summary": summary}, indent=2)


FORMATS = {"table": format_table, "markdown": format_markdown, "json": format_json}


def select(mutants, pattern):
    """The mutants whose name matches `pattern`: a glob (norms.*) or a plain substring (attention)."""
    if not pattern:
        return list(mutants)
    return [m for m in mutants if fnmatch.fnmatchcase(m.name, pattern) or pattern in m.name]


def _duration(seconds):
    seconds = round(seconds)
    return f"{seconds // 60} min {seconds % 60:02d} s" if seconds >= 60 else f"{seconds} s"


class _Progress:
    """Progress on stderr, called as each mutant is done: a tqdm bar with the time left on a terminal; in a log (not a
    terminal, or without tqdm) one plain line per mutant with the estimate at its end, and never a redrawn line."""

    def __init__(self, total, start):
        self.total, self.start, self.done = total, start, 0
        self.bar = None
        if sys.stderr.isatty():
            try:
                from tqdm import tqdm
            except ImportError:  # the progress extra is not installed: the plain lines
                tqdm = None
            if tqdm is not None:
                self.bar = tqdm(total=total, unit="mutant", file=sys.stderr, dynamic_ncols=True, smoothing=0.1,
                                bar_format="{l_bar}{bar}| {n_fmt}/{total_fmt} [{elapsed}<{remaining}, {rate_fmt}]")

    def __call__(self, row):
        self.done += 1
        verdict = f"{row.first_failure} after {row.examples} examples" if row.killed else "SURVIVED"
        line = f"[{self.done}/{self.total}] {row.mutant}: {verdict} ({row.suite_seconds:.1f} s)"
        if self.bar is not None:
            self.bar.write(line, file=sys.stderr)
            self.bar.update(1)
            return
        left = self.total - self.done
        if left:  # the mean time per mutant so far, times the mutants still to do
            line += f"; about {_duration((time.perf_counter() - self.start) / self.done * left)} left"
        print(line, file=sys.stderr, flush=True)

    def close(self):
        if self.bar is not None:
            self.bar.close()


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m invariants.mutants.matrix", description=__doc__.split("\n\n")[0])
    parser.add_argument("--profile", default="ci", choices=PROFILE_NAMES, help="hypothesis profile (default ci: 60 examples, derandomized)")
    parser.add_argument("--only", metavar="PATTERN", help="mutants whose name matches this glob or contains this text")
    parser.add_argument("--format", default="table", choices=sorted(FORMATS), help="output format (default table)")
    parser.add_argument("--jobs", type=int, default=1, metavar="N", help="worker processes (default 1)")
    parser.add_argument("--no-prune", dest="prune", action="store_false",
                        help="also run the invariants that cannot reach the mutant's replaced function (slower, same first failures)")
    parser.add_argument("--whole", action="store_true",
                        help="run every invariant on each mutant, not only up to the first failure: the failing sets the diagnosis learns from")
    parser.add_argument("--signatures", metavar="FILE",
                        help="with --whole: write each mutant's failing and holding invariants to FILE (the shipped one: invariants/signatures.json)")
    parser.add_argument("--quiet", action="store_true",
                        help="no progress on stderr (without it: a bar with the time left on a terminal, one line per mutant in a log)")
    args = parser.parse_args(argv)
    if args.jobs < 1:
        parser.error(f"--jobs={args.jobs} must be at least 1")
    if args.signatures and not args.whole:
        parser.error("--signatures needs --whole (a signature is the whole failing set)")
    mutants = select(all_mutants(), args.only)
    if not mutants:
        parser.error(f"--only={args.only!r} matches no mutant")
    start = time.perf_counter()
    progress = None if args.quiet else _Progress(len(mutants), start)
    try:
        rows = kill_matrix(mutants, profile=args.profile, jobs=args.jobs, prune=args.prune, whole=args.whole, progress=progress)
    finally:
        if progress is not None:
            progress.close()
    summary = summarise(rows, wall_seconds=time.perf_counter() - start, whole=args.whole)
    if args.signatures:
        write_signatures(rows, args.signatures)
    documented = _documented_section(args) if not args.only else None
    print(FORMATS[args.format](rows, summary))
    if documented is not None:
        print(documented["text"] if args.format != "json" else json.dumps({k: v for k, v in documented.items() if k != "text"}, indent=2))
    failed = summary["survivors"] or summary["crashes"] or (documented and (documented["unexpected_survivors"] or documented["false_alarms"]))
    return 1 if failed else 0


def _documented_section(args):
    """Bugs public projects shipped (invariants/mutants/documented.py), kept apart from the synthetic zoo, and the equivalent controls.

    A documented bug marked `needs` is one the strategies do not reach yet: its survival is reported,
    not a failure; a control that any invariant fails is a false alarm, and is.
    """
    bugs, controls = documented_mutants(), equivalent_controls()
    rows = kill_matrix(bugs, profile=args.profile, jobs=args.jobs, prune=args.prune)
    control_rows = kill_matrix(controls, profile=args.profile, jobs=args.jobs, prune=args.prune)
    needs = {m.name: m.needs for m in bugs}
    killed = [r for r in rows if r.killed]
    lines = ["", f"documented bugs (shipped by public projects; invariants/mutants/documented.py): the suite catches {len(killed)} of {len(rows)}"]
    lines += [f"  {r.mutant} ({m.source}): " + (f"killed by {r.first_failure} after {r.examples} examples" if r.killed
              else f"SURVIVED{f' (needs {needs[r.mutant]})' if needs[r.mutant] else ''}") for r, m in zip(rows, bugs, strict=True)]
    alarms = [r for r in control_rows if r.killed]
    passing = len(control_rows) - len(alarms)
    lines.append(f"equivalent controls (reported as bugs, shown equivalent): {passing} of {len(control_rows)} pass every invariant")
    lines += [f"  FALSE ALARM {r.mutant}: {r.first_failure}" for r in alarms]
    return {"text": "\n".join(lines), "caught": len(killed), "documented": len(rows),
            "survivors": [r.mutant for r in rows if not r.killed],
            "unexpected_survivors": [r.mutant for r in rows if not r.killed and not needs[r.mutant]],
            "false_alarms": [r.mutant for r in alarms], "controls": len(control_rows)}


if __name__ == "__main__":
    sys.exit(main())
