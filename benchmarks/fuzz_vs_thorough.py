"""Hidden-reach bugs found per CPU minute: HypoFuzz with 2 workers against the thorough profile at -n 2 (docs/power.md).

    python benchmarks/fuzz_vs_thorough.py --minutes 4 --documented-minutes 2    # the whole suite
    python benchmarks/fuzz_vs_thorough.py --only reach --minutes 2 --component-only   # each mutant's component alone (-k)

Each mutant below runs under each method in turn, in one run on the same cores, on the whole suite, until
its first failure or the time cap: `pytest --pyargs invariants -n 2 -x --invariants-profile thorough` (its first
failing test ends the measurement), and `hypothesis fuzz -n 2` on invariants/fuzz.py with a fresh folder as --examples-db (a
failure under any invariant's key ends it, shrunk or not). CPU time is that of the whole process tree
(workers included), sampled every half second; startup and collection count. One torch thread per process.
These mutants are also --impl targets of this file (`--impl benchmarks/fuzz_vs_thorough.py:reach_layer_norm_tile_1x11`).
"""

from __future__ import annotations

import argparse
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from invariants.mutants.documented import DOCUMENTED  # noqa: E402
from invariants.mutants.reach import REACH  # noqa: E402

# The two of invariants/mutants/reach.py, which more examples find, and the two documented survivors, which the strategies cannot reach.
MUTANTS = {
    "reach.layer_norm_tile_1x11": REACH["reach.layer_norm_tile_1x11"],
    "reach.attention_tile_2x7x3": REACH["reach.attention_tile_2x7x3"],
    "documented.pytorch_log_softmax_adds_max_first": DOCUMENTED["documented.pytorch_log_softmax_adds_max_first"],
    "documented.pytorch_cpu_layer_norm_naive_variance": DOCUMENTED["documented.pytorch_cpu_layer_norm_naive_variance"],
}


def _attribute(name):
    return name.replace(".", "_")


def __getattr__(attribute):  # --impl benchmarks/fuzz_vs_thorough.py:<name with _ for .>: the mutant's namespace, built when asked
    for name, mutant in MUTANTS.items():
        if _attribute(name) == attribute:
            return mutant.namespace()
    raise AttributeError(attribute)


def _cpu_seconds(pid, seen):
    """User + system seconds of `pid` and its descendants so far; `seen` keeps each process's last reading (exited ones stay counted)."""
    import psutil

    try:
        root = psutil.Process(pid)
        for proc in [root, *root.children(recursive=True)]:
            try:
                times = proc.cpu_times()
                seen[proc.pid] = times.user + times.system
            except psutil.NoSuchProcess:
                pass
    except psutil.NoSuchProcess:
        pass
    return sum(seen.values())


def _failing(database, keys):
    """The invariants (of {key: name}) under whose key the database holds a failure, shrunk or not."""
    return [name for key, name in keys.items() if any(next(iter(database.fetch(key + suffix)), None) is not None for suffix in (b"", b".secondary"))]


def _failed(log):
    """The invariants pytest -v has reported failed so far (with xdist: '[gw0] [ 3%] FAILED invariants/...[name]')."""
    return re.findall(r"FAILED invariants/test_invariants.py::test_invariant\[([^\]]+)\]", log.read_text())


def measure(name, method, cap_seconds, *, select=None):
    """(the invariants that failed, cpu seconds, wall seconds) of `method` ("hypofuzz" or "thorough") on mutant `name`, capped at `cap_seconds`."""
    from invariants import all_invariants, load_implementation
    from invariants.examples_db import example_key, open_database

    mutant = MUTANTS[name]
    target = f"{Path(__file__).resolve()}:{_attribute(name)}"
    common = ["-p", "no:cacheprovider", "--impl", target, "--impl-dtype", mutant.dtype, *(["-k", select] if select else [])]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore"}
    folder = tempfile.mkdtemp(prefix="fuzz-vs-thorough-")
    if method == "hypofuzz":
        command = [str(Path(sys.executable).with_name("hypothesis")), "fuzz", "-n", "2", "--no-dashboard", "--", "--pyargs",
                   "invariants.fuzz", *common, "--examples-db", folder]
        impl = load_implementation(target, dtype=mutant.dtype)
        keys = {example_key(inv.name, impl): inv.name for inv in all_invariants()}
        database = open_database(folder)
    else:
        command = [sys.executable, "-m", "pytest", "--pyargs", "invariants", "-n", "2", "-x", "-v", "--invariants-profile", "thorough", *common]
    start, seen = time.monotonic(), {}
    log = Path(folder) / "output.txt"
    with log.open("w") as output:
        process = subprocess.Popen(command, cwd=ROOT, env=env, stdout=output, stderr=subprocess.STDOUT, start_new_session=True)
    found = []
    try:
        while time.monotonic() - start < cap_seconds and process.poll() is None:
            cpu = _cpu_seconds(process.pid, seen)
            if (found := _failing(database, keys) if method == "hypofuzz" else _failed(log)):
                break
            time.sleep(0.5)
        cpu = _cpu_seconds(process.pid, seen)
    finally:
        try:
            os.killpg(process.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        process.wait()
    return found, cpu, time.monotonic() - start


def main(argv=None):
    from invariants import REGISTRY, all_invariants

    all_invariants()
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--minutes", type=float, default=4.0, help="the cap for each run on a mutant the strategies can reach")
    parser.add_argument("--documented-minutes", type=float, default=2.0, help="the cap for each run on a documented survivor")
    parser.add_argument("--only", default="", help="run only the mutants whose name contains this text")
    parser.add_argument("--component-only", action="store_true", help="both methods on the invariants of the mutant's component only (-k)")
    args = parser.parse_args(argv)
    totals = {"hypofuzz": [0, 0.0], "thorough": [0, 0.0]}
    print("| mutant | method | found by | CPU s | wall s |\n| --- | --- | --- | --- | --- |", flush=True)
    for name in (n for n in MUTANTS if args.only in n):
        cap = 60 * (args.documented_minutes if name.startswith("documented.") else args.minutes)
        for method in ("hypofuzz", "thorough"):
            select = REGISTRY[MUTANTS[name].killed_by].component if args.component_only else None
            found, cpu, wall = measure(name, method, cap, select=select)
            totals[method][0] += bool(found)
            totals[method][1] += cpu
            print(f"| {name} | {method} | {', '.join(found) or 'no'} | {cpu:.0f} | {wall:.0f} |", flush=True)
    for method, (found, cpu) in totals.items():
        print(f"{method}: {found} found in {cpu / 60:.1f} CPU minutes: {found / (cpu / 60):.2f} bugs per CPU minute", flush=True)


if __name__ == "__main__":
    main()
