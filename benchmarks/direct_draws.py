"""Benchmark: do direct draws (invariants.hypothesis_internals) find the zoo's bugs as hypothesis's engine does?

    python benchmarks/direct_draws.py                      # every mutant, 500 examples per search, seed 1
    python benchmarks/direct_draws.py --examples 1000 --seeds 1 2 3 --only 'attention.*'

Every mutant (synthetic and documented) on the invariant whose hint names its bug, searched once by
hypothesis's engine alone and once by direct draws alone (after the engine's first example, the
simplest), per seed: how many each kills within the examples, and the examples each kill needed
(detection only: no shrinking). What the direct draws save in time is soak_compare.py's to measure.
Prints figures; asserts nothing.
"""

from __future__ import annotations

import argparse
import fnmatch
import statistics
import warnings

from hypothesis import Phase, Verbosity
from hypothesis import settings as hypothesis_settings

from invariants import REGISTRY, all_invariants, run_invariant
from invariants.mutants import all_mutants
from invariants.mutants.documented import documented_mutants
from invariants.profiles import profile_settings

ENGINE, DIRECT = "engine", "direct"


def _settings(examples):
    return hypothesis_settings(profile_settings("thorough"), max_examples=examples, database=None, verbosity=Verbosity.quiet,
                               phases=(Phase.explicit, Phase.reuse, Phase.generate, Phase.target))


def _search(inv, impl, examples, seed, way):
    """The Outcome of one search: the engine throughout, or its first example and then direct draws (not shrunk)."""
    if way == ENGINE:
        return run_invariant(inv, impl, settings=_settings(examples), seed=seed, engine_examples=None)
    return run_invariant(inv, impl, settings=_settings(examples), seed=seed, engine_examples=1, shrink_limit=0)


def zoo(examples, seeds, only):
    """Per way of drawing: searches run, mutants killed, and the examples each kill took."""
    results = {ENGINE: [0, 0, []], DIRECT: [0, 0, []]}
    missed = []
    all_invariants()  # registers them
    for mutant in [*all_mutants(), *documented_mutants()]:
        if only and not fnmatch.fnmatch(mutant.name, only):
            continue
        inv = REGISTRY[mutant.killed_by]
        impl = mutant.implementation()
        for seed in seeds:
            for way in (ENGINE, DIRECT):
                outcome = _search(inv, impl, examples, seed, way)
                row = results[way]
                row[0] += 1
                if outcome.status in ("failed", "error") and not outcome.check_crashed:
                    row[1] += 1
                    row[2].append(outcome.examples_to_failure)
                else:
                    missed.append(f"{way}: {mutant.name} (seed {seed}): {outcome.status}, {outcome.reason}")
    return results, missed


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--examples", type=int, default=500, help="examples per search of a mutant (default 500)")
    parser.add_argument("--seeds", type=int, nargs="+", default=[1], help="hypothesis seeds, one search each (default 1)")
    parser.add_argument("--only", help="mutants whose name matches this glob")
    args = parser.parse_args(argv)
    warnings.filterwarnings("ignore", category=RuntimeWarning)  # the mutants' overflows, said once per search otherwise
    results, missed = zoo(args.examples, args.seeds, args.only)
    print(f"the zoo, {args.examples} examples per search, seeds {args.seeds}:")
    print("| draws | searches | killed | median examples to detection | 90th percentile | most |")
    print("| --- | --- | --- | --- | --- | --- |")
    for way, (searches, killed, needed) in results.items():
        tenth = statistics.quantiles(needed, n=10)[-1] if len(needed) > 1 else (needed or [0])[0]
        print(f"| {way} | {searches} | {killed} | {statistics.median(needed) if needed else '-'} | {tenth:.0f} | {max(needed, default=0)} |")
    for line in missed:
        print("  not killed:", line)


if __name__ == "__main__":
    main()
