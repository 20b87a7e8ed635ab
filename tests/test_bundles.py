"""The bundles a course uploads (invariants.bundles), each run as its platform runs it, not read.

Built once per session with `invariants-bundle` from tests/fixtures/assignments/bundle.toml (six invariants, two of them
hidden until the due date; secret = "required", so a grade proves the secret reached the gate), then run in podman (runc,
no network, Docker's default seccomp profile and capabilities, as Gradescope, PrairieLearn and Actions' container jobs
run Docker) on the Debian 12 root file system of tests/test_gate_container.py (cached in $TI_ROOTFS):

- Gradescope: the zip unpacked into /autograder/source, setup.sh run as root, then run_autograder per submission;
- PrairieLearn: the image built from the bundle's Dockerfile (BASE: the root file system imported as an image), and one
  container per job with /grade/student and the question's tests/ at /grade/tests, started with info.json's entry point;
- GitHub: the `run:` steps of the students' workflow and of the staff's grade and summary jobs, in order, with their
  `if: always()`, in a workspace laid out as a checkout (the `uses:` steps' work done by the test: the collect job and
  artifact transfer need GitHub).

The container has no network: pip installs from a folder of wheels downloaded here once (PIP_NO_INDEX, PIP_FIND_LINKS,
which setup.sh, the Dockerfile and the workflows pass through unchanged), numpy only (the bundles are built --no-torch,
and the assignment's backend is numpy). Each submission: honest (full marks), buggy (loses the LayerNorm laws' 6 of 9
points), hostile (the probe, told where the bundle keeps the secret and the assignment: finds nothing) and malformed
(a syntax error: a clear message, no score). Without podman these skip, saying why; TI_REQUIRE_CONTAINER=1 fails them.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import zipfile
from pathlib import Path

import pytest
import test_gate_container as container  # the root file system, Docker's profile and the probe (tests/test_gate_container.py)
import yaml

from invariants.bundles import cli
from invariants.bundles.course import SECRET_FILE
from invariants.bundles.prairielearn import to_prairielearn
from invariants.gate.config import load_assignment

ROOT = Path(__file__).resolve().parent.parent
ASSIGNMENT = ROOT / "tests" / "fixtures" / "assignments" / "bundle.toml"
HIDDEN = ("softmax.softmax_rows_sum_to_one", "softmax.softmax_agrees_with_reference")
LAYER_NORM = ("norms.layer_norm_known_values", "norms.layer_norm_row_statistics", "norms.layer_norm_agrees_with_reference")
SECRET = "bundle-tests: " + "5e" * 16
RUN_SECONDS = 900  # one container's whole run (setup and four gradings take about a minute on a loaded 2-core machine)
SHARDS = 2
GRADER_IMAGE = f"localhost/ti-bundle-grader:{os.getpid()}"  # this process's (pytest-xdist workers build their own)

# Gradescope's results.json (gradescope-autograders.readthedocs.io, Autograder Specifications) and PrairieLearn's (docs, External grading)
GRADESCOPE_TOP = {"score", "max_score", "execution_time", "output", "output_format", "test_output_format", "test_name_format", "visibility",
                  "stdout_visibility", "extra_data", "tests", "leaderboard"}
GRADESCOPE_TEST = {"score", "max_score", "status", "name", "name_format", "number", "output", "output_format", "tags", "visibility", "extra_data"}
GRADESCOPE_VISIBILITY = {"hidden", "after_due_date", "after_published", "visible"}
GRADESCOPE_FORMATS = {"text", "html", "simple_format", "md", "ansi"}
PRAIRIELEARN_TOP = {"gradable", "score", "message", "output", "images", "tests", "format_errors"}
PRAIRIELEARN_TEST = {"name", "description", "points", "max_points", "message", "output", "images"}


# -- building -------------------------------------------------------------------------------------------


@pytest.fixture(scope="session")
def built(tmp_path_factory):
    """The three bundles, built by the CLI: {platform: path}, and the secret file they were built from."""
    base = tmp_path_factory.mktemp("bundles")
    secret = base / "course.secret"
    secret.write_text(SECRET + "\n")
    out = base / "out"
    assert cli.main(["gradescope", "-a", str(ASSIGNMENT), "--secret-file", str(secret), "-o", str(out), "--no-torch"]) == 0
    zipped = out / "bundle-gradescope.zip"
    with zipfile.ZipFile(zipped) as archive:
        wheel = base / next(n for n in archive.namelist() if n.endswith(".whl"))
        wheel.write_bytes(archive.read(wheel.name))
    common = ["-a", str(ASSIGNMENT), "-o", str(out), "--no-torch", "--wheel", str(wheel)]
    assert cli.main(["prairielearn", *common, "--secret-file", str(secret), "--image", GRADER_IMAGE]) == 0
    assert cli.main(["github", *common, "--shards", str(SHARDS)]) == 0
    return {"gradescope": zipped, "prairielearn": out / "prairielearn", "github": out / "github", "secret": secret, "wheel": wheel}


def test_the_gradescope_zip_holds_the_files_at_its_root_with_their_modes(built):
    with zipfile.ZipFile(built["gradescope"]) as archive:
        modes = {info.filename: (info.external_attr >> 16) & 0o777 for info in archive.infolist()}
        assert archive.read(SECRET_FILE).decode().strip() == SECRET
        pins = archive.read("constraints.txt").decode()
    assert set(modes) == {"setup.sh", "run_autograder", "constraints.txt", "bundle.toml", SECRET_FILE, built["wheel"].name}, modes
    assert modes["setup.sh"] == modes["run_autograder"] == 0o755 and modes[SECRET_FILE] == 0o600
    assert re.search(r"^numpy==\d", pins, re.M) and re.search(r"^hypothesis==\d", pins, re.M) and "torch" not in pins


def test_the_prairielearn_image_carries_nothing_of_the_course(built):
    """The image may be public: the secret and the assignment come with each job, from the question's tests/ folder."""
    recipe, question = built["prairielearn"] / "image", built["prairielearn"] / "question"
    assert sorted(p.name for p in recipe.iterdir()) == sorted(["Dockerfile", "constraints.txt", built["wheel"].name])
    assert sorted(p.name for p in (question / "tests").iterdir()) == ["bundle.toml", SECRET_FILE]
    assert (question / "tests" / SECRET_FILE).stat().st_mode & 0o077 == 0
    info = json.loads((question / "info.json").read_text())
    options = info["externalGradingOptions"]
    assert info["gradingMethod"] == "External" and options["image"] == GRADER_IMAGE and 0 < options["timeout"] <= 600
    assert options["entrypoint"][-2:] == ["--secret-file", f"/grade/tests/{SECRET_FILE}"]


def test_the_github_workflows_are_valid_and_the_students_get_no_secret_nor_hidden_name(built):
    student, staff = built["github"] / "student", built["github"] / "staff"
    for workflow in (student / ".github/workflows/invariants-gate.yml", staff / ".github/workflows/grade-class.yml"):
        parsed = yaml.safe_load(workflow.read_text())
        assert parsed["jobs"] and all("runs-on" in job and job["steps"] for job in parsed["jobs"].values()), workflow
        assert all(("run" in step) != ("uses" in step) for job in parsed["jobs"].values() for step in job["steps"]), workflow
    staff_jobs = yaml.safe_load((staff / ".github/workflows/grade-class.yml").read_text())["jobs"]
    assert staff_jobs["grade"]["strategy"]["matrix"]["shard"] == list(range(1, SHARDS + 1))
    files = [p for p in student.rglob("*") if p.is_file()]
    assert not any(SECRET in p.read_bytes().decode("latin-1") for p in files)
    preview = next(p for p in files if p.name.endswith("-preview.toml"))
    assert not any(name in preview.read_text() for name in HIDDEN)
    selected = load_assignment(preview).selected
    assert {s.name for s in selected} == {*LAYER_NORM, "softmax.cross_entropy_known_values"}
    assert all(s.visibility == "visible" for s in selected)


def test_a_bundle_without_the_secret_the_assignment_requires_is_refused_in_one_line(tmp_path, capsys):
    code = cli.main(["gradescope", "-a", str(ASSIGNMENT), "-o", str(tmp_path), "--no-torch"])
    err = capsys.readouterr().err
    assert code == 2 and err.startswith("invariants-bundle: ") and "--secret-file" in err and err.count("\n") == 1, err
    assert not list(tmp_path.iterdir())


def test_an_unknown_assignment_is_refused_in_one_line(tmp_path, capsys):
    assert cli.main(["github", "-a", "p10", "-o", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert "no shipped assignment 'p10'" in err and err.count("\n") == 1, err


def test_prairielearn_results_without_the_gates_say_so_and_cost_no_attempt():
    results = to_prairielearn(2, None)
    assert results["gradable"] is False and "exited with 2" in results["format_errors"][0]
    _check_prairielearn(results)


# -- the platforms' containers ------------------------------------------------------------------------


@pytest.fixture(scope="session")
def rootfs():
    why = container._why_no_container()
    if why and os.environ.get("TI_REQUIRE_CONTAINER") == "1":
        pytest.fail(f"TI_REQUIRE_CONTAINER=1, but {why}", pytrace=False)
    if why:
        pytest.skip(why)
    container.ROOTFS.parent.mkdir(parents=True, exist_ok=True)
    with open(container.ROOTFS.parent / "ti-rootfs.lock", "w") as lock:  # pytest-xdist workers: one builds, the others wait and reuse it
        fcntl.flock(lock, fcntl.LOCK_EX)
        return container.build_rootfs(container.ROOTFS)


@pytest.fixture(scope="session")
def wheelhouse(built, rootfs):
    """The wheels constraints.txt pins, for the container's Python (3.11): downloaded once, kept beside the root file system."""
    with zipfile.ZipFile(built["gradescope"]) as archive:
        pins = archive.read("constraints.txt")
    folder = container.ROOTFS.parent / f"ti-wheelhouse-{hashlib.sha256(pins).hexdigest()[:16]}"
    if not folder.exists():
        draft = Path(tempfile.mkdtemp(prefix=folder.name + ".", dir=folder.parent))
        (draft / "constraints.txt").write_bytes(pins)
        names = [line.split("==")[0] for line in pins.decode().splitlines() if "==" in line]
        done = subprocess.run([sys.executable, "-m", "pip", "download", "--quiet", "--only-binary=:all:", "--python-version", "3.11",
                               "--implementation", "cp", "--abi", "cp311", "--platform", "manylinux_2_28_x86_64", "--platform",
                               "manylinux2014_x86_64", "-d", str(draft), "-c", str(draft / "constraints.txt"), *names],
                              capture_output=True, text=True, timeout=600)
        assert done.returncode == 0, f"pip download: {done.stderr[-2000:]}"
        draft.chmod(0o755)
        try:
            draft.rename(folder)  # whole or not at all: a download cut short leaves no folder that looks done
        except OSError:  # another process got there first
            shutil.rmtree(draft)
    return folder


@pytest.fixture(scope="session")
def cases(tmp_path_factory):
    """The submissions, as folders of files: honest, buggy, hostile (the probe, told the bundles' paths) and malformed."""
    base = tmp_path_factory.mktemp("cases")
    shutil.copytree(ROOT / "examples" / "submissions" / "good_student", base / "honest")
    (base / "buggy").mkdir()
    shutil.copy(ROOT / "examples" / "submissions" / "unbiased_variance.py", base / "buggy" / "submission.py")
    (base / "malformed").mkdir()
    (base / "malformed" / "submission.py").write_text('BACKEND = "numpy"\n\ndef layer_norm(x, gain, bias, eps=1e-5:\n    return x\n')
    inside = ["/autograder/source/" + SECRET_FILE, "/autograder/source/bundle.toml", "/grade/tests/" + SECRET_FILE, "/grade/tests/bundle.toml",
              "/__w/staff/.github/gate/bundle.toml"]
    folder, secret, _ = container._hunt(base / "hostile", paths=inside)
    hints = json.loads((folder / "hints.json").read_text())
    hints["tokens"] = [SECRET, "bundle fixtures"]
    hints["paths"] = inside
    (folder / "hints.json").write_text(json.dumps(hints))
    secret.unlink()
    for path in [base, *base.rglob("*")]:
        os.chmod(path, 0o755 if path.is_dir() else 0o644)
    return base


def _podman(target, script, mounts, *, image=False, command=None):
    """Run in podman as the platforms run Docker: runc, no network, Docker's default seccomp profile and capabilities."""
    volumes = [arg for host, inside in mounts.items() for arg in ("-v", f"{host}:{inside}")]
    run = ["podman", "run", "--rm", "--runtime", "runc", "--cgroup-manager", "cgroupfs", "--network", "none",
           "--ulimit", f"nofile={container._limit(container.resource.RLIMIT_NOFILE, 4096)}",
           "--ulimit", f"nproc={container._limit(container.resource.RLIMIT_NPROC, 8192)}",
           "--security-opt", f"seccomp={container.DOCKER_PROFILE}", *(f"--cap-add={cap}" for cap in container.DOCKER_CAPABILITIES),
           *volumes, *([target] if image else ["--rootfs", f"{target}:O"]), *(command or ["/bin/sh", "-c", script])]
    started = time.monotonic()
    done = subprocess.run(run, capture_output=True, text=True, timeout=RUN_SECONDS)
    return done, time.monotonic() - started


def _graded(out, name, results_name="results.json"):
    folder = out / name
    report = folder / "reports" / "report.json"
    return {"exit": int((out / f"{name}.exit").read_text()), "results": json.loads((folder / results_name).read_text()),
            "report": json.loads(report.read_text()) if report.exists() else None, "log": (out / f"{name}.log").read_text()}


CASE_NAMES = ("honest", "buggy", "hostile", "malformed")


@pytest.fixture(scope="session")
def gradescope_run(built, rootfs, wheelhouse, cases, tmp_path_factory):
    """The zip unpacked in /autograder/source (modes from the zip, as unzip keeps them), setup.sh as root, run_autograder per submission."""
    out = tmp_path_factory.mktemp("gradescope-out")
    unzip = ("import sys, zipfile, os\nwith zipfile.ZipFile(sys.argv[1]) as z:\n    for i in z.infolist():\n"
             "        z.extract(i, sys.argv[2]); os.chmod(os.path.join(sys.argv[2], i.filename), (i.external_attr >> 16) & 0o777)\n")
    lines = ["mkdir -p /autograder/source", f"python3 -c '{unzip}' /bundle/{built['gradescope'].name} /autograder/source",
             "cp /autograder/source/run_autograder /autograder/run_autograder",
             "(cd /autograder/source && PIP_NO_INDEX=1 PIP_FIND_LINKS=/wheelhouse ./setup.sh) > /out/setup.log 2>&1 || exit 99",
             "stat -c '%a %n' /autograder/source /autograder/source/course-secret > /out/modes.txt"]
    for name in CASE_NAMES:  # Gradescope starts a fresh container per submission: each starts from empty folders here
        lines += ["rm -rf /autograder/submission /autograder/results /autograder/gate-reports /tmp/* && mkdir -p /autograder/submission",
                  f"cp -r /cases/{name}/. /autograder/submission/",
                  f"(cd /autograder && /autograder/run_autograder) > /out/{name}.log 2>&1; echo $? > /out/{name}.exit",
                  f"mkdir -p /out/{name} && cp /autograder/results/results.json /out/{name}/ && cp -r /autograder/gate-reports /out/{name}/reports"]
    done, seconds = _podman(rootfs, "\n".join(lines), {built["gradescope"].parent: "/bundle:ro", wheelhouse: "/wheelhouse:ro",
                                                       cases: "/cases:ro", out: "/out"})
    assert done.returncode != 99, f"setup.sh failed: {(out / 'setup.log').read_text()[-2000:]}"
    assert done.returncode == 0, f"podman: {done.stderr[-2000:]}"
    print(f"gradescope: setup and {len(CASE_NAMES)} submissions in {seconds:.0f} s")
    return {"out": out, "seconds": seconds, **{name: _graded(out, name) for name in CASE_NAMES}}


def test_gradescope_grades_honest_buggy_hostile_and_malformed(gradescope_run):
    modes = dict(reversed(line.split(" ", 1)) for line in (gradescope_run["out"] / "modes.txt").read_text().splitlines())
    assert modes["/autograder/source"] == "700" and modes["/autograder/source/course-secret"] == "600", modes
    for name in CASE_NAMES:
        _check_gradescope(gradescope_run[name]["results"])
    honest, buggy = gradescope_run["honest"], gradescope_run["buggy"]
    assert honest["exit"] == 0 and honest["results"]["score"] == honest["results"]["max_score"] == 9, honest["log"][-2000:]
    assert honest["report"]["seed"]["secret_source"] == "file" and honest["report"]["sandbox"]["tool"] == "landlock"
    assert buggy["exit"] == 1 and buggy["results"]["score"] == 3, buggy["results"]["output"]
    assert {t["name"] for t in buggy["results"]["tests"] if t["score"] < t["max_score"]} == set(LAYER_NORM)
    assert {t["name"]: t["visibility"] for t in honest["results"]["tests"] if t["name"] in HIDDEN} == dict.fromkeys(HIDDEN, "after_due_date")
    _check_probe(gradescope_run["hostile"])
    malformed = gradescope_run["malformed"]
    assert malformed["exit"] == 3 and malformed["results"]["score"] == 0
    assert malformed["results"]["tests"][0]["name"] == "The submission can be graded"
    assert "SyntaxError" in malformed["results"]["tests"][0]["output"] or "syntax" in malformed["results"]["tests"][0]["output"].lower()


def _check_probe(graded):
    """The probe found nothing of the course (the secret, the assignment, the reference) and wrote nowhere but its own folders."""
    probe = container._probe_line(graded["report"]["output"]["stdout"])
    assert probe["found"] == [], probe["found"]
    assert all(path.endswith(("/work", "/work/tmp")) for path in probe["wrote"]), probe["wrote"]
    assert probe["entries"] > 1000, "the walk saw almost nothing: is the probe broken?"
    assert graded["exit"] in (1, 3), graded["exit"]  # it lacks softmax (not gradable) or answers wrong: never a pass


def _check_gradescope(results):
    """results.json against Gradescope's documented fields and their types."""
    assert set(results) <= GRADESCOPE_TOP, set(results) - GRADESCOPE_TOP
    assert isinstance(results["score"], (int, float)) and isinstance(results.get("output", ""), str)
    assert results.get("visibility", "visible") in GRADESCOPE_VISIBILITY and results.get("stdout_visibility", "hidden") in GRADESCOPE_VISIBILITY
    assert all(results.get(key, "text") in GRADESCOPE_FORMATS for key in ("output_format", "test_output_format", "test_name_format"))
    for test in results["tests"]:
        assert set(test) <= GRADESCOPE_TEST and test.get("status", "passed") in ("passed", "failed"), test
        assert isinstance(test["name"], str) and isinstance(test.get("score", 0), (int, float)) and isinstance(test.get("max_score", 0), (int, float))
        assert test.get("visibility", "visible") in GRADESCOPE_VISIBILITY


def _check_prairielearn(results):
    """results.json against PrairieLearn's documented fields: score in [0, 1] when gradable, under 1 MB."""
    assert set(results) <= PRAIRIELEARN_TOP, set(results) - PRAIRIELEARN_TOP
    assert len(json.dumps(results)) < 1 << 20
    if results.get("gradable", True):
        assert isinstance(results["score"], float) and 0.0 <= results["score"] <= 1.0
    else:
        assert results["format_errors"] and all(isinstance(e, str) for e in results["format_errors"])
    for test in results.get("tests", []):
        assert set(test) <= PRAIRIELEARN_TEST and isinstance(test["name"], str), test
        assert isinstance(test["points"], (int, float)) and isinstance(test["max_points"], (int, float))


@pytest.fixture(scope="session")
def grader_image(built, rootfs, wheelhouse):
    """The bundle's Dockerfile built on the root file system imported as an image (no registry is reachable): its tag."""
    base = f"localhost/ti-rootfs:{(container.ROOTFS / 'key').read_text().strip()}"
    if subprocess.run(["podman", "image", "exists", base]).returncode != 0:
        tar = subprocess.Popen(["tar", "-C", str(rootfs), "-c", "."], stdout=subprocess.PIPE)
        imported = subprocess.run(["podman", "import", "-", base], stdin=tar.stdout, capture_output=True, text=True, timeout=600)
        tar.wait()
        assert imported.returncode == 0, imported.stderr[-2000:]
    tag = GRADER_IMAGE
    build = subprocess.run(["podman", "build", "--runtime", "runc", "--cgroup-manager", "cgroupfs", "--network", "none", "-q",
                            "-v", f"{wheelhouse}:/wheels:ro", "--build-arg", f"BASE={base}", "--build-arg", "PIP_NO_INDEX=1",
                            "--build-arg", "PIP_FIND_LINKS=/wheels", "-t", tag, str(built["prairielearn"] / "image")],
                           capture_output=True, text=True, timeout=RUN_SECONDS)
    assert build.returncode == 0, f"podman build: {build.stderr[-3000:]}"
    yield tag
    subprocess.run(["podman", "rmi", "-f", tag], capture_output=True)


@pytest.fixture(scope="session")
def prairielearn_run(built, grader_image, cases, tmp_path_factory):
    """One grading job per submission: a fresh container of the image, /grade laid out as PrairieLearn does, info.json's entry point."""
    out = tmp_path_factory.mktemp("prairielearn-out")
    question = built["prairielearn"] / "question"
    entry = json.loads((question / "info.json").read_text())["externalGradingOptions"]["entrypoint"]
    graded = {}
    for name in CASE_NAMES:
        job = out / f"job-{name}"
        shutil.copytree(cases / name, job / "student")
        shutil.copytree(question / "tests", job / "tests")
        (job / "data").mkdir()
        (job / "data" / "data.json").write_text("{}")
        done, seconds = _podman(grader_image, "", {job: "/grade"}, image=True, command=entry)
        (out / name).mkdir()
        (out / f"{name}.exit").write_text(str(done.returncode))
        (out / f"{name}.log").write_text(done.stdout + done.stderr)
        shutil.copy(job / "results" / "results.json", out / name / "results.json")
        if (job / "gate-reports").exists():
            shutil.copytree(job / "gate-reports", out / name / "reports")
        graded[name] = {**_graded(out, name), "seconds": seconds}
    return graded


def test_prairielearn_grades_honest_buggy_hostile_and_malformed(prairielearn_run):
    for name in CASE_NAMES:
        _check_prairielearn(prairielearn_run[name]["results"])
    honest, buggy = prairielearn_run["honest"]["results"], prairielearn_run["buggy"]["results"]
    assert honest["gradable"] is True and honest["score"] == 1.0, prairielearn_run["honest"]["log"][-2000:]
    assert buggy["gradable"] is True and buggy["score"] == pytest.approx(3 / 9), buggy["message"]
    assert {t["name"] for t in buggy["tests"] if t["points"] < t["max_points"]} == set(LAYER_NORM)
    hidden = next(t for t in honest["tests"] if t["name"].startswith("hidden invariants"))
    assert hidden["points"] == hidden["max_points"] == 2 and not any(name in json.dumps(honest) for name in HIDDEN)
    assert prairielearn_run["honest"]["report"]["seed"]["secret_source"] == "file"
    _check_probe(prairielearn_run["hostile"])
    malformed = prairielearn_run["malformed"]["results"]
    assert malformed["gradable"] is False and malformed["format_errors"][0], malformed


# -- GitHub Actions: the workflows' run steps, in order ----------------------------------------------------


def _expand(text, context):
    """A workflow expression ${{ NAME }} replaced from context; one the test does not know fails it (the workflow grew one)."""
    def value(match):
        assert match.group(1) in context, f"the workflow uses ${{{{ {match.group(1)} }}}}, which this test does not provide"
        return str(context[match.group(1)])

    return re.sub(r"\$\{\{\s*([\w.-]+)\s*\}\}", value, text)


def _job_script(workflow, job, name, context, workspace, steps_dir):
    """A shell script running the job's `run:` steps in order, as the runner does: `bash -e`, a failed step skips those after it
    but for `if: always()`; each step's exit code in /out/NAME-N.exit."""
    lines = [f"failed=0; mkdir -p /__w/_temp; cd {workspace}"]
    for number, step in enumerate(yaml.safe_load(workflow.read_text())["jobs"][job]["steps"]):
        if "run" not in step:
            continue
        script = steps_dir / f"{name}-{number}.sh"
        script.write_text(_expand(step["run"], context))
        env = " ".join(f"{key}='{_expand(value, context)}'" for key, value in step.get("env", {}).items())
        guard = "true" if step.get("if") == "always()" else '[ "$failed" = 0 ]'
        lines.append(f"if {guard}; then env {env} bash -e /steps/{script.name} >> /out/{name}.log 2>&1; code=$?; "
                     f"echo $code > /out/{name}-{number}.exit; [ $code = 0 ] || failed=1; fi")
    return lines


@pytest.fixture(scope="session")
def github_run(built, rootfs, wheelhouse, cases, tmp_path_factory):
    """The students' workflow on an honest and a buggy repository, then the staff's grade job (each shard) and summary job.

    Each job runs its install step, but into the virtualenv the first one made (a runner starts empty; pip finds the
    wheels installed already): four installs of numpy cost more than a minute on a loaded 2-core machine."""
    out, steps = tmp_path_factory.mktemp("github-out"), tmp_path_factory.mktemp("github-steps")
    student = built["github"] / "student" / ".github/workflows/invariants-gate.yml"
    staff = built["github"] / "staff" / ".github/workflows/grade-class.yml"
    env = "export RUNNER_TEMP=/__w/_temp PIP_NO_INDEX=1 PIP_FIND_LINKS=/wheelhouse CI=true GITHUB_ACTIONS=true"
    lines = [env]
    for name in ("honest", "buggy"):  # a checkout of the student's repository: the starter's .github and the student's code
        workspace = f"/__w/{name}"
        lines += [f"rm -rf /__w/_temp && mkdir -p {workspace} && cp -r /bundle/student/. {workspace}/",
                  f"cp -r /cases/{name}/. {workspace}/ && export GITHUB_STEP_SUMMARY=/out/{name}-summary.md"]
        lines += _job_script(student, "preview", name, {"runner.temp": "/__w/_temp"}, workspace, steps)
    lines += ["mkdir -p /__w/staff/submissions && cp -r /bundle/staff/. /__w/staff/",
              "export GITHUB_STEP_SUMMARY=/out/staff-summary.md"]
    lines += [f"cp -r /cases/{name} /__w/staff/submissions/{name}" for name in CASE_NAMES]  # the collect job's artifact, downloaded
    for shard in range(1, SHARDS + 1):
        lines += _job_script(staff, "grade", f"grade-{shard}", {"matrix.shard": shard, "secrets.GATE_SECRET": SECRET}, "/__w/staff", steps)
    lines += ["cd /__w/staff && for k in " + " ".join(str(k) for k in range(1, SHARDS + 1)) + "; do mkdir -p shards/reports-$k && "
              "cp -r reports/shard-$k shards/reports-$k/; done"]  # the artifacts, uploaded and downloaded by pattern
    lines += _job_script(staff, "summary", "summary", {}, "/__w/staff", steps)
    lines += ["cp -r /__w/staff/summary /out/summary"]
    done, seconds = _podman(rootfs, "\n".join(lines), {built["github"]: "/bundle:ro", wheelhouse: "/wheelhouse:ro", cases: "/cases:ro",
                                                       out: "/out", steps: "/steps:ro"})
    assert done.returncode == 0, f"podman: {done.stderr[-2000:]}"
    print(f"github: two previews, {SHARDS} shards and the merge in {seconds:.0f} s")
    return out


def _step_exits(out, name):
    return [int(p.read_text()) for p in sorted(out.glob(f"{name}-*.exit"), key=lambda p: int(p.stem.rsplit("-", 1)[1]))]


def test_the_students_workflow_previews_and_shows_the_report(github_run):
    assert _step_exits(github_run, "honest") == [0, 0, 0], (github_run / "honest.log").read_text()[-2000:]
    assert _step_exits(github_run, "buggy") == [0, 1, 0], (github_run / "buggy.log").read_text()[-2000:]  # the report is shown anyway
    honest, buggy = (github_run / "honest-summary.md").read_text(), (github_run / "buggy-summary.md").read_text()
    assert "7 / 7 points" in honest and "1 / 7 points" in buggy, buggy[:500]  # the visible invariants alone: 3·2 + 1
    assert not any(name in honest + buggy for name in HIDDEN)


def test_the_staff_workflow_grades_the_class_in_shards_and_merges(github_run):
    for shard in range(1, SHARDS + 1):
        assert _step_exits(github_run, f"grade-{shard}") == [0, 0], (github_run / f"grade-{shard}.log").read_text()[-2000:]
    assert _step_exits(github_run, "summary") == [0, 0, 0], (github_run / "summary.log").read_text()[-2000:]
    rows = {row["submission"]: row for row in _csv(github_run / "summary" / "class-summary.csv")}
    assert {name: rows[name]["verdict"] for name in CASE_NAMES} == {"honest": "passed", "buggy": "failed", "hostile": rows["hostile"]["verdict"],
                                                                     "malformed": "not_gradable"}, rows
    assert rows["honest"]["score"] == "9" and rows["buggy"]["score"] == "3" and rows["hostile"]["verdict"] != "passed", rows
    assert "class summary" in (github_run / "staff-summary.md").read_text().lower()


def _csv(path):
    import csv

    with open(path, newline="") as f:
        return list(csv.DictReader(f))
