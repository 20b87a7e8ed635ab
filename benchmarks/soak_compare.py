"""Benchmark: the thorough soak's run time at several git revisions, measured alike on this machine.

    python benchmarks/soak_compare.py a2c665b HEAD          # both references, float64 and float32, 300 examples per invariant
    python benchmarks/soak_compare.py a2c665b HEAD -j 2     # the revisions side by side, one per core
    python benchmarks/soak_compare.py HEAD --only-invariants-of a2c665b   # today's code on the invariants a2c665b had

Each revision is checked out in a temporary git worktree and measured in its own process: every
invariant runs N examples (seed 1) through that revision's run_invariant, and its process CPU time
per example is scaled to the soak's 10,000 examples (an invariant that runs out of inputs first runs
as many as it has). A revision whose soak draws directly after ENGINE_EXAMPLES (invariants.hypothesis_internals)
is measured both ways, N examples each, and scaled to ENGINE_EXAMPLES by the engine and the rest
drawn directly. It works on revisions older than the Outcome API (their run_invariant raised
or returned); examples are counted as the Cases drawn. Prints figures; asserts nothing.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

SOAK_EXAMPLES = 10_000
RUNS = (("reference.numpy", "float64"), ("reference.numpy", "float32"), ("reference.torch", "float64"), ("reference.torch", "float32"))


def measure(examples, names):
    """In a revision's checkout: {run: [invariants, examples, CPU seconds, soak minutes, failed, engine minutes]} for each of RUNS.

    Engine minutes are the soak's with hypothesis's engine throughout (the same as its minutes before direct draws).
    A failing invariant stops early, so its soak minutes are those of the examples it ran: the count says so.
    """
    import time

    from hypothesis import HealthCheck, settings

    from invariants import all_invariants, load_implementation, run_invariant, runner

    drawn = [0]
    case_init = runner.Case.__init__

    def counting_init(self, *args, **kwargs):
        drawn[0] += 1
        case_init(self, *args, **kwargs)

    runner.Case.__init__ = counting_init
    chosen = settings(max_examples=examples, deadline=None, database=None, suppress_health_check=list(HealthCheck), derandomize=False)
    engine_examples = getattr(runner, "ENGINE_EXAMPLES", None)  # None: this revision's soak is the engine's throughout

    def timed(inv, impl, **kwargs):
        """(status, examples drawn, CPU seconds) of one search."""
        drawn[0], start = 0, time.process_time()
        try:
            status = getattr(run_invariant(inv, impl, seed=1, **kwargs), "status", "passed")
        except Exception as exc:  # noqa: BLE001 - old revisions raised their skips and failures
            status = "skipped" if type(exc).__name__ == "InvariantSkipped" else "failed"
        return status, drawn[0], time.process_time() - start

    table = {}
    for target, dtype in RUNS:
        impl = load_implementation(target, dtype=dtype)
        row = [0, 0, 0.0, 0.0, 0, 0.0]
        for inv in all_invariants():
            if names is not None and inv.name not in names:
                continue
            if engine_examples is None:
                status, count, seconds = timed(inv, impl, settings=chosen)
            else:
                status, count, seconds = timed(inv, impl, settings=chosen, engine_examples=None)
            if status == "skipped" or not count:
                continue
            runs = SOAK_EXAMPLES if count >= examples else count
            minutes = engine_minutes = seconds / count * runs / 60
            if engine_examples is not None and count >= examples and status == "passed":
                direct_status, direct_count, direct_seconds = timed(inv, impl, settings=settings(chosen, max_examples=examples + 1),
                                                                    engine_examples=1)
                minutes = (seconds / count * engine_examples + direct_seconds / direct_count * (SOAK_EXAMPLES - engine_examples)) / 60
                status, count, seconds = direct_status, count + direct_count, seconds + direct_seconds
            row = [row[0] + 1, row[1] + count, row[2] + seconds, row[3] + minutes, row[4] + (status != "passed"), row[5] + engine_minutes]
        table[f"{target} {dtype}"] = row
    return table


def invariant_names(checkout):
    """The invariant names a checkout defines."""
    code = "from invariants import all_invariants; print('\\n'.join(i.name for i in all_invariants()))"
    return subprocess.run([sys.executable, "-c", code], cwd=checkout, env=_env(checkout), capture_output=True, text=True, check=True).stdout.split()


def _env(checkout):
    return {**os.environ, "PYTHONPATH": str(checkout), "OMP_NUM_THREADS": "1"}


def _measure_in(checkout, examples, names):
    command = [sys.executable, str(Path(__file__).resolve()), "--measure", str(examples)]
    done = subprocess.run(command, cwd=checkout, env=_env(checkout), input=json.dumps(names), capture_output=True, text=True)
    if done.returncode:
        raise SystemExit(f"measuring {checkout} failed:\n{done.stderr[-2000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("revisions", nargs="*", help="git revisions to measure (default: HEAD)")
    parser.add_argument("--examples", type=int, default=300, help="examples per invariant measured (default 300)")
    parser.add_argument("--only-invariants-of", metavar="REV", help="measure only the invariants revision REV defines")
    parser.add_argument("-j", type=int, default=1, help="revisions measured at once (one process each)")
    parser.add_argument("--measure", type=int, help=argparse.SUPPRESS)  # internal: run inside a checkout
    args = parser.parse_args(argv)
    if args.measure:
        names = json.loads(sys.stdin.read())
        print(json.dumps(measure(args.measure, None if names is None else set(names))))
        return
    repo = Path(subprocess.run(["git", "rev-parse", "--show-toplevel"], capture_output=True, text=True, check=True).stdout.strip())
    revisions = args.revisions or ["HEAD"]
    with tempfile.TemporaryDirectory(prefix="soak_compare_") as scratch:
        made = []

        def checkout(rev):
            path = Path(scratch) / rev.replace("/", "_")
            if not path.exists():
                subprocess.run(["git", "-C", str(repo), "worktree", "add", "--detach", "-q", str(path), rev], check=True)
                made.append(path)
            return path

        try:
            names = invariant_names(checkout(args.only_invariants_of)) if args.only_invariants_of else None
            paths = [checkout(rev) for rev in revisions]
            with ThreadPoolExecutor(max_workers=max(args.j, 1)) as pool:
                tables = list(pool.map(lambda path: _measure_in(path, args.examples, names), paths))
        finally:
            for path in made:
                subprocess.run(["git", "-C", str(repo), "worktree", "remove", "--force", str(path)], check=False)
    scope = f", the invariants of {args.only_invariants_of}" if names else ""
    print(f"thorough soak, minutes of run time from {args.examples} examples per invariant (process CPU time, seed 1{scope})")
    print(f"{'revision':14} " + " ".join(f"{t + ' ' + d:>24}" for t, d in RUNS) + f" {'total':>7} {'ex/CPU s':>9}")
    for rev, table in zip(revisions, tables, strict=True):
        cells = " ".join(f"{table[f'{t} {d}'][3]:13.1f} ({table[f'{t} {d}'][0]:3d} inv.)" for t, d in RUNS)
        examples, seconds = sum(row[1] for row in table.values()), sum(row[2] for row in table.values())
        failed = sum(row[4] for row in table.values())
        note = f"  ({failed} runs failed: their minutes are those of the examples they ran)" if failed else ""
        print(f"{rev:14} {cells} {sum(row[3] for row in table.values()):7.0f} {examples / seconds:9.0f}{note}")
        engine = [table[f"{t} {d}"][5] for t, d in RUNS]
        if engine != [table[f"{t} {d}"][3] for t, d in RUNS]:  # it draws directly past ENGINE_EXAMPLES
            print(f"{'  (engine only)':14} " + " ".join(f"{minutes:13.1f}           " for minutes in engine) + f" {sum(engine):7.0f}")


if __name__ == "__main__":
    main()
