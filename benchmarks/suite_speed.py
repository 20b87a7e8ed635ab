"""Benchmark: how long the invariant suite takes, and how many examples per second each component runs.

    python benchmarks/suite_speed.py                 # ci profile: pytest wall times + examples/s
    python benchmarks/suite_speed.py --profile thorough --skip-pytest
    python benchmarks/suite_speed.py --breakdown 300       # where the time per example goes, per reference and dtype

The thorough soak's run time is soak_compare.py's to estimate (`python benchmarks/soak_compare.py HEAD`),
past hypothesis's engine included. Prints figures; asserts nothing (speed targets live here, not in timed tests).
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from collections import defaultdict

from invariants import all_invariants, load_implementation, run_invariant
from invariants.profiles import PROFILE_NAMES, profile_settings

TARGETS = ("reference.numpy", "reference.torch")


def pytest_wall_times(profile):
    """Wall time of `pytest invariants` per target, serial and with -n 2."""
    rows = []
    for target in TARGETS:
        for workers in ((), ("-n", "2")):
            command = [sys.executable, "-m", "pytest", "invariants", "-q", "-p", "no:cacheprovider", "--impl", target,
                       f"--invariants-profile={profile}", *workers]
            start = time.perf_counter()
            done = subprocess.run(command, capture_output=True, text=True)
            summary = done.stdout.strip().splitlines()[-1] if done.stdout.strip() else done.stderr.strip()[-200:]
            rows.append((target, " ".join(workers) or "serial", time.perf_counter() - start, summary))
    return rows


def examples_per_second(profile):
    """Per target and component: invariants run, examples, seconds, examples per second."""
    chosen = profile_settings(profile)
    table = defaultdict(lambda: [0, 0, 0.0, 0])  # (target, component) -> [invariants, examples, seconds, failures]
    for target in TARGETS:
        impl = load_implementation(target)
        for inv in all_invariants():
            outcome = run_invariant(inv, impl, settings=chosen)
            if outcome.status == "skipped":
                continue
            row = table[(target, inv.component)]
            row[0] += 1
            row[1] += outcome.examples
            row[2] += outcome.seconds
            row[3] += not outcome.passed
    return table


class _Stopwatch:
    """Seconds spent inside a method, added up over every call (not counting the calls nested in it twice)."""

    def __init__(self, owner, name):
        self.owner, self.name, self.original, self.seconds, self.depth = owner, name, getattr(owner, name), 0.0, 0

    def __enter__(self):
        original = self.original

        def timed(*args, **kwargs):
            self.depth += 1
            start = time.perf_counter()
            try:
                return original(*args, **kwargs)
            finally:
                self.depth -= 1
                if not self.depth:
                    self.seconds += time.perf_counter() - start

        setattr(self.owner, self.name, timed)
        return self

    def __exit__(self, *exc):
        setattr(self.owner, self.name, self.original)


def time_breakdown(sample):
    """Per reference and dtype: examples/s, and the shares of the run spent drawing, in the implementation, in the checks and in hypothesis.

    Drawing is every Case.draw (our strategies and hypothesis's choices under them); the
    implementation is every Implementation.call (the conversions at the boundary included); the
    checks are the rest of the invariant bodies (the reference, comparisons); hypothesis is the
    rest of the run (its engine: generating, mutating, bookkeeping per example).
    """
    from hypothesis import settings as hypothesis_settings

    from invariants.protocol import Implementation
    from invariants.registry import Invariant
    from invariants.runner import Case

    measured = hypothesis_settings(profile_settings("thorough"), max_examples=sample)
    rows = []
    for target in TARGETS:
        for dtype in ("float64", "float32"):
            impl = load_implementation(target, dtype=dtype)
            total = examples = 0.0
            with _Stopwatch(Case, "draw") as drawing, _Stopwatch(Implementation, "call") as calls, _Stopwatch(Invariant, "__call__") as bodies:
                for inv in all_invariants():
                    outcome = run_invariant(inv, impl, settings=measured)
                    if outcome.status != "skipped":  # every run the stopwatches timed, so that the shares add up
                        total += outcome.seconds
                        examples += outcome.examples
            checks = bodies.seconds - drawing.seconds - calls.seconds
            rows.append((target, dtype, int(examples), total, drawing.seconds, calls.seconds, checks, total - bodies.seconds))
    return rows


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--profile", default="ci", choices=PROFILE_NAMES)
    parser.add_argument("--skip-pytest", action="store_true", help="only the in-process examples/s table")
    parser.add_argument("--breakdown", type=int, metavar="N", help="where the time per example goes, from N examples per invariant, and stop")
    args = parser.parse_args(argv)
    if args.breakdown:
        print(f"where the time goes, {args.breakdown} examples per invariant (one process; shares of the run time)")
        print(f"{'target':18} {'dtype':8} {'examples':>9} {'ex/s':>6} {'drawing':>8} {'impl':>6} {'checks':>7} {'hypothesis':>10}")
        for target, dtype, examples, total, drawing, calls, checks, engine in time_breakdown(args.breakdown):
            shares = " ".join(f"{part / total:{width}.0%}" for part, width in ((drawing, 8), (calls, 6), (checks, 7), (engine, 10)))
            print(f"{target:18} {dtype:8} {examples:9,d} {examples / total:6.0f} {shares}")
        return
    if not args.skip_pytest:
        print(f"pytest invariants, profile {args.profile}")
        print(f"{'target':18} {'workers':8} {'wall s':>8}  result")
        for target, workers, seconds, summary in pytest_wall_times(args.profile):
            print(f"{target:18} {workers:8} {seconds:8.1f}  {summary}")
        print()
    print(f"in-process run_invariant, profile {args.profile}")
    print(f"{'target':18} {'component':13} {'invariants':>10} {'examples':>9} {'seconds':>8} {'examples/s':>10} {'failures':>8}")
    totals = [0, 0, 0.0, 0]
    for (target, component), (n_inv, examples, seconds, failures) in examples_per_second(args.profile).items():
        print(f"{target:18} {component:13} {n_inv:10d} {examples:9d} {seconds:8.2f} {examples / max(seconds, 1e-9):10.0f} {failures:8d}")
        totals = [totals[0] + n_inv, totals[1] + examples, totals[2] + seconds, totals[3] + failures]
    print(f"{'total':32} {totals[0]:10d} {totals[1]:9d} {totals[2]:8.2f} {totals[1] / max(totals[2], 1e-9):10.0f} {totals[3]:8d}")


if __name__ == "__main__":
    main()
