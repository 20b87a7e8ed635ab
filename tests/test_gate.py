"""The gate's own machinery: the wire format, assignment files, seeds, reports, the CLI and batches."""

from __future__ import annotations

import csv
import json
import os
import subprocess
import sys
import xml.etree.ElementTree as ET
import zipfile
from pathlib import Path

import numpy as np
import pytest

from invariants.gate import wire
from invariants.gate.cli import main
from invariants.gate.config import ConfigError, load_assignment, shipped_assignments
from invariants.gate.grade import grade
from invariants.gate.job import derive_seed
from invariants.gate.result import EXIT_CODES, FAILED, GATE_ERROR, PASSED, STATUSES, without_volatile
from invariants.gate.scan import scan_source
from invariants.gate.text import clean_output

FIXTURES = Path(__file__).parent / "fixtures"
HOSTILE = FIXTURES / "hostile"
ASSIGNMENT = FIXTURES / "assignments" / "hostile.toml"
ROOT = Path(__file__).resolve().parent.parent


# -- the wire ------------------------------------------------------------------------------------


def roundtrip(value):
    read, write = os.pipe()
    try:
        tree, buffers = wire.encode(value)
        wire.send(write, {"op": "x", "value": tree}, buffers)
        header, got = wire.receive(read, max_bytes=1 << 20)
        return wire.decode(header["value"], got)
    finally:
        os.close(read)
        os.close(write)


def test_wire_round_trips_nested_values():
    value = {"blocks": [{"W": np.arange(6.0).reshape(2, 3)}], "ids": np.array([[1, 2]], dtype=np.int64),
             "mask": np.array([True, False]), "half": np.ones(3, dtype=np.float16), "n": 3, "eps": 1e-5,
             "nan": float("nan"), "text": "ab", "pair": (np.zeros(0), None)}
    got = roundtrip(value)
    assert got["blocks"][0]["W"].dtype == np.float64 and np.array_equal(got["blocks"][0]["W"], value["blocks"][0]["W"])
    assert got["ids"].dtype == np.int64 and got["mask"].dtype == bool and got["half"].dtype == np.float16
    assert got["n"] == 3 and got["eps"] == 1e-5 and np.isnan(got["nan"]) and got["text"] == "ab"
    assert isinstance(got["pair"], tuple) and got["pair"][0].shape == (0,) and got["pair"][1] is None
    got["blocks"][0]["W"][0, 0] = 7  # fresh, writable arrays


@pytest.mark.parametrize("value, message", [
    (np.array([1 + 2j]), "dtype complex128 cannot cross"),
    (np.array(["a"], dtype=object), "dtype object cannot cross"),
    ({1: 2}, "key that is not a string"),
    (object(), "builtins.object cannot cross"),
])
def test_wire_refuses_what_is_not_plain_data(value, message):
    with pytest.raises(wire.WireError, match=message):
        wire.encode(value)


@pytest.mark.parametrize("tree, buffers, message", [
    ({"__array__": 0, "dtype": "float64", "shape": [3]}, [bytearray(8)], "needs 24 bytes, got 8"),
    ({"__array__": 0, "dtype": "object", "shape": [1]}, [bytearray(8)], "dtype 'object'"),
    ({"__array__": 1, "dtype": "float64", "shape": [1]}, [bytearray(8)], "points at no buffer"),
    ({"__array__": 0, "dtype": "float64", "shape": [-1]}, [bytearray(8)], "non-negative ints"),
    ({"__pickle__": "x"}, [], "unknown tag"),
    ([1, 2], [], "untagged list"),
])
def test_wire_decoding_validates_a_hostile_sender(tree, buffers, message):
    with pytest.raises(wire.WireError, match=message):
        wire.decode(tree, buffers)


def test_wire_refuses_oversized_answers():
    read, write = os.pipe()
    try:
        tree, buffers = wire.encode(np.zeros(1000))
        wire.send(write, {"op": "answer", "value": tree}, buffers)
        with pytest.raises(wire.WireError, match="the limit is 100"):
            wire.receive(read, max_bytes=100)
    finally:
        os.close(read)
        os.close(write)


# -- assignment files ---------------------------------------------------------------------------


def write_config(tmp_path, text):
    path = tmp_path / "assignment.toml"
    path.write_text(text)
    return path


BAD_CONFIGS = [
    ('[[invariants]]\nselect = "norms.layer_norm_knwon_values"\n', "matches no registered invariant; did you mean norms.layer_norm_known_values"),
    ('[[invariants]]\nselect = "nrms.*"\n', "matches no registered invariant"),
    ('[assignment]\nbackend = "jax"\n[[invariants]]\nselect = "norms.*"\n', "backend = 'jax' must be one of numpy, torch, any"),
    ('[limits]\ncall_secnds = 3\n[[invariants]]\nselect = "norms.*"\n', "is not a setting of [limits]"),
    ('[limits]\ncall_seconds = -1\n[[invariants]]\nselect = "norms.*"\n', "must be a positive number"),
    ('[[invariants]]\nselect = "norms.*"\npoints = -2\n', "points = -2 must be a number >= 0"),
    ('[[invariants]]\nselect = "norms.*"\nvisibility = "secret"\n', "visibility = 'secret' must be one of visible"),
    ('[[invariants]]\nselect = "attention.causal_gradient"\n', "cannot be graded by the gate"),
    ('[grading]\n[[invariants]]\nselect = "norms.*"\n', "is not a section of an assignment"),
    ('[assignment]\nname = "x"\n', "no [[invariants]] entries"),
    ('[forbidden]\napis = ["MultiheadAttention"]\n[[invariants]]\nselect = "norms.*"\n', "must be a list of dotted names"),
    ('[[invariants]\n', "not valid TOML"),
    ('[sandbox]\nrequire = ["filesytem"]\n[[invariants]]\nselect = "norms.*"\n', "is not a protection; known: filesystem"),
    ('[sandbox]\nrequire = "pid"\n[[invariants]]\nselect = "norms.*"\n', "must be a list of protections"),
    ('[sandbox]\ntool = "docker"\n[[invariants]]\nselect = "norms.*"\n', "tool = 'docker' must be one of auto, bubblewrap, unshare, landlock, none"),
    ('[similarity]\nfail_above = 70\n[[invariants]]\nselect = "norms.*"\n', "must be a share between 0 and 1"),
    ('[similarity]\nthreshold = 0.5\n[[invariants]]\nselect = "norms.*"\n', "is not a setting of [similarity]"),
]


@pytest.mark.parametrize("text, message", BAD_CONFIGS, ids=range(len(BAD_CONFIGS)))
def test_bad_assignment_files_say_what_to_fix(tmp_path, text, message):
    with pytest.raises(ConfigError) as error:
        load_assignment(write_config(tmp_path, text))
    assert message in str(error.value)


def test_globs_leave_out_what_the_gate_cannot_grade_and_first_entry_wins(tmp_path):
    a = load_assignment(write_config(tmp_path, '[[invariants]]\nselect = "attention.causal_non_leakage"\npoints = 3\n'
                                               '[[invariants]]\nselect = "attention.*"\nvisibility = "hidden"\n'))
    by_name = {s.name: s for s in a.selected}
    assert by_name["attention.causal_non_leakage"].points == 3 and by_name["attention.causal_non_leakage"].visibility == "visible"
    assert by_name["attention.agrees_with_reference"].visibility == "hidden"
    assert "attention.causal_gradient" in dict(a.excluded)
    assert [s.name for s in a.visible_only().selected] == ["attention.causal_non_leakage"]


def test_pyproject_table_is_an_assignment(tmp_path):
    path = tmp_path / "pyproject.toml"
    path.write_text('[project]\nname = "x"\n[tool.invariants-gate.assignment]\nname = "from pyproject"\n'
                    '[[tool.invariants-gate.invariants]]\nselect = "norms.layer_norm_known_values"\n')
    assert load_assignment(path).name == "from pyproject"


def test_a_shipped_assignment_is_found_by_name(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # from any folder, as from a wheel: the name finds the package's own file
    a = load_assignment("p01")
    assert Path(a.path) == ROOT / "invariants" / "gate" / "assignments" / "p01.toml" and a.name == load_assignment(Path(a.path)).name
    assert shipped_assignments() == ["lesson", "llama", "p01"]
    with pytest.raises(ConfigError, match=r"^no shipped assignment 'p02' \(shipped: lesson, llama, p01\); pass a path such as p02.toml"):
        load_assignment("p02")
    with pytest.raises(ConfigError, match=r"^no assignment file 'p01.toml'"):  # a suffix makes it a path, here a missing one
        load_assignment("p01.toml")


@pytest.mark.parametrize("name", ["p01.toml", "lesson.toml"])
def test_shipped_assignments_load(name):
    a = load_assignment(ROOT / "invariants" / "gate" / "assignments" / name)
    names = {s.name for s in a.selected}
    assert {"attention.causal_non_leakage", "block.residual_identity", "model.causal_non_leakage", "course.tokenizer_round_trip"} <= names
    assert "torch.nn.functional.scaled_dot_product_attention" in a.forbidden and a.on_forbidden == "fail"
    assert set(a.require) == {"filesystem", "tmp", "pid", "network", "capabilities"} and a.visible_only().require == ()
    assert a.flag_above < a.fail_above < 1
    if name == "lesson.toml":
        assert {"norms.layer_norm_known_values", "activation.gelu_known_values", "counts.gpt2_exact_counts",
                "moe.top_k_gates_sum_to_one", "moe.load_balancing_loss_bounds"} <= names


# -- scan, text, seeds -----------------------------------------------------------------------------


def test_source_scan_resolves_aliases():
    source = ("import torch.nn as nn\nfrom torch.nn import functional as F\nimport importlib\n"
              "a = nn.MultiheadAttention(4, 2)\nb = F.scaled_dot_product_attention\nimportlib.import_module('reference.numpy')\n")
    found = scan_source(source, "s.py", forbidden=["torch.nn.MultiheadAttention", "torch.nn.functional.scaled_dot_product_attention"],
                        blocked={"reference"})
    assert [(e["name"], e["where"]) for e in found] == [
        ("torch.nn.MultiheadAttention", "s.py:4"), ("torch.nn.functional.scaled_dot_product_attention", "s.py:5"),
        ("reference.numpy", "s.py:6")]


def test_source_scan_lets_the_shipped_modules_through_and_nothing_beside_them():
    source = ("from invariants.adapters import toolkit as tk\nimport invariants.adapters.toolkit\n"
              "import invariants.adapters\nfrom invariants.adapters import gpt2, toolkit\n"
              "import invariants.adapters.mixtral\nimportlib.import_module('invariants.adapters.toolkit')\n"
              "from invariants.adapters.toolkit import layer_norm\n")
    found = scan_source(source, "s.py", forbidden=[], blocked={"invariants"}, shipped={"invariants.adapters", "invariants.adapters.toolkit"})
    assert [(e["name"], e["where"]) for e in found] == [("invariants.adapters.gpt2", "s.py:4"), ("invariants.adapters.mixtral", "s.py:5")]


def test_the_guard_opens_a_blocked_package_to_its_shipped_modules_alone(tmp_path):
    """With pkg blocked and pkg.tools.kit shipped, `import pkg.tools.kit` loads the copy; pkg.secret is refused even where it exists."""
    lib, elsewhere = tmp_path / "lib", tmp_path / "site"
    (lib / "pkg" / "tools").mkdir(parents=True)
    (lib / "pkg" / "tools" / "__init__.py").write_text("")
    (lib / "pkg" / "tools" / "kit.py").write_text("VALUE = 'the copy'\n")
    (elsewhere / "pkg").mkdir(parents=True)
    (elsewhere / "pkg" / "__init__.py").write_text("")
    (elsewhere / "pkg" / "secret.py").write_text("VALUE = 'the secret'\n")
    shipped = {"pkg.tools": str(lib / "pkg" / "tools" / "__init__.py"), "pkg.tools.kit": str(lib / "pkg" / "tools" / "kit.py")}
    code = (f"import sys; sys.path.append({str(elsewhere)!r}); from invariants.gate.worker import Guard\n"
            f"guard = Guard(['pkg'], [], {str(tmp_path / 'submission')!r}, {shipped!r}); guard.install()\n"
            "import pkg.tools.kit; print(pkg.tools.kit.VALUE, list(pkg.__path__))\n"
            "try:\n    import pkg.secret\nexcept ImportError as exc:\n    print(exc)\n"
            "print([e['name'] for e in guard.evidence])\n")
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == [
        f"the copy [{str(lib / 'pkg')!r}]",
        "the gate does not let a submission import 'pkg.secret': that is the course's own code (of pkg, a submission may import pkg.tools.kit)",
        "['pkg.secret']",
    ]


def test_output_is_escaped_and_capped():
    text = clean_output(b"\x1b[31mred\x1b[0m\x00 ok\n" * 1000, 200)
    assert "\x1b" not in text and "\\u0000" in text and "bytes not shown" in text and len(text) < 400


def test_seeds_depend_on_secret_and_submission():
    assert derive_seed("s3cret", "ab") == derive_seed("s3cret", "ab")
    assert len({derive_seed("s3cret", "ab"), derive_seed("s3cret", "ac"), derive_seed("other", "ab")}) == 3


# -- grading, reports, CLI --------------------------------------------------------------------------


def test_same_submission_same_report(tmp_path):
    a = load_assignment(ASSIGNMENT)
    first, second = (without_volatile(grade(HOSTILE / "wrong_shape.py", a).as_dict()) for _ in range(2))
    assert first == second


def test_a_declaration_cannot_skip_a_required_invariant(tmp_path):
    a = load_assignment(write_config(tmp_path, '[assignment]\nbackend = "numpy"\n[examples]\nprofile = "ci"\nmax_examples = 5\n'
                                               '[[invariants]]\nselect = ["attention.causal_non_leakage", "attention.permutation_equivariance"]\n'))
    result = grade(HOSTILE / "declares_encoder_only.py", a)
    assert result.verdict == FAILED and result.submission["declarations"] == {"ENCODER_ONLY": True}
    by_name = {i.name: i for i in result.invariants}
    assert by_name["attention.permutation_equivariance"].status == "passed"
    skipped = by_name["attention.causal_non_leakage"]
    assert skipped.status == "skipped" and "declares ENCODER_ONLY = True" in skipped.reason and "not a pass" in skipped.reason


def test_secret_seed_is_recorded_and_reproducible(tmp_path):
    a = load_assignment(ASSIGNMENT)
    seeded = grade(HOSTILE / "good.py", a, secret="course-secret")
    assert seeded.verdict == PASSED and seeded.seed["mode"] == "secret" and "course-secret" not in json.dumps(seeded.as_dict())
    again = grade(HOSTILE / "good.py", a, seed=seeded.seed["value"])
    assert again.seed == {"mode": "fixed", "value": seeded.seed["value"]}


def test_zip_and_package_submissions(tmp_path):
    package = tmp_path / "my_package"
    package.mkdir()
    (package / "__init__.py").write_text("from my_package.norm import layer_norm\nBACKEND = 'numpy'\n")
    (package / "norm.py").write_text((HOSTILE / "good.py").read_text())
    archive = tmp_path / "handin.zip"
    with zipfile.ZipFile(archive, "w") as zf:
        for path in package.iterdir():
            zf.write(path, f"my_package/{path.name}")
    a = load_assignment(ASSIGNMENT)
    for submission in (package, archive):
        result = grade(submission, a)
        assert result.verdict == PASSED, result.reason


def test_unsafe_zip_is_not_gradable(tmp_path):
    archive = tmp_path / "evil.zip"
    with zipfile.ZipFile(archive, "w") as zf:
        zf.writestr("../../escape.py", "x = 1\n")
    result = grade(archive, load_assignment(ASSIGNMENT))
    assert result.verdict == "not_gradable" and "would land outside the submission" in result.reason


def test_reports_of_a_failure(tmp_path):
    result = grade(HOSTILE / "wrong_shape.py", load_assignment(ASSIGNMENT))
    assert all(inv.status in STATUSES for inv in result.invariants)
    from invariants.gate.reports import write_reports

    write_reports(result, tmp_path)
    suite = ET.parse(tmp_path / "junit.xml").getroot().find("testsuite")
    names = [case.get("name") for case in suite.iter("testcase")]
    assert len(names) == len(set(names)) == 2
    assert suite.get("failures") == "2" and suite.get("errors") == "0"
    gradescope = json.loads((tmp_path / "results.json").read_text())
    assert set(gradescope) >= {"score", "max_score", "execution_time", "tests"}
    assert all(set(t) >= {"name", "score", "max_score", "status", "output", "visibility"} for t in gradescope["tests"])
    markdown = (tmp_path / "summary.md").read_text()
    assert "shape of layer\\_norm output=(1, 3), but should be (1, 4)" in markdown and "hint:" in markdown


def test_a_gate_failure_is_a_gate_error(monkeypatch):
    import invariants.gate.grade

    def broken(self):
        raise RuntimeError("the worker could not start: simulated")

    monkeypatch.setattr(invariants.gate.grade.Session, "start", broken)
    result = grade(HOSTILE / "good.py", load_assignment(ASSIGNMENT))
    assert result.verdict == GATE_ERROR and result.exit_code == 4 and "simulated" in result.reason


@pytest.mark.parametrize("fixture, code", [("good.py", 0), ("wrong_shape.py", 1), ("missing_functions.py", 3)])
def test_cli_exit_codes(fixture, code, tmp_path, capsys):
    assert main([str(HOSTILE / fixture), "-a", str(ASSIGNMENT), "-o", str(tmp_path)]) == code
    assert "verdict:" in capsys.readouterr().out
    assert (tmp_path / "report.json").exists()


def test_cli_usage_errors(tmp_path, capsys):
    assert main([str(HOSTILE / "good.py")]) == 2
    assert main([str(HOSTILE / "good.py"), "-a", str(tmp_path / "none.toml")]) == 2
    assert main([str(tmp_path / "nothing.py"), "-a", str(ASSIGNMENT)]) == 2
    assert main([str(HOSTILE / "good.py"), "-a", str(ASSIGNMENT), "--formats", "pdf"]) == 2
    assert "no assignment file" in capsys.readouterr().err
    assert EXIT_CODES == {"passed": 0, "failed": 1, "not_gradable": 3, "gate_error": 4}


def test_python_dash_m_gate_runs(tmp_path):
    done = subprocess.run([sys.executable, "-m", "invariants.gate", str(HOSTILE / "wrong_type.py"), "-a", str(ASSIGNMENT), "-o", str(tmp_path), "-q"],
                          cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 1, done.stderr
    assert done.stdout.startswith("failed (exit 1)")


def test_batch_writes_one_report_each_and_a_class_summary(tmp_path):
    cohort = tmp_path / "cohort"
    cohort.mkdir()
    for name in ("good.py", "wrong_shape.py", "missing_functions.py"):
        (cohort / name).write_text((HOSTILE / name).read_text())
    out = tmp_path / "out"
    assert main(["--batch", str(cohort), "-a", str(ASSIGNMENT), "-o", str(out), "--jobs", "2", "-q"]) == 0
    assert {p.name for p in out.iterdir()} == {"good", "wrong_shape", "missing_functions", "class-summary.csv", "pass-rates.csv",
                                               "class-summary.md", "similar-pairs.csv"}
    rows = list(csv.DictReader((out / "class-summary.csv").open()))
    assert [r["verdict"] for r in rows] == ["passed", "not_gradable", "failed"]
    rates = {r["invariant"]: r["pass_rate"] for r in csv.DictReader((out / "pass-rates.csv").open())}
    assert rates == {"norms.layer_norm_known_values": "0.333", "norms.layer_norm_affine": "0.333"}


def test_two_batches_in_one_process_each_grade_their_own_assignment(tmp_path):
    """The per-process assignment cache (pool workers load it once) must not hand a later batch an earlier batch's list."""
    cohort = tmp_path / "cohort"
    cohort.mkdir()
    (cohort / "good.py").write_text((HOSTILE / "good.py").read_text())
    one_law = tmp_path / "one_law.toml"
    text = ASSIGNMENT.read_text()
    laws = 'select = ["norms.layer_norm_known_values", "norms.layer_norm_affine"]'
    assert laws in text
    one_law.write_text(text.replace(laws, 'select = ["norms.layer_norm_affine"]'))
    for assignment, count in ((ASSIGNMENT, 2), (one_law, 1)):
        out = tmp_path / assignment.stem
        assert main(["--batch", str(cohort), "-a", str(assignment), "-o", str(out), "-q"]) == 0
        assert len(json.loads((out / "good" / "report.json").read_text())["invariants"]) == count, assignment.name


def _summary_without_seconds(path):
    rows = list(csv.DictReader(path.open()))
    return [{k: v for k, v in row.items() if k != "seconds"} for row in rows]


def test_shards_merge_into_the_class_summary_of_one_batch(tmp_path, capsys):
    cohort = tmp_path / "cohort"
    cohort.mkdir()
    for name in ("good.py", "wrong_shape.py", "missing_functions.py", "nan_output.py", "wrong_type.py"):
        (cohort / name).write_text((HOSTILE / name).read_text())
    (cohort / "good_again.py").write_text((HOSTILE / "good.py").read_text().replace("centred", "c") + "\n# renamed\n")
    whole, shards = tmp_path / "whole", tmp_path / "shards"
    assert main(["--batch", str(cohort), "-a", str(ASSIGNMENT), "-o", str(whole), "-q"]) == 0
    for k in (1, 2, 3):
        assert main(["--batch", str(cohort), "-a", str(ASSIGNMENT), "-o", str(shards / f"reports-{k}"), "--shard", f"{k}/3", "-q"]) == 0
    graded = sorted(p.name for p in shards.glob("reports-*/*") if p.is_dir())
    assert graded == sorted(p.name for p in whole.iterdir() if p.is_dir()), "every submission in exactly one shard"
    assert not list(shards.glob("reports-*/class-summary.csv")), "a shard writes its manifest, not a summary"
    merged = tmp_path / "merged"
    assert main(["--merge", str(shards), "-o", str(merged)]) == 0
    assert _summary_without_seconds(merged / "class-summary.csv") == _summary_without_seconds(whole / "class-summary.csv")
    assert (merged / "pass-rates.csv").read_text() == (whole / "pass-rates.csv").read_text()
    pairs = list(csv.DictReader((merged / "similar-pairs.csv").open()))
    assert [{p["a"], p["b"]} for p in pairs] == [{"good", "good_again"}], "a renamed copy is paired, across shards"
    markdown = (merged / "class-summary.md").read_text()
    assert "Grading time: mean" in markdown and "](../shards/reports-" in markdown
    (shards / "reports-2" / "shard-2-of-3.json").unlink()
    for child in (shards / "reports-2").iterdir():
        if child.is_dir():
            for f in child.iterdir():
                f.unlink()
            child.rmdir()
    capsys.readouterr()
    assert main(["--merge", str(shards), "-o", str(tmp_path / "again")]) == 2
    assert "shard(s) 2 of 3 are missing" in capsys.readouterr().err
    assert main(["--batch", str(cohort), "-a", str(ASSIGNMENT), "--shard", "4/3"]) == 2


def test_similar_submissions_are_paired_in_the_class_summary(tmp_path):
    cohort = tmp_path / "cohort"
    cohort.mkdir()
    good = (ROOT / "examples" / "submissions" / "mask_after_softmax.py").read_text()
    (cohort / "alice.py").write_text(good)
    (cohort / "bob.py").write_text(good.replace("weights", "w").replace("    ", "  "))  # renamed, re-indented
    (cohort / "carol.py").write_text((FIXTURES / "honest" / "second_student.py").read_text())
    out = tmp_path / "out"
    assert main(["--batch", str(cohort), "-a", str(ASSIGNMENT), "-o", str(out), "-q"]) == 0  # not gradable here: compared all the same
    pairs = list(csv.DictReader((out / "similar-pairs.csv").open()))
    assert [(p["a"], p["b"]) for p in pairs] == [("alice", "bob")], pairs
    assert float(pairs[0]["share_of_a"]) > 0.9 and "alice.py:" in pairs[0]["spans"]
    assert "Submissions with alike code" in (out / "class-summary.md").read_text()


def test_torch_submission_and_forbidden_api_evidence():
    import dataclasses

    a = dataclasses.replace(load_assignment(ASSIGNMENT), backend="any")
    result = grade(HOSTILE / "torch_forbidden.py", a)
    assert result.verdict == PASSED, result.reason
    assert result.submission["backend"] == "torch"
    runtime = {(e["name"], e["detail"]) for e in result.evidence if e["source"] == "worker"}
    assert runtime == {("torch.nn.MultiheadAttention", "constructed"), ("torch.nn.functional.scaled_dot_product_attention", "called")}
    assert any(e["source"] == "source scan" and "string" in e["detail"] for e in result.evidence)
    strict = grade(HOSTILE / "torch_forbidden.py", dataclasses.replace(a, on_forbidden="fail"))
    assert strict.verdict == "failed" and "forbids" in strict.reason
    assert strict.score == 0 and all(i.status == "voided" for i in strict.invariants), "module-level code voids every invariant"


@pytest.mark.parametrize("limit, phrase, second", [
    ("invariant_seconds", "the invariant's time limit (1 s) ran out", "error"),
    ("run_seconds", "the run's time limit (1 s) ran out", "not_run"),
])
def test_time_limits_end_the_invariant_or_the_run_and_keep_the_report(limit, phrase, second):
    import dataclasses

    a = load_assignment(ASSIGNMENT)
    a = dataclasses.replace(a, limits=dataclasses.replace(a.limits, **{limit: 1.0}))
    result = grade(HOSTILE / "infinite_loop.py", a)
    first, other = result.invariants
    assert result.verdict == "failed"
    assert first.status == "error" and phrase in first.reason
    assert other.status == second
