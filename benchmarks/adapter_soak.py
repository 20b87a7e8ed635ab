"""Benchmark: every invariant on each adapter (code we did not write) at N examples per invariant; prints what held and how fast.

    python benchmarks/adapter_soak.py                       # thorough: 10,000 examples per invariant (hours)
    python benchmarks/adapter_soak.py --examples 1000 -j 2  # a tenth of it, two adapters at a time
    python benchmarks/adapter_soak.py --only invariants.adapters.mixtral:float32
    python benchmarks/adapter_soak.py --log soak/ --resume    # keep every outcome as it ends; rerun only what is missing

Each (adapter, dtype) runs in its own process, with fresh randomness. Prints, per run: the
invariants that ran, skipped and failed, the examples, the minutes and the examples per second,
then the report of every invariant that did not pass. Asserts nothing (figures, not a test).
With --log DIR each run appends every invariant's outcome to DIR/<adapter>-<dtype>.jsonl as it
ends, so an interrupted soak loses at most the invariant in progress; --resume then runs only the
invariants a run's log does not hold yet, and the table counts the logged ones with the new.
Needs the external extra (pip install -e '.[external]').
"""

from __future__ import annotations

import argparse
import contextlib
import json
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

# (adapter, dtype): the dtypes tox -e external runs each adapter in
RUNS = (
    ("invariants.adapters.torch_sdpa", "float64"), ("invariants.adapters.torch_sdpa", "float32"),
    ("invariants.adapters.torch_mha", "float64"), ("invariants.adapters.torch_mha", "float32"),
    ("invariants.adapters.torch_encoder_layer", "float64"), ("invariants.adapters.torch_encoder_layer", "float32"),
    ("invariants.adapters.torch_decoder_layer", "float64"), ("invariants.adapters.torch_decoder_layer", "float32"),
    ("invariants.adapters.whisper", "float64"), ("invariants.adapters.whisper", "float32"),
    ("invariants.adapters.gpt2", "float64"), ("invariants.adapters.gpt2", "float32"),
    ("invariants.adapters.hooked_transformer", "float64"), ("invariants.adapters.hooked_transformer", "float32"),
    ("invariants.adapters.mixtral", "float32"), ("invariants.adapters.vit", "float32"),
    ("invariants.adapters.gpt_neo", "float32"), ("invariants.adapters.x_transformers", "float32"),
    ("invariants.adapters.sdpa_gqa", "float64"), ("invariants.adapters.sdpa_gqa", "float32"),
    ("invariants.adapters.llama", "float32"), ("invariants.adapters.mistral", "float32"),
    ("invariants.adapters.qwen2", "float32"),
)

_ONE_RUN = """
import json, sys, warnings
from hypothesis import settings
from invariants import all_invariants, load_implementation, run_invariant
from invariants.profiles import profile_settings
target, dtype, examples, done = sys.argv[1], sys.argv[2], int(sys.argv[3]), set(json.loads(sys.argv[4]))
chosen = settings(profile_settings("thorough"), max_examples=examples, deadline=None)
impl = load_implementation(target, dtype=dtype)
for inv in (inv for inv in all_invariants() if inv.name not in done):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        o = run_invariant(inv, impl, settings=chosen, shrink_limit=200)
    print(json.dumps({"invariant": o.invariant, "status": o.status, "examples": o.examples, "seconds": o.seconds,
                      "report": o.report or o.reason}), flush=True)
"""


def _logged(log):
    """The outcome dicts a run's log holds (none without a log)."""
    if log is None or not log.exists():
        return []
    return [json.loads(line) for line in log.read_text().splitlines() if line.startswith("{")]


def soak(target, dtype, examples, log=None, resume=False):
    """[outcome dicts] of every invariant on target in dtype, run in a fresh process; each also appended to `log` as it ends.

    resume=True runs only the invariants `log` does not hold and returns the logged outcomes with the new.
    """
    earlier = _logged(log) if resume else []
    if log is not None and not resume:
        log.write_text("")
    done = json.dumps([o["invariant"] for o in earlier])
    outcomes = list(earlier)
    with tempfile.TemporaryFile("w+") as errors, open(log, "a") if log is not None else contextlib.nullcontext() as logging:
        child = subprocess.Popen([sys.executable, "-c", _ONE_RUN, target, dtype, str(examples), done],
                                 stdout=subprocess.PIPE, stderr=errors, text=True)
        for line in child.stdout:
            if line.startswith("{"):
                outcomes.append(json.loads(line))
                if logging is not None:
                    logging.write(line)
                    logging.flush()
        if child.wait() != 0:  # not logged: a resumed run tries again
            errors.seek(0)
            outcomes.append({"invariant": "(the run itself)", "status": "error", "examples": 0, "seconds": 0.0,
                             "report": errors.read().strip()[-2000:]})
    return outcomes


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--examples", type=int, default=10_000, help="examples per invariant (default: the thorough profile's 10,000)")
    parser.add_argument("-j", "--jobs", type=int, default=1, help="runs at a time")
    parser.add_argument("--only", action="append", metavar="ADAPTER:DTYPE", help="these runs only (repeatable)")
    parser.add_argument("--log", type=Path, metavar="DIR", help="append each outcome to DIR/<adapter>-<dtype>.jsonl as it ends")
    parser.add_argument("--resume", action="store_true", help="with --log: run only the invariants the logs do not hold yet")
    args = parser.parse_args(argv)
    if args.resume and args.log is None:
        parser.error("--resume reads the logs that --log DIR writes: give --log")
    runs = [tuple(r.split(":")) for r in args.only] if args.only else RUNS
    if args.log is not None:
        args.log.mkdir(parents=True, exist_ok=True)

    def log_of(target, dtype):
        return args.log / f"{target}-{dtype}.jsonl" if args.log is not None else None

    print(f"every invariant on each adapter, {args.examples:,d} examples per invariant (fresh randomness)")
    print(f"{'adapter':30} {'dtype':8} {'ran':>4} {'skipped':>7} {'failed':>6} {'examples':>10} {'minutes':>8} {'examples/s':>10}")
    problems = []
    with ThreadPoolExecutor(args.jobs) as pool:
        finished = pool.map(lambda run: (run, soak(*run, args.examples, log_of(*run), args.resume)), runs)
        for (target, dtype), outcomes in finished:  # in order, as they finish
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
