"""Installed, the plugin is a guest: a project that does not run the invariants sees no change; one that does keeps its own profile."""

from __future__ import annotations

import pytest

HOST_CONFTEST = '''
from hypothesis import settings

settings.register_profile("ci", max_examples=7, deadline=123)  # a name many projects use for their own
settings.load_profile("ci")
'''
HEAVY = ("numpy", "invariants.protocol", "invariants.registry", "reference", "reference.numpy")
HOST_TESTS = f'''
import datetime
import pathlib
import sys

from hypothesis import given, settings, strategies as st

RUNS = []


def test_the_projects_own_profile_is_loaded():
    assert settings.default.max_examples == 7
    assert settings.default.deadline == datetime.timedelta(milliseconds=123)


@given(st.integers())
def test_a_hypothesis_test_runs_the_projects_example_count(n):
    RUNS.append(n)


def test_the_count_was_the_projects():
    assert len(RUNS) == 7


def test_record_the_heavy_modules_imported():
    pathlib.Path("heavy.txt").write_text(",".join(name for name in {HEAVY!r} if name in sys.modules))
'''


@pytest.fixture
def host(pytester):
    pytester.makeconftest(HOST_CONFTEST)
    pytester.makepyfile(test_host=HOST_TESTS)
    return pytester


def _heavy_modules(host, *options):
    """The HEAVY modules imported by the end of a run of the host's own tests (all four pass)."""
    host.runpytest_subprocess("-p", "no:cacheprovider", "-p", "no:randomly", *options).assert_outcomes(passed=4)
    return [name for name in (host.path / "heavy.txt").read_text().split(",") if name]


def test_a_project_that_does_not_run_the_invariants_sees_no_change(host, monkeypatch):
    monkeypatch.setenv("TI_IMPL", "no_such_module")  # options it would refuse, were the invariants asked for
    monkeypatch.setenv("TI_DEVICE", "tpu")
    result = host.runpytest_subprocess("-p", "no:cacheprovider", "-p", "no:randomly")
    result.assert_outcomes(passed=4)
    spoken = [line for line in result.stdout.lines if "transformer-invariants" in line and not line.startswith("plugins:")]
    assert not spoken, spoken  # pytest lists the plugin; the plugin itself says nothing


def test_the_plugin_imports_nothing_heavy_when_not_asked(host):
    imported = _heavy_modules(host)
    assert not [name for name in imported if name != "numpy"], imported  # nothing of the suite
    assert imported == _heavy_modules(host, "-p", "no:invariants.plugin")  # numpy only where another plugin imports it anyway


def test_when_the_invariants_run_beside_the_projects_tests_each_keeps_its_own_settings(host):
    result = host.runpytest_subprocess(
        "test_host.py::test_the_projects_own_profile_is_loaded", "test_host.py::test_a_hypothesis_test_runs_the_projects_example_count",
        "test_host.py::test_the_count_was_the_projects", "--pyargs", "invariants", "-k", "projects or layer_norm_known_values",
        "--invariants-profile=ci", "-p", "no:cacheprovider",
    )
    result.assert_outcomes(passed=4)
    output = result.stdout.str()
    assert "invariants profile ci" in output  # the header, because the invariants were asked for
    result.stdout.fnmatch_lines(["transformer-invariants: 1 invariant passed, * example* run *"])


def test_failing_invariants_carry_their_examples_in_the_junit_xml_and_the_summary(pytester):
    import xml.etree.ElementTree as ET
    from pathlib import Path

    buggy = Path(__file__).resolve().parent.parent / "examples" / "submissions" / "unbiased_variance.py"
    result = pytester.runpytest_subprocess("--pyargs", "invariants", "--impl", str(buggy), "-k", "layer_norm_known_values or softmax_rows",
                                           "--invariants-profile=ci", "--junitxml=out.xml", "-p", "no:cacheprovider")
    outcomes = result.parseoutcomes()
    assert outcomes.get("failed") == 1 and outcomes.get("passed", 0) >= 1, result.stdout.str()
    cases = {case.get("name"): {p.get("name"): p.get("value") for p in case.iter("property")}
             for case in ET.parse(pytester.path / "out.xml").getroot().iter("testcase")}
    failing = cases["test_invariant[norms.layer_norm_known_values-float64]"]
    assert failing["invariant_status"] == "failed" and int(failing["examples_to_failure"]) >= 1 and int(failing["examples"]) >= 1
    passed = [props for name, props in cases.items() if props.get("invariant_status") == "passed"]
    assert passed and all(int(p["examples"]) >= 1 for p in passed)
    total = sum(int(props["examples"]) for props in cases.values())
    result.stdout.fnmatch_lines([f"transformer-invariants: {len(passed)} invariant* passed, 1 failed, {total:,} example* run *"])


THREADS_CONFTEST = '''
import os

def pytest_sessionfinish(session):
    if hasattr(session.config, "workerinput"):
        import torch
        with open(f"threads-{os.getpid()}.txt", "w") as f:
            f.write(str(torch.get_num_threads()))
'''


@pytest.mark.parametrize("asked", [True, False], ids=["invariants", "a host's own tests"])
def test_torch_workers_share_the_cores_only_when_the_invariants_run(asked, pytester, monkeypatch):
    """Under -n 2 each worker's torch gets its share of the cores (a thread per core in each worker thrashes); a host's run keeps torch's own."""
    import importlib.util
    import os
    import subprocess
    import sys

    if importlib.util.find_spec("torch") is None or importlib.util.find_spec("xdist") is None:  # found, not imported: pytester
        pytest.skip("needs torch and pytest-xdist")                                              # would unload torch after the test
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    pytester.makeconftest(THREADS_CONFTEST)
    pytester.makepyfile(test_host="def test_one():\n    pass\n\ndef test_two():\n    pass\n")
    args = ["--pyargs", "invariants", "--impl", "reference.torch", "-k", "softmax_rows"] if asked else ["test_host.py"]
    result = pytester.runpytest_subprocess(*args, "-n", "2", "-p", "no:cacheprovider")
    assert result.ret == 0, result.stdout.str()
    found = sorted(int(p.read_text()) for p in pytester.path.glob("threads-*.txt"))
    default = int(subprocess.run([sys.executable, "-c", "import torch; print(torch.get_num_threads())"], capture_output=True, text=True,
                                 timeout=120, env={k: v for k, v in os.environ.items() if k != "OMP_NUM_THREADS"}).stdout)
    assert found == [max(1, (os.cpu_count() or 1) // 2) if asked else default] * 2, found
