"""Confinement from the kernel (invariants.gate.confine): what a worker under bubblewrap or the unshare fallback can see, write and reach.

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

import invariants.gate.grade as grade_module
from invariants.gate import batch, confine, sandbox, stages
from invariants.gate.config import load_assignment
from invariants.gate.grade import grade
from invariants.gate.reports import write_reports
from invariants.gate.result import FAILED, GATE_ERROR, PASSED

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
    hints = {"paths": [str(ROOT / "invariants" / "reference" / "numpy.py"), str(ROOT / "invariants" / "gate" / "assignments" / "p01.toml"),
                       str(secret),
                       str(ROOT / "invariants" / "gate" / "grade.py")],
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
        # As root without capabilities: the uid switch works unconfined only where the interpreter is readable by other users,
        # and root writes (and the probe lists) nearly every folder it walks, so the output cap must hold the probe's whole line.
        unconfined = dataclasses.replace(assignment, tool="none", secret_file=str(secret), drop_user=False,
                                         limits=dataclasses.replace(assignment.limits, output_kib=4096))
        result = grade(folder, unconfined)
    finally:
        (Path("/tmp") / f"gate-probe-{token}").unlink(missing_ok=True)
    report = _probe(result)
    assert any(item.endswith(str(ROOT / "invariants" / "reference" / "numpy.py")) for item in report["found"]), report["found"]
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
    assert result.score is None, "a refusal grades nothing, so it has no score"


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
    submission = tmp_path / "submission"
    submission.mkdir()
    os.chmod(tmp_path, 0o755)
    view = confine.View.for_worker(submission=submission, runtime=confine.copy_runtime(tmp_path / "runtime"), scratch_bytes=1 << 20,
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


@pytest.mark.parametrize("tool_name", CONFINED)
def test_a_tree_under_tmp_is_passable_for_the_workers_uid(tool_name, tmp_path):
    """A virtualenv under /tmp (a CI clone there) lies inside the worker's private /tmp: its parents are made 0755, not 0700."""
    tool = _tool(tool_name)
    assert str(tmp_path).startswith("/tmp/"), tmp_path
    lib = tmp_path / "venv" / "site-packages"
    (lib / "installed_lib").mkdir(parents=True)
    (lib / "installed_lib" / "__init__.py").write_text("VALUE = 7\n")
    submission = tmp_path / "submission"
    submission.mkdir()
    view = confine.View.for_worker(submission=submission, runtime=confine.copy_runtime(tmp_path / "runtime"), scratch_bytes=1 << 20,
                                   trees=[*confine._interpreter_trees(), str(lib)], project=[])
    uid = sandbox.UID_BASE + os.getpid()
    switch_then_import = (f"import os, sys; os.setgroups([]); os.setresgid({uid}, {uid}, {uid}); os.setresuid({uid}, {uid}, {uid}); "
                          f"sys.path.insert(0, {str(lib)!r}); import installed_lib; print(installed_lib.VALUE)")
    command = view.command(tool, [sys.executable, "-c", switch_then_import], scratch=tmp_path, drop_user=True, info_fd=None)
    done = subprocess.run(command, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and done.stdout.strip() == "7", done.stderr


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


def _handles(result):
    line = next((line for line in result.output["stdout"].splitlines() if line.startswith("HANDLES ")), None)
    assert line, f"the fixture printed nothing: {result.reason}\n{result.output['stderr'][-1500:]}"
    return json.loads(line[len("HANDLES "):])


@pytest.mark.parametrize("tool_name", CONFINED)
@pytest.mark.parametrize("umask", [0o022, 0o027, 0o077], ids=["umask022", "umask027", "umask077"])
def test_the_worker_holds_no_capability_whatever_the_umask(tool_name, umask, assignment, tmp_path):
    """Issue 24: under umask 077 the worker kept CAP_DAC_READ_SEARCH, and open_by_handle_at on a forged root handle opened the host's /."""
    if os.getuid() != 0:
        pytest.skip("the capabilities at stake are root's")
    _tool(tool_name)
    folder = tmp_path / "handles"
    shutil.copytree(HOSTILE / "handles", folder)
    marker = tmp_path / "marker.txt"
    marker.write_text("host-" + uuid.uuid4().hex)
    (folder / "hints.json").write_text(json.dumps({"marker": str(marker)}))
    before = os.umask(umask)
    try:
        result = grade(folder, dataclasses.replace(assignment, tool=tool_name))
    finally:
        os.umask(before)
    report = _handles(result)
    empty = {name: "0000000000000000" for name in ("CapInh", "CapPrm", "CapEff", "CapAmb", "CapBnd")}
    assert report["self"] == empty, f"the worker's capability sets under umask {umask:03o}: {report['self']}"
    assert {k: v for k, v in report["init"].items() if k != "CapBnd"} == {k: v for k, v in empty.items() if k != "CapBnd"}, report["init"]
    if tool_name == "unshare":  # bubblewrap's pid 1 keeps the host's bounding set; invariants/gate/launch.py's keeps nothing
        assert report["init"]["CapBnd"] == "0000000000000000", report["init"]
    assert report["name_to_handle_at"] == "ENOSYS" and report["open_by_handle_at"] == "ENOSYS", report  # not on the seccomp allowlist
    assert report["marker"].startswith("unreadable"), report["marker"]
    assert result.protections["user"].startswith("an unprivileged uid"), result.protections["user"]
    assert result.protections["capabilities"].startswith("none: "), result.protections["capabilities"]
    assert result.sandbox["missing"] == [] and result.verdict == PASSED, (result.sandbox, result.reason)


@pytest.mark.parametrize("tool_name", CONFINED)
def test_the_scratch_folder_has_a_quota(tool_name, assignment):
    """Issue 24: 2 GiB were written into the scratch folder; a tmpfs of [limits] scratch_mib refuses more, as the submission's error."""
    _tool(tool_name)
    small = dataclasses.replace(assignment, tool=tool_name, limits=dataclasses.replace(assignment.limits, scratch_mib=8))
    result = grade(HOSTILE / "fill_scratch.py", small)
    reasons = " ".join(i.reason for i in result.invariants)
    assert result.verdict == FAILED and "No space left on device" in reasons, (result.verdict, result.reason, reasons[:500])
    assert "8 MiB tmpfs at /sandbox/work" in result.protections["tmp"], result.protections["tmp"]


@pytest.mark.parametrize("tool_name", [*CONFINED, "none"])
def test_a_scratch_tmp_replaced_by_a_file_is_no_gate_error(tool_name, assignment):
    """Issue 24: the worker put a file where its scratch folder's tmp was, and the next worker's start raised in the parent."""
    if tool_name != "none":
        _tool(tool_name)
    result = grade(HOSTILE / "replace_tmp.py", dataclasses.replace(assignment, tool=tool_name))
    assert result.verdict == FAILED and result.worker_starts >= 2, (result.verdict, result.reason, result.output.get("gate_traceback"))
    assert all("exited with status 0" in i.reason for i in result.invariants), [i.reason for i in result.invariants]


def test_kill_uid_leaves_nothing_of_the_uid():
    """A process of the worker's uid outside every namespace and process group (setsid) is killed by kill(-1) from that uid."""
    if os.getuid() != 0:
        pytest.skip("switching to another uid needs root")
    uid = sandbox.UID_BASE + 999_000 + os.getpid() % 1000
    stray = subprocess.Popen(["sleep", "61.5"], user=uid, group=uid, extra_groups=[], start_new_session=True)
    try:
        assert sandbox.processes_of(uid) == [stray.pid]
        sandbox.kill_uid(uid)
        assert sandbox.processes_of(uid) == [] and stray.wait(timeout=5) == -9
    finally:
        stray.kill()
    with pytest.raises(ValueError, match="every process on the machine"):
        sandbox.kill_uid(0)


@pytest.mark.parametrize("tool_name", CONFINED)
def test_a_batch_grading_that_raises_leaves_no_worker_behind(tool_name, tmp_path, monkeypatch):
    """Issue 24: when grading raised after the worker started, its sandbox ran on through the next student's grading."""
    if os.getuid() != 0:
        pytest.skip("the worker's uid exists only when the gate runs as root")
    _tool(tool_name)
    marker = f"{62 + (uuid.uuid4().int % 10_000) / 10_000:.4f}"
    first, second = tmp_path / "a_daemon", tmp_path / "b_good"
    first.mkdir()
    shutil.copy(HOSTILE / "daemon.py", first / "submission.py")
    (first / "MARKER.txt").write_text(marker)
    second.mkdir()
    shutil.copy(HOSTILE / "good.py", second / "submission.py")
    uid = sandbox.UID_BASE + os.getpid()
    seen, start = [], grade_module.Session.start

    def looking(session):  # what is left of the earlier worker when each one starts
        seen.append((session.layout.source, sandbox.processes_of(uid), _sleepers(marker)))
        return start(session)

    def raising(rows, selected, evidence, layout, *args):
        if "a_daemon" in layout.source:
            raise RuntimeError("injected: the gate failed after the worker started")
        return forbidden(rows, selected, evidence, layout, *args)

    forbidden = stages.void_forbidden
    monkeypatch.setattr(grade_module.Session, "start", looking)
    monkeypatch.setattr(stages, "void_forbidden", raising)
    monkeypatch.setattr(batch, "_STATE", {})
    monkeypatch.setenv(confine.ENV, tool_name)
    try:
        rows = batch.grade_folder([first, second], tmp_path / "out", {"assignment": str(FIXTURES / "assignments" / "hostile.toml"),
                                                                    "formats": ("json",)})
        assert [r["verdict"] for r in rows] == [GATE_ERROR, PASSED], rows
        assert "injected" in rows[0]["reason"], rows[0]["reason"]
        later = [(source, left, sleepers) for source, left, sleepers in seen if "b_good" in source]
        assert later and all(left == [] and sleepers == [] for _, left, sleepers in later), later
        assert sandbox.processes_of(uid) == [] and _sleepers(marker) == []
    finally:
        for pid in _sleepers(marker):
            os.kill(int(pid), 9)
