"""Confinement from the kernel (gate.confine): what a worker under bubblewrap or the unshare fallback can see, write and reach.

The probe (tests/fixtures/hostile/hunt) hunts for the reference through the paths the test names,
sys.path, sys.modules (the editable finder), the distribution's metadata, /proc (every process's
command line, environment, cwd and root, the parent's above all, the mount table) and a walk of
the whole file system; it writes into every folder it walked, connects to a port the test
listens on, and answers with the reference's layer_norm if it found the reference. Each
confined tool must leave it nothing; unconfined, it finds the reference (the control, which
shows the probe is not blind). Hosts without a tool skip those tests and say why.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import socket
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from gate import confine
from gate.config import load_assignment
from gate.grade import grade
from gate.reports import write_reports
from gate.result import FAILED, GATE_ERROR, PASSED

ROOT = Path(__file__).resolve().parent.parent
FIXTURES = Path(__file__).parent / "fixtures"
HOSTILE = FIXTURES / "hostile"
CONFINED = ("bubblewrap", "unshare")


def _tool(name):
    tool = confine.choose(name)
    if tool.name != name:
        pytest.skip(f"{name} is not available on this host: {tool.detail}")
    return tool


@pytest.fixture(scope="module")
def assignment():
    """The hostile fixtures' assignment, with time for the probe's bounded walk (4 s, then 4 s of writes) on a loaded machine."""
    hostile = load_assignment(FIXTURES / "assignments" / "hostile.toml")
    return dataclasses.replace(hostile, limits=dataclasses.replace(hostile.limits, import_seconds=60, run_seconds=120))


@pytest.fixture
def listener():
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen()
    yield server.getsockname()[1]
    server.close()


def _hunt(tmp_path, port, *, seconds=4.0):
    """The probe as a folder submission, with hints naming the real paths, a secret file and a token of its own."""
    folder = tmp_path / "hunt"
    shutil.copytree(HOSTILE / "hunt", folder)
    secret = tmp_path / "course.secret"
    secret.write_text("s3cret-" + uuid.uuid4().hex + "\n")
    token = uuid.uuid4().hex[:12]
    hints = {"paths": [str(ROOT / "reference" / "numpy.py"), str(ROOT / "assignments" / "p01.toml"), str(secret), str(ROOT / "gate" / "grade.py")],
             "tokens": [secret.read_text().strip(), "hostile fixtures"], "port": port, "token": token, "seconds": seconds}
    (folder / "hints.json").write_text(json.dumps(hints))
    return folder, secret, token


def _probe(result):
    line = next((line for line in result.output["stdout"].splitlines() if line.startswith("PROBE ")), None)
    assert line, f"the probe printed nothing: {result.reason}\n{result.output['stderr'][-1500:]}"
    return json.loads(line[len("PROBE "):])


@pytest.mark.parametrize("tool_name", CONFINED)
def test_the_probe_finds_nothing_and_writes_only_to_its_own_folders(tool_name, assignment, tmp_path, listener):
    _tool(tool_name)
    folder, secret, token = _hunt(tmp_path, listener)
    graded = dataclasses.replace(assignment, tool=tool_name, secret_file=str(secret), require=("filesystem", "tmp", "pid", "network"))
    result = grade(folder, graded)
    report = _probe(result)
    assert report["found"] == [], report["found"]
    assert set(report["wrote"]) <= {confine.WORK, f"{confine.WORK}/tmp", "/tmp"}, report["wrote"]
    assert report["network"] == [], report["network"]
    assert not any("pytest" in p or "gate-probe" in p for p in report["processes"]), report["processes"]
    assert report["entries"] > 1000, "the walk saw almost nothing: is the probe broken?"
    assert "writes" not in report["routes"], "the probe ran out of time before it tried every folder"
    assert not (Path("/tmp") / f"gate-probe-{token}").exists(), "the private /tmp leaked into the host's"
    assert result.verdict == FAILED and result.score == 0, "with nothing found, the probe's layer_norm is wrong"
    assert result.sandbox["tool"] == tool_name and result.sandbox["missing"] == []
    assert "not mounted" in result.protections["filesystem"] and "PID namespace" in result.protections["pid"]


def test_unconfined_the_probe_finds_the_reference(assignment, tmp_path, listener):
    """The control: without confinement the attack of issue 11 works, so the tests above are not passing by a blind probe."""
    folder, secret, token = _hunt(tmp_path, listener, seconds=2.0)
    try:
        result = grade(folder, dataclasses.replace(assignment, tool="none", secret_file=str(secret)))
    finally:
        (Path("/tmp") / f"gate-probe-{token}").unlink(missing_ok=True)
    report = _probe(result)
    assert any(item.endswith(str(ROOT / "reference" / "numpy.py")) for item in report["found"]), report["found"]
    assert result.verdict == PASSED, "the copy read at run time passes unconfined: that is why the sandbox is required"
    assert set(result.sandbox["missing"]) >= {"filesystem", "tmp", "pid"}
    assert result.protections["filesystem"].startswith("NOT CONFINED")


def test_a_required_protection_that_is_missing_refuses_to_grade(assignment, tmp_path, listener):
    folder, _, token = _hunt(tmp_path, listener)
    refusing = dataclasses.replace(assignment, tool="none", require=("filesystem", "pid"))
    result = grade(folder, refusing)
    write_reports(result, tmp_path / "out")
    assert result.verdict == GATE_ERROR and result.exit_code == 4
    assert result.reason.startswith("refused to grade: the assignment requires filesystem, pid"), result.reason
    assert result.output["stdout"] == "", "the submission must not have run"
    assert not (Path("/tmp") / f"gate-probe-{token}").exists()
    assert "refused to grade" in (tmp_path / "out" / "summary.md").read_text()
    assert result.score == 0


@pytest.mark.parametrize("tool_name", CONFINED)
def test_masks_hide_project_paths_inside_a_mounted_tree(tool_name, tmp_path):
    """A non-editable install puts reference/ in site-packages, which the worker needs: the view masks it (and any hidden path)."""
    tool = _tool(tool_name)
    site = tmp_path / "site-packages"
    for name in ("reference", "numpy_like", "transformer_invariants-0.1.dist-info"):
        (site / name).mkdir(parents=True)
        (site / name / "__init__.py").write_text(f"# {name}\n")
    (site / "__editable___x_finder.py").write_text("MAPPING = {}\n")
    (site / "secret.txt").write_text("s3cret\n")
    work, submission = tmp_path / "work", tmp_path / "submission"
    work.mkdir()
    submission.mkdir()
    os.chmod(tmp_path, 0o755)
    view = confine.View.for_worker(work=work, submission=submission, runtime=confine.copy_runtime(tmp_path / "runtime"),
                                   hidden=[str(site / "secret.txt")], trees=[*confine._interpreter_trees(), str(site)],
                                   project=[str(site / "reference"), str(site / "__editable___x_finder.py"),
                                            str(site / "transformer_invariants-0.1.dist-info")])
    listing = (f"import os; s={str(site)!r}; print(sorted(os.listdir(s))); "
               f"print([len(os.listdir(os.path.join(s, n))) if os.path.isdir(os.path.join(s, n)) else os.path.getsize(os.path.join(s, n)) "
               f"for n in sorted(os.listdir(s))])")
    command = view.command(tool, [sys.executable, "-c", listing], scratch=tmp_path, drop_user=False, info_fd=None)
    done = subprocess.run(command, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    names, sizes = (eval(line) for line in done.stdout.splitlines())  # noqa: S307 - our own printout
    contents = dict(zip(names, sizes, strict=True))
    assert contents["numpy_like"] == 1, "a library the worker needs stays visible"
    assert contents["reference"] == 0 and contents["transformer_invariants-0.1.dist-info"] == 0, contents
    assert contents["__editable___x_finder.py"] == 0 and contents["secret.txt"] == 0, contents


def _sleepers(marker):
    found = []
    for proc in Path("/proc").iterdir():
        try:
            if proc.name.isdigit() and marker in (proc / "cmdline").read_bytes().decode(errors="replace"):
                found.append(proc.name)
        except OSError:
            continue
    return found


@pytest.mark.parametrize("tool_name", CONFINED)
@pytest.mark.parametrize("drop_user", [True, False], ids=["own-uid", "root-without-capabilities"])
def test_no_worker_process_outlives_the_gate(tool_name, drop_user, assignment, tmp_path):
    """A grandchild that left the worker's session is gone when grade() returns: the PID namespace dies with its pid 1."""
    _tool(tool_name)
    if drop_user and os.getuid() != 0:
        pytest.skip("the uid switch needs the gate to run as root")
    marker = f"{61 + (uuid.uuid4().int % 10_000) / 10_000:.4f}"
    folder = tmp_path / "daemon"
    folder.mkdir()
    shutil.copy(HOSTILE / "daemon.py", folder / "submission.py")
    (folder / "MARKER.txt").write_text(marker)
    try:
        result = grade(folder, dataclasses.replace(assignment, tool=tool_name, drop_user=drop_user))
        assert result.worker_starts >= 1
        assert _sleepers(marker) == [], f"a sleeper with the marker {marker} outlived the gate"
    finally:
        for pid in _sleepers(marker):
            os.kill(int(pid), 9)


@pytest.mark.parametrize("tool_name", CONFINED)
def test_the_hostile_fixtures_keep_their_verdicts_confined(tool_name, assignment, tmp_path):
    """The limits the gate had before the sandbox still hold inside it (the hostile suite runs under the default tool)."""
    _tool(tool_name)
    confined = dataclasses.replace(assignment, tool=tool_name)
    for fixture, phrase in [("segfault.py", "segmentation fault (SIGSEGV)"), ("os_exit_in_call.py", "exited with status 0"),
                            ("memory_bomb.py", "MemoryError"), ("infinite_loop.py", "did not answer within 2 s")]:
        result = grade(HOSTILE / fixture, confined)
        text = "\n".join([result.reason, *(i.reason for i in result.invariants), result.output.get("stderr", "")])
        assert result.verdict == FAILED and phrase in text, (fixture, result.reason)


def test_sandbox_start_up_cost(assignment):
    """Each tool starts a worker (to its hello, before the submission) within a second; the figure is in report["sandbox"]."""
    for name in ("none", *CONFINED):
        if confine.choose(name).name != name:
            continue
        began = time.monotonic()
        result = grade(HOSTILE / "good.py", dataclasses.replace(assignment, tool=name))
        assert result.verdict == PASSED, (name, result.reason)
        assert 0 < result.sandbox["seconds"] < 5, (name, result.sandbox)
        assert time.monotonic() - began < 30
