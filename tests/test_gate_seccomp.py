"""The worker's system calls and kernel state (invariants/gate/seccomp.py): an allowlist, and nothing that outlives a worker.

Issue 34: under a filter that refused two calls, a worker read the gate's session keyring, left
keys that a later worker loaded a whole solution from, bound AF_VSOCK sockets outside its
network namespace, and set up io_uring, userfaultfd and a user namespace with a mount of its
own. Now a survey from inside the worker (tests/fixtures/hostile/syscalls) tries every call
number and socket family off the list, and each must be refused, under both tools and none;
a submission that looks for keys and leaves them (tests/fixtures/hostile/keys) finds nothing,
in two gradings in a row; and honest code doing ordinary things (tests/fixtures/seccomp/ordinary.py)
keeps every one of them.
"""

from __future__ import annotations

import ctypes
import dataclasses
import errno
import json
import os
import platform
import shutil
import uuid
from pathlib import Path

import pytest

from invariants.gate import confine, sandbox, seccomp
from invariants.gate.config import load_assignment
from invariants.gate.grade import grade
from invariants.gate.result import PASSED

FIXTURES = Path(__file__).parent / "fixtures"
HOSTILE = FIXTURES / "hostile"
TOOLS = ("bubblewrap", "unshare", "landlock", "none")
MACHINE = platform.machine()
ADD_KEY = {"x86_64": 248, "aarch64": 217}
HIGHEST = 1023  # the survey's last number: past every call of today's kernels (about 470) and x86_64's x32 numbers (512 to 547)
KEYCTL_SEARCH, KEYCTL_INVALIDATE, KEY_SPEC_SESSION_KEYRING = 10, 21, -3

pytestmark = pytest.mark.skipif(MACHINE not in seccomp.ARCHES, reason=f"the gate has no system-call numbers for {MACHINE}")


@pytest.fixture(scope="module")
def assignment():
    """The hostile fixtures' assignment, with time and room for the survey's line."""
    hostile = load_assignment(FIXTURES / "assignments" / "hostile.toml")
    return dataclasses.replace(hostile, limits=dataclasses.replace(hostile.limits, import_seconds=60, output_kib=256))


def _graded(assignment, tool_name):
    """`assignment` under `tool_name`; in the host's view (landlock, none) as root without the uid switch (the interpreter under /root is
    not readable by others)."""
    if tool_name != "none" and confine.choose(tool_name).name != tool_name:
        pytest.skip(f"{tool_name} is not available on this host: {confine.choose(tool_name).detail}")
    return dataclasses.replace(assignment, tool=tool_name, drop_user=tool_name in confine.OWN_ROOT and assignment.drop_user)


def _line(result, prefix):
    line = next((line for line in result.output["stdout"].splitlines() if line.startswith(prefix)), None)
    assert line, f"the fixture printed nothing: {result.reason}\n{result.output['stderr'][-1500:]}"
    return json.loads(line[len(prefix):])


def _syscall(name, *args):
    libc = ctypes.CDLL(None, use_errno=True)
    libc.syscall.restype = ctypes.c_long
    number = ADD_KEY[MACHINE] if name == "add_key" else seccomp.GATE_CALLS[name][list(seccomp.ARCHES).index(MACHINE)]
    result = libc.syscall(ctypes.c_long(number), *(ctypes.c_char_p(a) if isinstance(a, bytes) else ctypes.c_long(a) for a in args))
    return result, ctypes.get_errno()


def _as_uid(uid, *call):
    """(result, errno) of _syscall(*call) made by a child switched to `uid`, as a later worker of that uid would be."""
    read_end, write_end = os.pipe()
    child = os.fork()
    if child == 0:
        try:
            os.setgroups([])
            os.setresgid(uid, uid, uid)
            os.setresuid(uid, uid, uid)
            os.write(write_end, json.dumps(_syscall(*call)).encode())
        finally:
            os._exit(0)
    os.close(write_end)
    os.waitpid(child, 0)
    with os.fdopen(read_end) as pipe:
        return tuple(json.loads(pipe.read()))


@pytest.mark.parametrize("tool_name", TOOLS)
def test_a_survey_from_inside_the_worker_finds_every_call_off_the_list_refused(tool_name, assignment, tmp_path):
    folder = tmp_path / "syscalls"
    shutil.copytree(HOSTILE / "syscalls", folder)
    allowed = seccomp.allowed_numbers(MACHINE)
    numbers = {name: number for number, name in allowed.items() if name in ("socket", "socketpair", "clone", "ioctl", "getpid")}
    (folder / "hints.json").write_text(json.dumps({"allowed": sorted(allowed), "numbers": numbers, "highest": HIGHEST, "machine": MACHINE,
                                                   "unfilterable": sorted(seccomp.UNFILTERABLE[MACHINE]), "seconds": 30}))
    result = grade(folder, _graded(assignment, tool_name))
    report = _line(result, "SURVEY ")
    assert report["escaped"] == [], report["escaped"]
    sockets, namespaces = 63 * 4 * 2, 14
    assert report["tried"] >= HIGHEST + 1 - len(allowed) - len(seccomp.UNFILTERABLE[MACHINE]) + sockets + namespaces, report["tried"]
    assert report["controls"] == {"getpid": True, "unix socket": True}, "a call on the list must still work"
    assert result.verdict == PASSED and "system calls: an allowlist of" in result.protections["capabilities"], result.protections
    assert "capabilities" not in result.sandbox["missing"], result.sandbox


@pytest.mark.parametrize("tool_name", ["bubblewrap", "unshare"])
def test_no_key_reaches_a_worker_or_outlives_one(tool_name, assignment, tmp_path):
    """The gate's own session key is out of reach, and what a worker leaves is not there for the next, two gradings in a row."""
    if os.getuid() != 0:
        pytest.skip("the worker's uid of its own, whose keyrings are at stake, exists only when the gate runs as root")
    graded = _graded(assignment, tool_name)
    token = uuid.uuid4().hex[:12]
    secret = f"course-secret-{token}".encode()
    gate_key, error = _syscall("add_key", b"user", f"gate-course-{token}".encode(), secret, len(secret), KEY_SPEC_SESSION_KEYRING)
    assert gate_key > 0, os.strerror(error)
    folder = tmp_path / "keys"
    shutil.copytree(HOSTILE / "keys", folder)
    left = f"gate-left-{token}"
    (folder / "hints.json").write_text(json.dumps({"gate_key": f"gate-course-{token}", "left": left, "add_key": ADD_KEY[MACHINE],
                                                   "keyctl": seccomp.GATE_CALLS["keyctl"][list(seccomp.ARCHES).index(MACHINE)]}))
    try:
        reports = [_line(grade(folder, graded), "KEYS ") for _ in range(2)]
    finally:
        _syscall("keyctl", KEYCTL_INVALIDATE, gate_key)
    for report in reports:
        assert set(report["gate_key"].values()) == {"ENOSYS"}, report["gate_key"]
        assert set(report["left_before"].values()) == {"ENOSYS"}, report["left_before"]
        assert set(report["added"].values()) == {"ENOSYS"}, report["added"]
    uid = sandbox.UID_BASE + os.getpid()
    for keyring in (seccomp.KEY_SPEC_USER_KEYRING, seccomp.KEY_SPEC_USER_SESSION_KEYRING):
        assert _as_uid(uid, "keyctl", KEYCTL_SEARCH, keyring, b"user", left.encode(), 0) == (-1, errno.ENOKEY)


def test_kill_uid_empties_the_uids_keyrings():
    """Keys outlive every process of their uid: the cleanup that kills the worker's uid empties its user and user-session keyrings."""
    if os.getuid() != 0:
        pytest.skip("switching to another uid needs root")
    uid = sandbox.UID_BASE + 998_000 + os.getpid() % 1000
    description = f"left-{uuid.uuid4().hex[:12]}".encode()
    for keyring in (seccomp.KEY_SPEC_USER_KEYRING, seccomp.KEY_SPEC_USER_SESSION_KEYRING):
        assert _as_uid(uid, "add_key", b"user", description, b"an earlier student's source", 27, keyring)[0] > 0
    sandbox.kill_uid(uid)
    for keyring in (seccomp.KEY_SPEC_USER_KEYRING, seccomp.KEY_SPEC_USER_SESSION_KEYRING):
        assert _as_uid(uid, "keyctl", KEYCTL_SEARCH, keyring, b"user", description, 0) == (-1, errno.ENOKEY)


@pytest.mark.parametrize("tool_name", TOOLS)
def test_honest_code_keeps_every_ordinary_call(tool_name, assignment):
    """Threads, files, mmap, locks, sqlite, clocks, timers, signals, randomness, a subprocess, polling, Unix sockets, torch's threads."""
    roomy = dataclasses.replace(assignment, limits=dataclasses.replace(assignment.limits, memory_mib=4096, call_seconds=30))
    result = grade(FIXTURES / "seccomp" / "ordinary.py", _graded(roomy, tool_name))
    report = _line(result, "ORDINARY ")
    assert report["failed"] == [], report["failed"]
    assert len(report["ran"]) == 12 and result.verdict == PASSED, (report["ran"], result.reason)


def test_the_docs_list_the_allowlist_as_the_code_has_it():
    """docs/gate.md's table of the allowlist holds every entry of seccomp.ALLOWED, with its numbers and reason, and nothing else."""
    text = (Path(__file__).resolve().parent.parent / "docs" / "gate.md").read_text()
    table = text.split("| call | x86_64 | aarch64 | why the worker needs it |\n|---|---|---|---|\n", 1)[1].split("\n\n", 1)[0]
    expected = [f"| `{name}` | {x if x is not None else '—'} | {a if a is not None else '—'} | {why} |"
                for name, (x, a, why) in seccomp.ALLOWED.items()]
    assert table.splitlines() == expected
