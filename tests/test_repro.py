"""A failure's repro script runs with plain python against the student's module, from any folder: it shows the answers the suite saw
and what it expected, and exits 1 while they are the same, 0 once they changed, 2 when its module is gone."""

from __future__ import annotations

import dataclasses
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from invariants import REGISTRY, all_invariants, load_implementation, run_invariant
from invariants.profiles import profile_settings
from invariants.repro import MAX_ARRAY_BYTES, write_repro

all_invariants()
ROOT = Path(__file__).resolve().parent.parent
LEAKY = ROOT / "examples" / "submissions" / "mask_after_softmax.py"


def _run_script(path, *args, cwd=None):
    return subprocess.run([sys.executable, str(path), *map(str, args)], capture_output=True, text=True, timeout=120, cwd=cwd or path.parent)


def _leaky_repro(tmp_path, name="attention.causal_non_leakage"):
    impl = load_implementation(str(LEAKY))
    outcome = run_invariant(REGISTRY[name], impl, settings=profile_settings("ci"))
    assert outcome.status == "failed" and outcome.calls
    return outcome, impl, write_repro(outcome, impl, tmp_path)


@pytest.mark.parametrize("name", ["attention.causal_non_leakage", "model.agrees_with_reference"])
def test_the_repro_replays_the_failing_calls_without_the_suite(name, tmp_path):
    outcome, _, script = _leaky_repro(tmp_path, name)
    imported = set(re.findall(r"^(?:import|from) (\w+)", script.read_text(), re.M)) | set(re.findall(r"^ +import (\w+)", script.read_text(), re.M))
    assert imported <= {"importlib", "sys", "pathlib", "numpy", "torch"}, imported
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    done = _run_script(script, cwd=elsewhere)  # its default target is the file the suite ran, wherever it is run from
    assert done.returncode == 1, done.stderr
    assert done.stdout.count("call ") == len(outcome.calls)
    assert f"violated: {outcome.problem.splitlines()[0]}" in done.stdout and f"hint: {outcome.hint}" in done.stdout
    what, _, expected = outcome.problem.splitlines()[0].partition(", but should be ")
    assert f"the suite expected: {what.rpartition('=')[0]} should be {expected.rpartition(' [')[0]}" in done.stdout
    assert f"REPRODUCES: every answer is the one the suite judged a violation of {name}" in done.stdout


def test_a_repro_finds_a_module_name_from_the_folder_it_was_imported_from(tmp_path, monkeypatch):
    package = tmp_path / "course" / "leaky"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text(LEAKY.read_text())
    monkeypatch.syspath_prepend(str(tmp_path / "course"))
    impl = load_implementation("leaky")
    outcome = run_invariant(REGISTRY["attention.causal_non_leakage"], impl, settings=profile_settings("ci"))
    script = write_repro(outcome, impl, tmp_path / "repro")
    done = _run_script(script, cwd=tmp_path)
    assert done.returncode == 1 and "REPRODUCES" in done.stdout, done.stderr


def test_a_repro_whose_module_is_gone_says_so_and_exits_2(tmp_path):
    moved = tmp_path / "solution.py"
    moved.write_text(LEAKY.read_text())
    impl = load_implementation(str(moved))
    outcome = run_invariant(REGISTRY["attention.causal_non_leakage"], impl, settings=profile_settings("ci"))
    script = write_repro(outcome, impl, tmp_path / "repro")
    moved.unlink()
    done = _run_script(script)
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr
    assert done.stderr.startswith(f"{script.name} was written for {moved}, which is not at {moved} any more: give the module to run it on")


@pytest.mark.parametrize("given", ["no_such_file.py", "no_such_module", "broken.py"])
def test_a_repro_given_a_module_it_cannot_load_says_so_in_one_line_and_exits_2(given, tmp_path):
    """Exit 1 means the failure reproduces: a file or module that is not there, or that raises as it loads, replays nothing."""
    _, _, script = _leaky_repro(tmp_path)
    (tmp_path / "broken.py").write_text("def attention(x:\n")
    done = _run_script(script, given)
    said = done.stderr.splitlines()
    assert done.returncode == 2 and len(said) == 1 and said[0].startswith(f"{script.name}: cannot load {given}: "), done.stderr
    assert "REPRODUCES" not in done.stdout, done.stdout


def test_large_inputs_go_beside_the_script_in_an_npz(tmp_path):
    impl = load_implementation(str(LEAKY))
    outcome = run_invariant(REGISTRY["model.agrees_with_reference"], impl, settings=profile_settings("ci"))
    script = write_repro(outcome, impl, tmp_path)
    has_npz = script.with_suffix(".npz").exists()
    assert has_npz == ("ARRAYS = np.load" in script.read_text())


def test_the_repro_runs_against_another_module_given_on_the_command_line(tmp_path):
    outcome, _, script = _leaky_repro(tmp_path)
    fixed = tmp_path / "fixed.py"
    fixed.write_text("from reference.numpy import attention\n")
    done = subprocess.run([sys.executable, str(script), str(fixed)], capture_output=True, text=True, timeout=120, cwd=tmp_path,
                          env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"})
    assert done.returncode == 0, done.stderr
    assert "NO LONGER REPRODUCES: the answers to call(s) 1, 2 changed. This script compares answers with the failing ones; " \
           "it does not re-check the property" in done.stdout
    now = [line for line in done.stdout.splitlines() if line.startswith("  now[1]")]  # the weights: fixed, the future gets 0
    seen = [line for line in done.stdout.splitlines() if line.startswith("  the suite saw[1]")]
    assert len(now) == len(seen) == len(outcome.calls) and now != seen


def test_a_passing_invariant_has_no_repro(tmp_path):
    impl = load_implementation("reference.numpy")
    outcome = run_invariant(REGISTRY["attention.causal_non_leakage"], impl, settings=profile_settings("ci"))
    assert outcome.passed and write_repro(outcome, impl, tmp_path) is None


def test_a_repro_whose_answers_are_not_finite_still_runs(tmp_path):
    def nan_norm(x, gain, bias, eps):
        return x * float("nan")  # NaN in every answer: the script must write and read it back

    from invariants import Implementation

    impl = Implementation.from_functions(backend="numpy", label="NaN layer_norm", layer_norm=nan_norm)
    outcome = run_invariant(REGISTRY["norms.layer_norm_known_values"], impl, settings=profile_settings("ci"))
    assert outcome.status == "failed" and outcome.calls
    module = tmp_path / "nan_norm.py"
    module.write_text("def layer_norm(x, gain, bias, eps):\n    return x * float('nan')\n")
    done = _run_script(write_repro(outcome, impl, tmp_path), module)
    assert done.returncode == 1, done.stderr
    assert "nan" in done.stdout and "violated:" in done.stdout and "REPRODUCES" in done.stdout


def test_repro_data_is_bounded_and_a_dropped_answer_is_described(tmp_path):
    impl = load_implementation(str(LEAKY))
    outcome = run_invariant(REGISTRY["attention.causal_non_leakage"], impl, settings=profile_settings("ci"))
    huge = np.zeros((1024, 1024, 2))  # 16 MiB of answer, as a submission answering with the wrong huge shape gives
    calls = tuple((name, args, huge) for name, args, _ in outcome.calls)
    script = write_repro(dataclasses.replace(outcome, calls=calls), impl, tmp_path)
    kept = sum(p.stat().st_size for p in tmp_path.iterdir())
    assert kept < MAX_ARRAY_BYTES + (1 << 20), f"the repro keeps {kept:,} bytes, over its bound of {MAX_ARRAY_BYTES:,}"
    done = _run_script(script, LEAKY)
    assert done.returncode == 1, done.stderr
    assert done.stdout.count("the suite saw an answer this script does not keep: float64 (1024, 1024, 2), 16,777,216 bytes") == len(calls)
    assert f"({len(calls)} answer(s) not kept here were not compared)" in done.stdout


class _Forged:
    """An answer whose repr is code: the script must hold it as data."""

    def __repr__(self):
        return '0))]; __import__("pathlib").Path("PWNED").touch(); _ = [((0'  # valid source after CALLS' '('answer', '


def test_a_repro_writes_any_answer_and_message_as_data(tmp_path):
    impl = load_implementation(str(LEAKY))
    outcome = run_invariant(REGISTRY["attention.causal_non_leakage"], impl, settings=profile_settings("ci"))
    calls = tuple((name, args, _Forged()) for name, args, _ in outcome.calls)
    forged = dataclasses.replace(outcome, calls=calls, problem='"""\n__import__("pathlib").Path("PWNED").touch()\n##vso[task.complete]')
    script = write_repro(forged, impl, tmp_path)
    done = _run_script(script, LEAKY)
    assert not (tmp_path / "PWNED").exists() and done.returncode == 1, done.stderr  # 1: an answer it cannot hold is not a changed one
    assert done.stdout.count("the suite saw an answer this script does not keep: _Forged: not plain data") == len(calls)
    assert "##vso[" not in script.read_text(), "a CI command in the source, as `cat` would print it"
