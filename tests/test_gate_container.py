"""The gate where courses grade: inside an unprivileged container, confined by the landlock tool (invariants.gate.landlock).

A container such as Gradescope's (Docker: root inside, no CAP_SYS_ADMIN, the runtime's default seccomp profile) lets
neither bubblewrap nor unshare(2) make a namespace. These tests build a Debian root file system once (mmdebstrap, from
Debian's packages, the project's dependencies from PyPI pinned by constraints.txt; cached in $TI_ROOTFS, default
/var/tmp/ti-rootfs), install the checkout into it (non-editable: reference/ then lies in the worker's site-packages),
and run `invariants-gate` there with podman (runc) under the runtime's default capabilities and seccomp profile, and
under Docker's default profile (tests/fixtures/docker, with Docker's default capabilities). They grade an honest, a
buggy and three hostile submissions and assert the verdicts; and with Landlock refused by the profile, that the shipped
assignment refuses in one line. Hosts without podman, runc or mmdebstrap skip them and say why; with TI_REQUIRE_CONTAINER=1
(.ci/run, which installs them as root) they fail instead. The root file system takes about 90 s to build (348 MB).
The tests above those run the landlock tool on this host, where the kernel has Landlock.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import resource
import shutil
import ssl
import subprocess
import uuid
from pathlib import Path

import pytest

from invariants.gate import confine
from invariants.gate.config import load_assignment
from invariants.gate.grade import grade
from invariants.gate.result import FAILED, GATE_ERROR, PASSED

ROOT = Path(__file__).resolve().parent.parent
FIXTURES = Path(__file__).parent / "fixtures"
HOSTILE = FIXTURES / "hostile"
DOCKER_PROFILE = FIXTURES / "docker" / "seccomp-default.json"  # moby/profiles' seccomp/default.json (NOTICE beside it)
DOCKER_CAPABILITIES = ("CAP_MKNOD", "CAP_NET_RAW", "CAP_AUDIT_WRITE")  # Docker's default set holds these beyond podman's
ROOTFS = Path(os.environ.get("TI_ROOTFS", "/var/tmp/ti-rootfs"))
SITE = "/opt/gate/lib/python3.11/site-packages"  # the container's virtualenv (Debian 12's python3.11)
PACKAGES = ("python3", "python3-venv")
PINNED = ("setuptools>=77", "numpy", "hypothesis", "pytest")  # the project's dependencies (and its build backend), pinned by constraints.txt
BUILD_SECONDS = 900
GRADE_SECONDS = 300  # each grading inside the container (p01 takes about 20 s on a loaded 2-core machine)


# -- the landlock tool on this host -----------------------------------------------------------------


def _landlock():
    tool = confine.choose("landlock")
    if tool.name != "landlock":
        pytest.skip(f"Landlock is not available on this host: {tool.detail}")
    return tool


def test_landlock_allows_site_packages_entries_one_by_one_around_the_project(tmp_path):
    """A non-editable install puts reference/ beside numpy: Landlock cannot mask it, so the rules allow every other entry instead."""
    site = tmp_path / "site-packages"
    for name in ("reference", "numpy_like", "transformer_invariants-0.1.dist-info"):
        (site / name).mkdir(parents=True)
        (site / name / "__init__.py").write_text(f"# {name}\n")
    (site / "numpy_like" / "core.py").write_text("# numpy\n")
    (site / "link").symlink_to(site / "reference")
    view = confine.View.for_worker(submission=tmp_path, runtime=tmp_path, scratch_bytes=1 << 20, trees=[str(site)],
                                   project=[str(site / "reference"), str(site / "transformer_invariants-0.1.dist-info")])
    read = view.landlock_rules(write=[tmp_path / "work"])["read"]
    assert str(site / "numpy_like") in read and str(site) not in read, read
    assert not any(path.startswith((str(site / "reference"), str(site / "transformer_invariants"), str(site / "link"))) for path in read)


def test_the_probe_finds_nothing_under_landlock_on_this_host(tmp_path):
    """The probe of tests/test_gate_sandbox.py under the landlock tool: nothing of the course found, nothing written outside its folders."""
    tool = _landlock()
    hostile = load_assignment(FIXTURES / "assignments" / "hostile.toml")
    paths = [str(ROOT / "invariants" / "reference" / "numpy.py"), str(ROOT / "invariants" / "gate" / "grade.py")]
    folder, secret, token = _hunt(tmp_path / "hunt", paths=paths)
    # This host's interpreter lies under a 0700 /root: a worker switched to its own uid could not import from there (the user row says so).
    graded = dataclasses.replace(hostile, tool=tool.name, secret_file=str(secret), require=("filesystem", "tmp", "pid", "network"),
                                 drop_user=_interpreter_readable_by_others(),
                                 limits=dataclasses.replace(hostile.limits, import_seconds=60, run_seconds=120))
    result = grade(folder, graded)
    report = _probe_line(result.output["stdout"])
    assert report["found"] == [], report["found"]
    assert all(path.endswith(("/work", "/work/tmp")) for path in report["wrote"]), report["wrote"]
    assert report["processes"] == [] and report["network"] == [], (report["processes"], report["network"])
    assert report["entries"] > 1000, "the walk saw almost nothing: is the probe broken?"
    assert not (Path("/tmp") / f"gate-probe-{token}").exists()
    assert result.verdict == FAILED and result.score == 0
    missing = set(result.sandbox["missing"]) - ({"user", "processes"} if not graded.drop_user else set())  # root keeps root's uid
    assert result.sandbox["tool"] == "landlock" and missing == set(), result.sandbox
    assert "NOT a root of its own" in result.protections["filesystem"] and "NO PID namespace" in result.protections["pid"]


def _interpreter_readable_by_others():
    import numpy

    return all(os.stat(p).st_mode & 0o005 == 0o005 for module in (os, numpy) for p in Path(module.__file__).parents if p != Path("/"))


def _hunt(folder, *, paths, port=9, seconds=4.0):
    """The probe (tests/fixtures/hostile/hunt) as a folder submission, told the paths to try and the secret's token."""
    shutil.copytree(HOSTILE / "hunt", folder)
    secret = folder.parent / "course.secret"
    secret.write_text("s3cret-" + uuid.uuid4().hex + "\n")
    token = uuid.uuid4().hex[:12]
    hints = {"paths": [*paths, str(secret)], "tokens": [secret.read_text().strip(), "hostile fixtures"], "port": port, "token": token,
             "seconds": seconds}
    (folder / "hints.json").write_text(json.dumps(hints))
    return folder, secret, token


def _probe_line(stdout):
    line = next((line for line in stdout.splitlines() if line.startswith("PROBE ")), None)
    assert line, f"the probe printed nothing: {stdout[-1500:]}"
    return json.loads(line[len("PROBE "):])


# -- the root file system -----------------------------------------------------------------------------


def _why_no_container():
    if os.getuid() != 0:
        return "podman with --rootfs and mmdebstrap need root here"
    missing = [name for name in ("podman", "runc", "mmdebstrap") if shutil.which(name) is None]
    if missing:
        return f"{', '.join(missing)} not installed (apt-get install podman runc mmdebstrap; .ci/run does)"
    return None


def _recipe():
    """What the root file system holds, as the key of the cached one: the Debian packages and the pinned versions from constraints.txt."""
    pins = [line for line in (ROOT / "constraints.txt").read_text().splitlines() if line.split("==")[0] in ("numpy", "hypothesis", "pytest")]
    return json.dumps({"suite": "bookworm", "packages": PACKAGES, "pip": PINNED, "pins": pins})


def build_rootfs(target):
    """Debian 12 (minbase) with python3 and a virtualenv /opt/gate holding the project's dependencies; the cached one where its key matches."""
    key = hashlib.sha256(_recipe().encode()).hexdigest()[:16]
    if (target / "key").exists() and (target / "key").read_text() == key:
        return target / "root"
    shutil.rmtree(target, ignore_errors=True)
    target.mkdir(parents=True)
    ca = os.environ.get("PIP_CERT") or os.environ.get("SSL_CERT_FILE") or ssl.get_default_verify_paths().cafile
    hooks = [f'cp {ROOT / "constraints.txt"} "$1/tmp/constraints.txt"', 'chroot "$1" python3 -m venv /opt/gate',
             'chroot "$1" env -i PATH=/usr/bin:/bin PIP_CERT=/tmp/ca.crt PIP_DISABLE_PIP_VERSION_CHECK=1 /opt/gate/bin/pip install -q '
             '--no-cache-dir -c /tmp/constraints.txt ' + " ".join(f"'{p}'" for p in PINNED), 'rm -f "$1/tmp/constraints.txt" "$1/tmp/ca.crt"']
    if ca and os.path.exists(ca):  # a proxy's certificate authority (this host's pip trusts it; the chroot's must too)
        hooks.insert(0, f'cp {ca} "$1/tmp/ca.crt"')
    command = ["mmdebstrap", "--variant=minbase", f"--include={','.join(PACKAGES)}", *(f"--customize-hook={hook}" for hook in hooks),
               "bookworm", str(target / "root")]
    done = subprocess.run(command, capture_output=True, text=True, timeout=BUILD_SECONDS)
    if done.returncode != 0:
        errors = [line for line in done.stderr.splitlines() if line.startswith(("E:", "ERROR", "W:"))]
        pytest.fail(f"building the root file system failed: {' | '.join(errors)[-3000:] or done.stderr[-3000:]}")
    (target / "key").write_text(key)
    return target / "root"


@pytest.fixture(scope="module")
def rootfs():
    why = _why_no_container()
    if why and os.environ.get("TI_REQUIRE_CONTAINER") == "1":
        pytest.fail(f"TI_REQUIRE_CONTAINER=1, but {why}", pytrace=False)
    if why:
        pytest.skip(why)
    return build_rootfs(ROOTFS)


@pytest.fixture(scope="module")
def course(tmp_path_factory):
    """The host folders the container mounts: /src (the checkout's package), /subs (the submissions), /course (assignment and secret)."""
    base = tmp_path_factory.mktemp("container")
    src = base / "src"
    src.mkdir()
    for name in ("pyproject.toml", "README.md", "LICENSE"):
        if (ROOT / name).exists():
            shutil.copy(ROOT / name, src / name)
    for package in ("invariants", "strategies", "reference"):
        shutil.copytree(ROOT / package, src / package, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    subs, course = base / "subs", base / "course"
    subs.mkdir()
    course.mkdir()
    shutil.copytree(ROOT / "examples" / "submissions" / "good_student", subs / "good_student")
    shutil.copy(ROOT / "examples" / "submissions" / "unbiased_variance.py", subs / "unbiased_variance.py")
    shutil.copy(HOSTILE / "fork_bomb.py", subs / "fork_bomb.py")
    shutil.copytree(HOSTILE / "write_outside", subs / "write_outside")
    (subs / "write_outside" / "target.txt").write_text("/tmp/escaped.txt\n")  # a folder its mode lets any uid write: Landlock must refuse
    shutil.copy(FIXTURES / "assignments" / "hostile.toml", course / "hostile.toml")
    inside = [f"{SITE}/invariants/reference/numpy.py", f"{SITE}/invariants/gate/assignments/p01.toml", f"{SITE}/invariants/gate/grade.py",
              "/course/hostile.toml", "/root/.config/invariants-gate/course-secret"]
    _, secret, _ = _hunt(subs / "hunt", paths=inside)
    secret.rename(course / "course.secret")
    hints = json.loads((subs / "hunt" / "hints.json").read_text())
    hints["paths"] = [p.replace(str(subs), "/course") for p in hints["paths"]]
    (subs / "hunt" / "hints.json").write_text(json.dumps(hints))
    for path in [base, *base.rglob("*")]:  # readable by the container's root whatever this host's umask
        os.chmod(path, 0o755 if path.is_dir() else 0o644)
    return base


CASES = {  # name: (submission, assignment, extra arguments)
    "honest": ("/subs/good_student", "p01", []),
    "buggy": ("/subs/unbiased_variance.py", "p01", []),
    "hunt": ("/subs/hunt", "/course/hostile.toml", ["--secret-file", "/course/course.secret"]),
    "fork_bomb": ("/subs/fork_bomb.py", "/course/hostile.toml", []),
    "write_outside": ("/subs/write_outside", "/course/hostile.toml", []),
}


def _script(cases):
    """The shell script the container runs: install the checkout (non-editable), then grade each case into /out/NAME, timed."""
    lines = ["cp -r /src /tmp/src",
             "/opt/gate/bin/pip install -q --no-deps --no-build-isolation --no-index /tmp/src > /out/install.log 2>&1 || exit 99",
             "grep -E '^(Cap(Eff|Bnd)|Seccomp):' /proc/self/status > /out/status.txt"]
    for name in cases:
        submission, assignment, extra = CASES[name]
        lines += [f"start=$(date +%s.%N); timeout {GRADE_SECONDS} /opt/gate/bin/invariants-gate {submission} -a {assignment} "
                  f"-o /out/{name} {' '.join(extra)} > /out/{name}.log 2>&1; echo $? > /out/{name}.exit",
                  f"echo \"$start $(date +%s.%N)\" > /out/{name}.seconds"]
    lines.append("if test -e /tmp/escaped.txt; then echo escaped > /out/escaped; fi")
    return "\n".join(lines) + "\n"


def _limit(which, ceiling):
    hard = resource.getrlimit(which)[1]
    value = ceiling if hard == resource.RLIM_INFINITY else min(hard, ceiling)
    return f"{value}:{value}"


def _in_container(rootfs, course, out, profile, cases):
    """Run the cases in a podman container (runc; the root file system as a throw-away overlay; no network) under `profile`."""
    out.mkdir()
    security = []
    if profile == "docker":
        security = ["--security-opt", f"seccomp={DOCKER_PROFILE}", *(f"--cap-add={cap}" for cap in DOCKER_CAPABILITIES)]
    elif profile == "docker-without-landlock":
        rules = json.loads(DOCKER_PROFILE.read_text())
        for rule in rules["syscalls"]:
            rule["names"] = [name for name in rule["names"] if not name.startswith("landlock_")]
        (out / "profile.json").write_text(json.dumps(rules))
        security = ["--security-opt", f"seccomp={out / 'profile.json'}"]
    command = ["podman", "run", "--rm", "--runtime", "runc", "--cgroup-manager", "cgroupfs", "--network", "none",
               "--ulimit", f"nofile={_limit(resource.RLIMIT_NOFILE, 4096)}", "--ulimit", f"nproc={_limit(resource.RLIMIT_NPROC, 8192)}",
               *security, "-v", f"{course / 'src'}:/src:ro", "-v", f"{course / 'subs'}:/subs:ro", "-v", f"{course / 'course'}:/course:ro",
               "-v", f"{out}:/out", "--rootfs", f"{rootfs}:O", "/bin/sh", "-c", _script(cases)]
    done = subprocess.run(command, capture_output=True, text=True, timeout=GRADE_SECONDS * len(cases) + 120)
    if done.returncode == 99:
        pytest.fail(f"installing the checkout in the container failed: {(out / 'install.log').read_text()[-2000:]}")
    assert done.returncode == 0, f"podman: {done.stderr[-2000:]}"
    graded = {}
    for name in cases:
        report = out / name / "report.json"
        start, end = (float(t) for t in (out / f"{name}.seconds").read_text().split())
        graded[name] = {"exit": int((out / f"{name}.exit").read_text()), "log": (out / f"{name}.log").read_text(), "seconds": end - start,
                        "report": json.loads(report.read_text()) if report.exists() else None}
    graded["status"] = (out / "status.txt").read_text()
    graded["escaped"] = (out / "escaped").exists()
    return graded


@pytest.fixture(scope="module", params=["podman", "docker"])
def graded(request, rootfs, course, tmp_path_factory):
    """Every case graded in one container under the runtime's default profile ("podman") or Docker's ("docker")."""
    return request.param, _in_container(rootfs, course, tmp_path_factory.mktemp(request.param) / "out", request.param, list(CASES))


def _report(graded, name):
    profile, results = graded
    result = results[name]
    assert result["report"] is not None, f"{profile}/{name}: exit {result['exit']}, no report: {result['log'][-2000:]}"
    return result["report"]


def test_the_container_is_unprivileged(graded):
    profile, results = graded
    fields = dict(line.split(":\t") for line in results["status"].splitlines())
    assert not int(fields["CapEff"], 16) & (1 << 21), "CAP_SYS_ADMIN: the container is privileged, so this test shows nothing"
    assert fields["Seccomp"].strip() == "2", f"no seccomp filter in the {profile} container"


def test_an_honest_submission_passes_whole_inside_the_container(graded):
    report = _report(graded, "honest")
    assert report["verdict"] == PASSED and report["score"] == report["max_score"], (report["reason"], report["protections"])
    assert report["sandbox"]["tool"] == "landlock" and report["sandbox"]["missing"] == [], report["sandbox"]
    assert report["protections"]["user"].startswith("an unprivileged uid"), report["protections"]["user"]
    assert report["protections"]["network"].startswith("off: no socket family but AF_UNIX"), report["protections"]["network"]


def test_a_buggy_submission_fails_inside_the_container(graded):
    report = _report(graded, "buggy")
    assert report["verdict"] == FAILED and 0 < report["score"] < report["max_score"], report["reason"]
    failed = {i["name"] for i in report["invariants"] if i["status"] == "failed"}
    assert any(name.startswith("block.") for name in failed), failed  # the block's LayerNorm divides by n - 1
    assert report["sandbox"]["tool"] == "landlock"


def test_the_probe_finds_nothing_of_the_course_inside_the_container(graded):
    report = _report(graded, "hunt")
    probe = _probe_line(report["output"]["stdout"])
    assert probe["found"] == [], probe["found"]
    assert all(path.endswith(("/work", "/work/tmp")) for path in probe["wrote"]), probe["wrote"]
    assert probe["processes"] == [] and probe["network"] == [], (probe["processes"], probe["network"])
    assert probe["entries"] > 1000, "the walk saw almost nothing: is the probe broken?"
    assert report["verdict"] == FAILED and report["score"] == 0


def test_a_fork_bomb_is_stopped_inside_the_container(graded):
    report = _report(graded, "fork_bomb")
    stderr = report["output"]["stderr"]
    forked = max((int(word) for line in stderr.splitlines() if line.startswith("forked ") for word in line.split()[1:2]), default=-1)
    assert report["verdict"] == FAILED and 0 <= forked < 32, stderr[-500:]  # hostile.toml's [limits] processes


def test_writes_outside_its_folders_are_refused_inside_the_container(graded):
    profile, results = graded
    report = _report(graded, "write_outside")
    assert "refused /tmp/escaped.txt: Permission denied" in report["output"]["stdout"], report["output"]["stdout"][-500:]
    assert not results["escaped"], f"the worker wrote /tmp/escaped.txt in the {profile} container"


def test_without_landlock_the_container_refuses_in_one_line(rootfs, course, tmp_path):
    """Docker's profile without the three Landlock calls: no tool confines, and p01 refuses in one line that names the way out."""
    results = _in_container(rootfs, course, tmp_path / "out", "docker-without-landlock", ["honest"])
    report = results["honest"]["report"]
    assert report["verdict"] == GATE_ERROR and results["honest"]["exit"] == 4, report["reason"]
    assert report["reason"].startswith("refused to grade: the assignment requires filesystem, tmp, pid"), report["reason"]
    assert "Landlock" in report["reason"] and "[sandbox] require" in report["reason"] and "\n" not in report["reason"]
    assert report["output"]["stdout"] == ""
