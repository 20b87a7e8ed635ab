"""Benchmark: every invariant on each adapter (code we did not write) at N examples per invariant; prints what held and how fast.

    python benchmarks/adapter_soak.py                       # thorough: 10,000 examples per invariant (hours)
    python benchmarks/adapter_soak.py --examples 1000 -j 2  # a tenth of it, two adapters at a time
    python benchmarks/adapter_soak.py --only adapters.mixtral:float32

Each (adapter, dtype) runs in its own process, with fresh randomness. Prints, per run: the
invariants that ran, skipped and failed, the examples, the minutes and the examples per second,
then the report of every invariant that did not pass. Asserts nothing (figures, not a test).
Needs the external extra (pip install -e '.[external]').
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor

# (adapter, dtype): the dtypes tox -e external runs each adapter in
RUNS = (
    ("adapters.torch_sdpa", "float64"), ("adapters.torch_sdpa", "float32"),
    ("adapters.torch_mha", "float64"), ("adapters.torch_mha", "float32"),
    ("adapters.torch_encoder_layer", "float64"), ("adapters.torch_encoder_layer", "float32"),
    ("adapters.gpt2", "float64"), ("adapters.gpt2", "float32"),
    ("adapters.hooked_transformer", "float64"), ("adapters.hooked_transformer", "float32"),
    ("adapters.mixtral", "float32"),
    ("adapters.sdpa_gqa", "float64"), ("adapters.sdpa_gqa", "float32"),
    ("adapters.llama", "float32"), ("adapters.mistral", "float32"), ("adapters.qwen2", "float32"),
)

_ONE_RUN = """
import json, sys, warnings
from hypothesis import settings
from invariants import all_invariants, load_implementation, run_invariant
from invariants.profiles import profile_settings
target, dtype, examples = sys.argv[1], sys.argv[2], int(sys.argv[3])
chosen = settings(profile_settings("thorough"), max_examples=examples, deadline=None)
impl = load_implementation(target, dtype=dtype)
for inv in all_invariants():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        o = run_invariant(inv, impl, settings=chosen, shrink_limit=200)
    print(json.dumps({"invariant": o.invariant, "status": o.status, "examples": o.examples, "seconds": o.seconds,
                      "report": o.report or o.reason}), flush=True)
"""


def soak(target, dtype, examples):
    """[outcome dicts] of every invariant on target in dtype, run in a fresh process."""
    done = subprocess.run([sys.executable, "-c", _ONE_RUN, target, dtype, str(examples)], capture_output=True, text=True)
    outcomes = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    if done.returncode != 0:
        outcomes.append({"invariant": "(the run itself)", "status": "error", "examples": 0, "seconds": 0.0,
                         "report": done.stderr.strip()[-2000:]})
    return outcomes


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--examples", type=int, default=10_000, help="examples per invariant (default: the thorough profile's 10,000)")
    parser.add_argument("-j", "--jobs", type=int, default=1, help="runs at a time")
    parser.add_argument("--only", action="append", metavar="ADAPTER:DTYPE", help="these runs only (repeatable)")
    args = parser.parse_args(argv)
    runs = [tuple(r.split(":")) for r in args.only] if args.only else RUNS
    print(f"every invariant on each adapter, {args.examples:,d} examples per invariant (fresh randomness)")
    print(f"{'adapter':30} {'dtype':8} {'ran':>4} {'skipped':>7} {'failed':>6} {'examples':>10} {'minutes':>8} {'examples/s':>10}")
    problems = []
    with ThreadPoolExecutor(args.jobs) as pool:
        for (target, dtype), outcomes in pool.map(lambda run: (run, soak(*run, args.examples)), runs):  # in order, as they finish
            ran = [o for o in outcomes if o["status"] != "skipped"]
            bad = [o for o in ran if o["status"] != "passed"]
            examples, seconds = sum(o["examples"] for o in ran), sum(o["seconds"] for o in ran)
            print(f"{target:30} {dtype:8} {len(ran):4d} {len(outcomes) - len(ran):7d} {len(bad):6d} {examples:10,d} {seconds / 60:8.1f} "
                  f"{examples / max(seconds, 1e-9):10.0f}", flush=True)
            problems += [(target, dtype, o) for o in bad]
    for target, dtype, o in problems:
        print(f"\n--- {target} ({dtype}) {o['invariant']}: {o['status']}\n{o['report']}")


if __name__ == "__main__":
    main()
