"""Benchmark: the transformers model tests (tests/test_*_transformers.py) at the thorough profile, or N examples of it.

    python benchmarks/model_soak.py                    # thorough: 10,000 examples per law and model (hours on 2 cores)
    python benchmarks/model_soak.py --examples 1000    # a tenth of it
    python benchmarks/model_soak.py --examples 1000 -- -k "gemma or mla"   # pytest's own options after --

Those tests hold transformers' own modules (Llama 3.1's rope scaling, Phi-3, GPT-NeoX, BLOOM, Gemma 2 and 3, gpt-oss,
DeepSeek-V3, Qwen3-MoE, Qwen2, Ministral) to the laws at the ci profile. This runs the same tests, in pytest with
`-n 2`, with the thorough profile's settings (fresh randomness, direct draws past the engine's first examples) in place
of ci's: it loads itself as a pytest plugin in every worker, which hands the test modules those settings when they ask
invariants.profiles for "ci". Prints pytest's summary and the wall time; asserts nothing (figures, not a test).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = "TI_MODEL_SOAK_EXAMPLES"  # read by the plugin half of this file, in every pytest process


def pytest_configure(config):
    """The plugin: profile_settings("ci") answers the thorough profile at the asked-for examples, in this process."""
    from hypothesis import settings

    from invariants import profiles

    chosen = settings(profiles.PROFILES["thorough"], max_examples=int(os.environ[EXAMPLES]))
    asked = profiles.profile_settings
    profiles.profile_settings = lambda name: chosen if name == "ci" else asked(name)


def pytest_report_header(config):
    return f"model soak: the thorough profile at {int(os.environ[EXAMPLES]):,} examples per law and model, in place of ci's"


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--examples", type=int, default=10_000, help="examples per law and model (default: the thorough profile's 10,000)")
    parser.add_argument("pytest_args", nargs="*", help="more pytest arguments, after --")
    args = parser.parse_args()
    if args.examples < 1:
        parser.error(f"--examples {args.examples} must be at least 1")
    tests = sorted(str(p.relative_to(ROOT)) for p in (ROOT / "tests").glob("test_*_transformers.py"))
    env = {**os.environ, EXAMPLES: str(args.examples), "OMP_NUM_THREADS": "1",
           "PYTHONPATH": os.pathsep.join(filter(None, (str(ROOT / "benchmarks"), os.environ.get("PYTHONPATH"))))}
    command = [sys.executable, "-m", "pytest", "-p", "model_soak", "-p", "no:cacheprovider", "-n", "2", "-q", *tests, *args.pytest_args]
    start = time.perf_counter()
    done = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True)
    print("\n".join(done.stdout.strip().splitlines()[-25:]))
    print(f"{args.examples:,} examples per law and model: {time.perf_counter() - start:,.0f} s of wall time, pytest exit {done.returncode}")


if __name__ == "__main__":
    main()
