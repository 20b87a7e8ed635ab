"""A grade never rests on derandomized inputs: without a given course secret the gate makes one, keeps it where no worker
can see it, and seeds every submission from it; a table of answers recorded on a student's own machine earns nothing."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import shutil
import stat
import tempfile
from pathlib import Path

import numpy as np
import pytest

from invariants.gate import confine
from invariants.gate import grade as grading
from invariants.gate.batch import secret_notice
from invariants.gate.cli import main
from invariants.gate.config import load_assignment
from invariants.gate.grade import grade
from invariants.gate.job import derive_seed
from invariants.gate.result import EXIT_CODES, GATE_ERROR, PASSED
from invariants.gate.secret import HOME_ENV, KEPT_FILE, CourseSecret

FIXTURES = Path(__file__).parent / "fixtures"
HOSTILE = FIXTURES / "hostile"
CHEAP = FIXTURES / "assignments" / "hostile.toml"  # two layer_norm invariants, five examples each
ROOT = Path(__file__).resolve().parent.parent
UNTRIED = "GATE_SECRET_NEVER_SET_BY_THE_TESTS"


@pytest.fixture
def course_home(tmp_path, monkeypatch):
    """The folder where the gate keeps its course secret, empty: the course's first run."""
    home = tmp_path / "course-config" / "invariants-gate"
    monkeypatch.setenv(HOME_ENV, str(home))
    return home


def _report(out):
    return json.loads((out / "report.json").read_text())


def test_a_shipped_assignment_without_a_secret_is_graded_from_one_the_gate_makes_and_keeps(course_home, tmp_path, capsys):
    """P01 with no GATE_SECRET: today derandomized and silent; here seeded from a secret made once, kept 0600, named by fingerprint."""
    submission = ROOT / "examples" / "submissions" / "good_student"
    runs = []
    for n in (1, 2):
        out = tmp_path / f"run-{n}"
        assert main([str(submission), "-a", "p01", "-o", str(out), "-q", "--max-examples", "3"]) == 0
        runs.append((_report(out), capsys.readouterr().err))
    kept = course_home / KEPT_FILE
    assert stat.S_IMODE(kept.stat().st_mode) == 0o600 and stat.S_IMODE(course_home.stat().st_mode) == 0o700
    secret = CourseSecret(kept.read_text().strip(), "kept")
    assert len(secret.value) == 64, "32 bytes of os.urandom, in hex"
    (first, made), (second, again) = runs
    assert made.count("made a course secret") == 1 and str(kept) in made and secret.fingerprint in made
    assert "made a course secret" not in again, "made once, then kept"
    for report in (first, second):
        assert report["seed"] == {"mode": "secret", "value": derive_seed(secret.value, report["submission"]["sha256"]),
                                  "secret_fingerprint": secret.fingerprint, "secret_source": "kept"}
        assert secret.value not in json.dumps(report)
    assert secret.fingerprint in (tmp_path / "run-1" / "summary.md").read_text()


def test_an_assignment_may_refuse_to_grade_without_a_given_secret(course_home, tmp_path, monkeypatch, capsys):
    strict = tmp_path / "strict.toml"
    strict.write_text(CHEAP.read_text() + f'\n[seed]\nsecret_env = "{UNTRIED}"\nsecret = "required"\n')
    out = tmp_path / "out"
    assert main([str(HOSTILE / "good.py"), "-a", str(strict), "-o", str(out), "-q"]) == EXIT_CODES[GATE_ERROR]
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and f"${UNTRIED} is not set" in err and "--secret-env" in err
    assert not out.exists() and not course_home.exists(), "nothing graded, nothing made"
    monkeypatch.setenv(UNTRIED, "the course's own")
    assert main([str(HOSTILE / "good.py"), "-a", str(strict), "-o", str(out), "-q"]) == 0
    seed = _report(out)["seed"]
    assert seed["secret_source"] == f"env:{UNTRIED}" and seed["secret_fingerprint"] == CourseSecret("the course's own", "given").fingerprint


def test_a_students_preview_needs_no_secret_and_draws_a_fresh_seed(course_home, tmp_path):
    seeds = []
    for n in (1, 2):
        out = tmp_path / f"preview-{n}"
        assert main([str(HOSTILE / "good.py"), "-a", str(CHEAP), "-o", str(out), "-q", "--visible-only"]) == 0
        seeds.append(_report(out)["seed"])
        assert "drawn for this preview" in (out / "summary.md").read_text()
    assert [s["mode"] for s in seeds] == ["random", "random"] and seeds[0]["value"] != seeds[1]["value"]
    assert not course_home.exists(), "a preview makes no secret on the student's machine"


def test_a_fixed_seed_reproduces_a_report(course_home, tmp_path):
    assignment = load_assignment(CHEAP)
    graded = grade(HOSTILE / "good.py", assignment)
    again = grade(HOSTILE / "good.py", assignment, seed=graded.seed["value"])
    assert again.seed == {"mode": "fixed", "value": graded.seed["value"]}
    assert [i.examples for i in again.invariants] == [i.examples for i in graded.invariants]


# -- no worker sees it -----------------------------------------------------------------------------

PROBE = '''"""A correct layer_norm that first looks for the course secret the gate keeps (its path written in by the test)."""
import os

import numpy as np

BACKEND = "numpy"
for path in ({kept!r}, {folder!r}):
    try:
        print("FOUND", path, os.listdir(path) if os.path.isdir(path) else open(path).read(), flush=True)
    except OSError as exc:
        print("REFUSED", path, type(exc).__name__, flush=True)


def layer_norm(x, gain, bias, eps):
    centred = x - x.mean(axis=-1, keepdims=True)
    return centred / np.sqrt((centred**2).mean(axis=-1, keepdims=True) + eps) * gain + bias
'''


@pytest.mark.parametrize("tool_name", confine.TOOLS)
def test_no_worker_sees_the_kept_secret(tool_name, tmp_path, monkeypatch):
    """Under either sandbox it is not there; unconfined (as root, the worker on its own uid) its 0700 folder refuses."""
    monkeypatch.delenv(confine.ENV, raising=False)
    tool = confine.choose(tool_name)
    if tool.name != tool_name:
        pytest.skip(f"{tool_name} is not available here: {tool.detail}")
    if tool_name == "none" and os.getuid() != 0:
        pytest.skip("unconfined, only a worker switched to a uid of its own is refused the gate's files")
    base = Path(tempfile.mkdtemp(prefix="gate-secret-"))  # under /tmp, open to all: only the kept folder's own mode protects it
    try:
        base.chmod(0o755)
        home = base / "invariants-gate"
        monkeypatch.setenv(HOME_ENV, str(home))
        kept = home / KEPT_FILE
        probe = tmp_path / "probe.py"
        probe.write_text(PROBE.format(kept=str(kept), folder=str(home)))
        hidden, start = [], grading.Session.__init__

        def recording(self, *args, **kwargs):
            hidden.extend(kwargs["hidden"])
            start(self, *args, **kwargs)

        monkeypatch.setattr(grading.Session, "__init__", recording)
        result = grade(probe, dataclasses.replace(load_assignment(CHEAP), tool=tool_name))
        assert result.verdict == PASSED and result.seed["secret_source"] == "kept" and kept.exists()
        assert str(kept) in hidden, "masked wherever a mounted tree would hold it"
        printed = result.output["stdout"]
        assert printed.count("REFUSED") == 2 and "FOUND" not in printed, printed
        assert kept.read_text().strip() not in json.dumps(result.as_dict())
    finally:
        shutil.rmtree(base)


# -- a table of answers recorded at home --------------------------------------------------------------

TABLE = '''"""layer_norm as a table of the answers the gate's worker gave to the inputs it was sent, recorded by the test."""
import hashlib

import numpy as np

BACKEND = "numpy"
TABLE = {table!r}


def _key(*args):
    digest = hashlib.sha256()
    for arg in args:
        arg = np.asarray(arg, dtype=np.float64)
        digest.update(repr(arg.shape).encode() + arg.tobytes())
    return digest.hexdigest()


def layer_norm(x, gain, bias, eps):
    shape, values = TABLE.get(_key(x, gain, bias, eps), (np.shape(x), None))
    return np.zeros(shape) if values is None else np.array(values, dtype=np.float64).reshape(shape)
'''


def _key(args):
    digest = hashlib.sha256()
    for arg in args:
        arg = np.asarray(arg, dtype=np.float64)
        digest.update(repr(arg.shape).encode() + arg.tobytes())
    return digest.hexdigest()


def _recorded_table(assignment, monkeypatch, tmp_path, **seeding):
    """A table submission of every layer_norm call the gate makes grading the honest good.py (with `seeding`), and its answers."""
    table, call = {}, grading.Session.call

    def recording(self, name, args):
        answer = call(self, name, args)
        table[_key(args)] = (list(np.shape(answer)), np.asarray(answer, dtype=np.float64).ravel().tolist())
        return answer

    with monkeypatch.context() as patch:
        patch.setattr(grading.Session, "call", recording)
        assert grade(HOSTILE / "good.py", assignment, **seeding).verdict == PASSED
    path = tmp_path / f"table_{len(list(tmp_path.glob('table_*')))}.py"
    path.write_text(TABLE.format(table=table))
    return path


def test_a_table_of_answers_recorded_at_home_earns_nothing_from_the_course(tmp_path, monkeypatch):
    """Recorded with the gate's defaults on the student's machine, replayed under the course's: the issue's 53/53, here 0."""
    assignment = load_assignment(CHEAP)
    monkeypatch.setenv(HOME_ENV, str(tmp_path / "students-machine"))
    table = _recorded_table(assignment, monkeypatch, tmp_path)
    monkeypatch.setenv(HOME_ENV, str(tmp_path / "course-machine"))
    replayed = grade(table, assignment)
    assert replayed.seed["mode"] == "secret" and replayed.verdict != PASSED and replayed.score == 0, replayed.reason
    known = _recorded_table(assignment, monkeypatch, tmp_path, seed=7)  # the control: the table works where the inputs are known
    assert grade(known, assignment, seed=7).verdict == PASSED


# -- shards --------------------------------------------------------------------------------------------


def test_a_merge_notes_shards_seeded_from_different_secrets(tmp_path, monkeypatch, capsys):
    cohort = tmp_path / "cohort"
    cohort.mkdir()
    for name in ("good.py", "wrong_shape.py"):
        shutil.copy(HOSTILE / name, cohort / name)
    for k in (1, 2):  # two CI machines, neither given the course secret: each makes its own
        monkeypatch.setenv(HOME_ENV, str(tmp_path / f"machine-{k}"))
        assert main(["--batch", str(cohort), "-a", str(CHEAP), "-o", str(tmp_path / "shards" / f"{k}"), "--shard", f"{k}/2", "-q"]) == 0
    capsys.readouterr()
    assert main(["--merge", str(tmp_path / "shards"), "-o", str(tmp_path / "merged")]) == 0
    err = capsys.readouterr().err
    prints = [CourseSecret((tmp_path / f"machine-{k}" / KEPT_FILE).read_text().strip(), "kept").fingerprint for k in (1, 2)]
    assert "2 different sources" in err and all(p in err for p in prints) and "--secret-env" in err
    assert "2 different sources" in (tmp_path / "merged" / "class-summary.md").read_text()
    same = [{"verdict": "passed", "secret": "secret abc"}, {"verdict": "failed", "secret": "secret abc"}]
    assert secret_notice(same) is None
