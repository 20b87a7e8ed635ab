"""Hostile and broken submissions: each gets a failing or not-gradable verdict with a clear reason,
the gate survives, and every report is written.

The fixtures are in tests/fixtures/hostile/; they are bounded (a fork bomb that stops at 300
children, a memory bomb that stops at 3 GiB of untouched pages), so a broken limit fails a
test here instead of taking the machine down. The assignment has short limits and few examples.
"""

from __future__ import annotations

import json
import os
import re
import time
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from invariants.gate.config import load_assignment
from invariants.gate.grade import grade
from invariants.gate.reports import write_reports
from invariants.gate.result import FAILED, NOT_GRADABLE, PASSED, SCHEMA_VERSION
from invariants.gate.sandbox import UID_BASE

FIXTURES = Path(__file__).parent / "fixtures"
HOSTILE = FIXTURES / "hostile"


@pytest.fixture(scope="module")
def assignment():
    return load_assignment(FIXTURES / "assignments" / "hostile.toml")


def graded(submission, assignment, out):
    """Grade, write every report, and check the reports are well-formed."""
    result = grade(submission, assignment)
    paths = write_reports(result, out)
    names = [p.name for p in paths]
    assert names[:4] == ["report.json", "junit.xml", "results.json", "summary.md"], names
    assert all(name.startswith("repro_") and name.endswith(".py") for name in names[4:]), names  # one per visible failure
    report = json.loads((out / "report.json").read_text())
    assert report["verdict"] == result.verdict and report["schema_version"] == SCHEMA_VERSION
    ET.parse(out / "junit.xml")  # parses: escaped output, no control characters
    gradescope = json.loads((out / "results.json").read_text())
    assert gradescope["score"] == (0 if result.score is None else result.score)  # Gradescope's 0 where there is no score
    return result


def reasons(result):
    return "\n".join([result.reason, *(f"{i.status}: {i.reason}" for i in result.invariants)])


def test_control_submission_passes(assignment, tmp_path):
    result = graded(HOSTILE / "good.py", assignment, tmp_path)
    assert result.verdict == PASSED, reasons(result)
    assert result.score == result.max_score == 2


CASES = [  # fixture, verdict, a phrase the reasons must contain
    ("import_error.py", NOT_GRADABLE, "ModuleNotFoundError: No module named 'no_such_package_for_the_gate'"),
    ("missing_functions.py", NOT_GRADABLE, "does not provide layer_norm"),
    ("wrong_signature.py", FAILED, "cannot be called as layer_norm(x, gain, bias, eps)"),
    ("wrong_shape.py", FAILED, "shape of layer_norm output=(1, 3), but should be (1, 4)"),
    ("wrong_type.py", FAILED, "type of layer_norm output=str, but should be an array"),
    ("nan_output.py", FAILED, "=nan, but should be finite"),
    ("infinite_loop.py", FAILED, "did not answer within 2 s (the per-call limit)"),
    ("exit_at_import.py", NOT_GRADABLE, "SystemExit(0): sys.exit() was called"),
    ("os_exit_at_import.py", NOT_GRADABLE, "exited with status 0"),
    ("exit_in_call.py", FAILED, "layer_norm raised SystemExit(0)"),
    ("os_exit_in_call.py", FAILED, "exited with status 0"),
    ("segfault.py", FAILED, "segmentation fault (SIGSEGV)"),
    ("lying_eq.py", FAILED, "returned a lying_eq.Anything, not an array"),
    ("lying_ndarray.py", FAILED, "values out of tolerance"),
]


@pytest.mark.parametrize("fixture, verdict, phrase", CASES, ids=[c[0].removesuffix(".py") for c in CASES])
def test_hostile_submission_fails_with_a_reason(fixture, verdict, phrase, assignment, tmp_path):
    result = graded(HOSTILE / fixture, assignment, tmp_path)
    assert result.verdict == verdict, reasons(result)
    assert phrase in reasons(result)
    assert (result.score is None) == (verdict == NOT_GRADABLE) and (result.score or 0) < result.max_score


def test_syntax_error_is_not_gradable(assignment, tmp_path):
    source = tmp_path / "syntax_error.py"
    source.write_text("BACKEND = 'numpy'\n\ndef layer_norm(x, gain, bias, eps)\n    return x\n")
    result = graded(source, assignment, tmp_path / "out")
    assert result.verdict == NOT_GRADABLE
    assert result.reason.startswith("SyntaxError at syntax_error.py:3"), result.reason


def _max_count(pattern, text):
    return max((int(n) for n in re.findall(pattern, text)), default=0)


def test_fork_bomb_is_stopped_by_the_process_limit(assignment, tmp_path):
    result = graded(HOSTILE / "fork_bomb.py", assignment, tmp_path)
    assert result.verdict == FAILED, reasons(result)
    if "NOT ENFORCED" in result.protections["processes"]:
        pytest.skip(f"RLIMIT_NPROC is not enforced here: {result.protections['user']}")
    forked = _max_count(r"forked (\d+) children", result.output["stderr"])
    assert 0 < forked < assignment.limits.processes, result.output["stderr"][-500:]
    deadline = time.monotonic() + 10  # SIGKILL is delivered asynchronously; zombies await their reaper
    while (survivors := _running_as(_worker_uid(result))) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not survivors, f"processes of the worker's uid outlived the run: {survivors}"


def _running_as(uid):
    """Processes of uid that are not zombies."""
    alive = []
    for proc in Path("/proc").iterdir():
        try:
            if proc.name.isdigit() and proc.stat().st_uid == uid and (proc / "stat").read_text().rsplit(")", 1)[1].split()[0] != "Z":
                alive.append(proc.name)
        except OSError:
            continue
    return alive


def _worker_uid(result):
    return UID_BASE + os.getpid()  # grade() ran in this process


def test_memory_bomb_is_stopped_by_the_memory_limit(assignment, tmp_path):
    result = graded(HOSTILE / "memory_bomb.py", assignment, tmp_path)
    assert result.verdict == FAILED and "MemoryError" in reasons(result)
    reached = _max_count(r"allocated (\d+) MiB", result.output["stderr"])
    assert 0 < reached <= assignment.limits.memory_mib, result.output["stderr"][-300:]


def test_writes_outside_the_scratch_folder_are_refused(assignment, tmp_path):
    protected = tmp_path / "protected"
    protected.mkdir(mode=0o755)
    target = protected / "escaped.txt"
    submission = tmp_path / "write_outside"
    submission.mkdir()
    (submission / "submission.py").write_text((HOSTILE / "write_outside" / "submission.py").read_text())
    (submission / "target.txt").write_text(str(target))
    result = graded(submission, assignment, tmp_path / "out")
    assert result.verdict == FAILED
    if not result.protections["user"].startswith("an unprivileged uid"):
        target.unlink(missing_ok=True)
        pytest.skip(f"the worker kept this user's rights, so it can write here: {result.protections['user']}")
    assert not target.exists(), result.output["stdout"][:500]
    assert f"refused {target}" in result.output["stdout"]


def test_monkeypatching_changes_nothing_and_is_evidence(assignment, tmp_path):
    result = graded(HOSTILE / "monkeypatch.py", assignment, tmp_path)
    assert result.verdict == FAILED, reasons(result)
    known = next(i for i in result.invariants if i.name == "norms.layer_norm_known_values")
    assert known.status == "failed" and "got -1.16189152, expected -1.34163542" in known.details
    blocked = {e["name"] for e in result.evidence if e["kind"] == "blocked_import"}
    assert {"invariants.asserts", "invariants.gate"} <= blocked  # invariants itself opens to the shipped toolkit alone


def test_reference_import_is_evidence_from_scan_and_worker(assignment, tmp_path):
    result = graded(HOSTILE / "reference_import.py", assignment, tmp_path)
    assert result.verdict == NOT_GRADABLE and "does not let a submission import 'reference'" in result.reason
    sources = {e["source"] for e in result.evidence if e["name"] == "reference"}
    assert sources == {"source scan", "worker"}
    assert "reference" in (tmp_path / "summary.md").read_text()


def test_a_submission_may_use_the_toolkit_the_gate_ships(assignment, tmp_path):
    result = graded(HOSTILE / "toolkit_layer_norm.py", assignment, tmp_path)
    assert result.verdict == PASSED, reasons(result)
    assert not [e for e in result.evidence if e["kind"] == "blocked_import"], result.evidence


def test_the_other_adapters_stay_blocked_and_the_reason_names_the_toolkit(assignment, tmp_path):
    result = graded(HOSTILE / "adapter_import.py", assignment, tmp_path)
    assert result.verdict == NOT_GRADABLE and "does not let a submission import 'invariants.adapters.gpt2'" in result.reason, result.reason
    assert "a submission may import invariants.adapters.toolkit" in result.reason
    assert {e["source"] for e in result.evidence if e["name"] == "invariants.adapters.gpt2"} == {"source scan", "worker"}


def test_megabytes_of_output_are_capped_and_escaped(assignment, tmp_path):
    result = graded(HOSTILE / "print_megabytes.py", assignment, tmp_path)
    assert result.verdict == FAILED, reasons(result)
    shown = result.output["stdout"]
    assert result.output["stdout_bytes"] > 4 << 20
    assert len(shown.encode()) < 3 * (assignment.limits.output_kib << 10)  # escapes may triple a few characters
    assert "\x1b" not in shown and "\x00" not in shown and "\u202e" not in shown
    assert "bytes not shown" in shown
    markdown = (tmp_path / "summary.md").read_text()
    fence = re.search(r"^(`{4,})text$", markdown, flags=re.M)
    assert fence, "the output fence must be longer than the ``` the submission printed"
    junit = ET.parse(tmp_path / "junit.xml").getroot()
    assert "</system-out>" in junit.find(".//system-out").text  # kept as text, not markup


def test_the_gate_leaves_no_scratch_behind(assignment, tmp_path):
    before = set(os.listdir(tmp_path))
    result = grade(HOSTILE / "os_exit_in_call.py", assignment, scratch_root=tmp_path)
    assert result.verdict == FAILED
    assert set(os.listdir(tmp_path)) == before
