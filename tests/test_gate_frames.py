"""What a submission puts in front of the parent is the submission's fault, never a gate error (issue 24, sections 4 and 5).

Frames (invariants.gate.frames: one schema, bounded depth), answers of the wrong dtype or shape (refused from
their declarations, before their bytes are read), archives and file names (invariants.gate.submission) and
names that collide with a batch's own files (invariants.gate.batch) each end as "failed" or "not gradable",
with a one-line reason that names what broke.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import signal
import struct
import threading
import zipfile
from pathlib import Path

import numpy as np
import pytest
from hypothesis import settings as hypothesis_settings

from invariants import all_invariants, run_invariant
from invariants.gate import frames, wire
from invariants.gate.batch import report_names
from invariants.gate.cli import main
from invariants.gate.config import load_assignment
from invariants.gate.grade import grade
from invariants.gate.result import FAILED, NOT_GRADABLE
from invariants.profiles import profile_settings
from invariants.protocol import FUNCTIONS, load_implementation

FIXTURES = Path(__file__).parent / "fixtures"
HOSTILE = FIXTURES / "hostile"
GOOD = (HOSTILE / "good.py").read_text()


@pytest.fixture(scope="module")
def assignment():
    return load_assignment(FIXTURES / "assignments" / "hostile.toml")


def reasons(result):
    return "\n".join([result.reason, *(f"{i.status}: {i.reason}" for i in result.invariants)])


# -- frames ------------------------------------------------------------------------------------------------


def test_a_header_nested_200000_levels_deep_is_a_wire_error_not_a_recursion_error():
    header = b'{"op":"answer","buffers":[],"value":' + b"[" * 200_000 + b"]" * 200_000 + b"}"
    read, write = os.pipe()
    writer = threading.Thread(target=_write, args=(write, struct.pack(">I", len(header)) + header))  # more than a pipe holds
    writer.start()
    try:
        with pytest.raises(wire.WireError, match=rf"a header nested 200001 levels deep \(more than {wire.MAX_HEADER_DEPTH}\)"):
            wire.receive_header(read)
    finally:
        os.close(read)  # a writer still blocked gets EPIPE
        writer.join()
        os.close(write)


def _write(fd, data):
    try:
        os.write(fd, data)
    except BrokenPipeError:
        pass


def test_brackets_inside_strings_do_not_count_as_nesting():
    assert wire.nesting(b'{"a": "[[[[{{{{", "b": [1, {"c": "\\"]]"}]}') == 3


@pytest.mark.parametrize("header, op, message", [
    ({"op": "loaded", "ok": False, "problem": {"kind": "refused", "message": "refused to grade: forged"}, "functions": [],
      "declarations": {}, "backend": None, "evidence": []}, "loaded",
     "the loaded frame's problem's kind is 'refused', not one of syntax_error, import_error, exit_at_import"),
    ({"op": "hello", "protections": {}, "missing": [], "uid": 0}, "answer", "a 'hello' frame where an 'answer' frame was due"),
    ({"op": "answer", "ok": True, "value": 1, "evidence": [], "used": [1]}, "answer", "the answer frame's used[0] is an int, not str"),
    ({"op": "answer", "ok": True, "value": 1, "evidence": [], "used": [], "extra": 1}, "answer", "has a field 'extra' it does not define"),
    ({"op": "answer", "ok": False, "value": 1, "evidence": [], "used": []}, "answer", "an error when it is false"),
    ({"op": "answer", "ok": True, "value": 1, "evidence": [{"kind": "x"}], "used": []}, "answer",
     "the answer frame's evidence[0] lacks its field 'name'"),
    ({"op": "hello", "protections": {}, "missing": ["x"] * 1001, "uid": 0}, "hello", "the hello frame's missing has 1001 entries"),
    ({"op": "hello", "protections": {}, "missing": [], "uid": True}, "hello", "the hello frame's uid is a bool, not int"),
])
def test_a_frame_that_breaks_the_schema_names_the_field(header, op, message):
    with pytest.raises(frames.FrameError, match=re.escape(message)):
        frames.check({**header, "buffers": []}, op)


def _declared(value):
    tree, buffers = wire.encode(value)
    return {"value": tree, "buffers": [len(b) for b in buffers]}


@pytest.mark.parametrize("name, args, answer, problem", [
    ("layer_norm", (np.ones((2, 4)), np.ones(4), np.zeros(4), 1e-5), np.ones((2000, 2000), dtype=bool),
     "dtype of layer_norm output=bool, but should be a float dtype"),
    ("layer_norm", (np.ones((2, 4)), np.ones(4), np.zeros(4), 1e-5), np.ones((2048, 2048)),
     "shape of layer_norm output=(2048, 2048), but should be (2, 4)"),
    ("attention", (np.ones((1, 3, 4)), *[np.eye(4)] * 4, 2, True), np.ones((1, 3, 4)),
     "type of attention output=array, but should be a tuple of 2 arrays"),
    ("attention", (np.ones((1, 3, 4)), *[np.eye(4)] * 4, 2, True), (np.ones((1, 3, 4)), np.ones((1, 2, 3, 300))),
     "shape of attention output[1]=(1, 2, 3, 300), but should be (1, 2, 3, 3)"),
    ("cross_entropy", (np.ones((2, 5)), np.zeros(2, dtype=np.int64)), np.ones(10**6),
     "shape of cross_entropy output=(1000000,), but should be a scalar"),
    ("build_vocab", ("abc",), np.ones(3), "type of build_vocab output=array, but should be str"),
])
def test_an_answer_is_held_to_its_arguments_from_its_declarations(name, args, answer, problem):
    assert frames.answer_problem(name, args, _declared(answer)) == problem


_DECODE_ARGS = (np.zeros((2, 5), dtype=np.int64), {"embed": np.ones((7, 4)), "blocks": [{}, {}]}, 2, 1, 10_000.0, None, np.array([3, 2]))


@pytest.mark.parametrize("cache", [np.full((2, 2, 2, 64), -1), np.full((2, 2, 1, 5), -1), np.array([10, 20])],
                         ids=["positions-preallocated-per-query-head", "positions-grown", "sizes"])
def test_llama_decodes_cache_report_may_take_either_form_and_any_layout(cache):
    """cache_positions' heads and slots are the cache's own (the cache law judges them), or cache_sizes (n,)."""
    assert frames.answer_problem("llama_decode", _DECODE_ARGS, _declared((np.ones((2, 5, 7)), cache))) is None


def test_a_cache_report_of_neither_form_names_both():
    problem = frames.answer_problem("llama_decode", _DECODE_ARGS, _declared((np.ones((2, 5, 7)), np.ones((2, 3), dtype=np.int64))))
    assert problem == ("shape of llama_decode output[1]=(2, 3), but should be (2, 2, *, *); "
                       "or shape of llama_decode output[1]=(2, 3), but should be (2,)")


def test_an_answer_that_announces_more_bytes_than_its_arrays_need_is_a_frame_error():
    header = {**_declared(np.ones((2, 4))), "buffers": [256 << 20]}
    with pytest.raises(frames.FrameError, match="announces 268435456 bytes of arrays, but its arrays need 64"):
        frames.answer_problem("layer_norm", (np.ones((2, 4)), np.ones(4), np.zeros(4), 1e-5), header)


def test_the_reference_answers_every_invariant_as_the_schema_expects():
    """Every call the registry's invariants make, answered by the reference, fits its entry's answer_form (no honest answer is refused)."""
    impl = load_implementation("reference.numpy")
    seen, unfit = set(), []
    call = impl.transport.call

    def checked(name, args):
        out = call(name, args)
        try:
            problem = frames.answer_problem(name, args, _declared(out))
        except Exception as exc:  # noqa: BLE001 - the invariant would swallow it as the implementation's error
            problem = f"answer_problem raised {exc!r}"
        if frames.expected(name, args) is not None:
            seen.add(name)
        if problem:
            unfit.append(f"{name}: {problem}")
        return out

    impl.transport.call = checked
    settings = hypothesis_settings(profile_settings("dev"), max_examples=3, database=None)
    for inv in all_invariants():
        run_invariant(inv, impl, settings=settings)
    assert not unfit, unfit[:5]
    assert seen == set(FUNCTIONS), sorted(set(FUNCTIONS) - seen)


# -- the gate's verdicts on hostile submissions ----------------------------------------------------------


@pytest.mark.parametrize("fixture, phrase", [
    ("huge_bool_answer.py", "dtype of layer_norm output=bool, but should be a float dtype"),
    ("huge_wrong_shape.py", "shape of layer_norm output=(2048, 2048), but should be (1, "),
    ("deep_frame.py", "layer_norm's answer broke the gate's protocol: a header nested 200001 levels deep"),
])
def test_a_hostile_answer_fails_the_submission_with_a_reason(fixture, phrase, assignment):
    result = grade(HOSTILE / fixture, assignment)
    assert result.verdict == FAILED, reasons(result)
    assert phrase in reasons(result)


def test_the_parents_peak_memory_on_huge_wrong_answers_stays_near_an_honest_ones():
    """benchmarks/gate_memory.py's measure: before the answers were checked from their headers, 340 MiB against 52 (issue 24)."""
    spec = importlib.util.spec_from_file_location("gate_memory", Path(__file__).parent.parent / "benchmarks" / "gate_memory.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    honest = bench.measure(*bench.CASES["control_good"])
    for case in ("huge_bool_answer", "huge_wrong_shape"):
        hostile = bench.measure(*bench.CASES[case])
        assert hostile["verdict"] == FAILED and hostile["peak_mib"] < 1.5 * honest["peak_mib"], (case, hostile, honest)


def test_a_refusal_forged_at_import_is_not_a_gate_error_and_its_text_is_not_the_reason(assignment):
    result = grade(HOSTILE / "forged_refused.py", assignment)
    assert result.verdict == NOT_GRADABLE, reasons(result)
    assert result.reason.startswith("while importing the submission, the worker's load report broke the gate's protocol")
    assert "FORGED" not in result.reason and "\n" not in result.reason


# -- archives and file names --------------------------------------------------------------------------------


def _zip(path, entries):
    """A zip of (name, text) entries, stored."""
    with zipfile.ZipFile(path, "w") as zf:
        for name, data in entries:
            zf.writestr(name, data)
    return path


def _zip_replace(path, good, bad):
    """`path` with the bytes `good` replaced by `bad` (of the same length, so every offset still holds)."""
    path.write_bytes(path.read_bytes().replace(good, bad))
    return path


HEADER_FIELDS = {"flags": (6, 8), "method": (8, 10)}  # offsets in a local file header and in a central directory entry


def _set_header(path, field, value):
    """Every entry's `field` (a u16) set to `value` in its local and central headers."""
    raw = bytearray(path.read_bytes())
    for signature, at in zip((b"PK\x03\x04", b"PK\x01\x02"), HEADER_FIELDS[field], strict=True):
        start = 0
        while (start := raw.find(signature, start)) >= 0:
            raw[start + at : start + at + 2] = struct.pack("<H", value)
            start += 4
    path.write_bytes(bytes(raw))
    return path


ARCHIVES = {  # name: (build in tmp, a phrase of the reason)
    "non_utf8_name": (lambda tmp: _set_header(_zip_replace(_zip(tmp / "a.zip", [("Xa.py", GOOD)]), b"Xa.py", b"\xffa.py"), "flags", 0x800),
                      "has an entry whose name b'\\xffa.py' is not UTF-8"),
    "file_and_folder": (lambda tmp: _zip(tmp / "a.zip", [("pkg", "x"), ("pkg/__init__.py", GOOD)]),
                        "the archive entry 'pkg/__init__.py' lies in a folder 'pkg', but the archive also has a file of that name"),
    "encrypted": (lambda tmp: _set_header(_zip(tmp / "a.zip", [("submission.py", GOOD)]), "flags", 0x1),
                  "the archive entry 'submission.py' is encrypted: zip it again without a password"),
    "bad_crc": (lambda tmp: _zip_replace(_zip(tmp / "a.zip", [("submission.py", GOOD)]), b"BACKEND", b"BACKEN_"),
                "the archive entry 'submission.py' cannot be unpacked (Bad CRC-32 for file 'submission.py')"),
    "unknown_method": (lambda tmp: _set_header(_zip(tmp / "a.zip", [("submission.py", GOOD)]), "method", 99),
                       "the archive entry 'submission.py' is compressed with method 99, which zipfile cannot unpack"),
}


@pytest.mark.parametrize("case", ARCHIVES)
def test_an_archive_zipfile_cannot_unpack_is_not_gradable_and_names_the_entry(case, assignment, tmp_path):
    build, phrase = ARCHIVES[case]
    result = grade(build(tmp_path), assignment)
    assert result.verdict == NOT_GRADABLE, reasons(result)
    assert phrase in result.reason and "\n" not in result.reason


def test_a_file_name_that_is_not_utf8_is_not_gradable_and_named(assignment, tmp_path):
    folder = tmp_path / "student"
    folder.mkdir()
    (folder / "submission.py").write_text(GOOD)
    (Path(os.fsdecode(bytes(folder) + b"/notes\xff.txt"))).write_text("x")
    result = grade(folder, assignment)
    assert result.verdict == NOT_GRADABLE, reasons(result)
    assert result.reason == "the file name b'notes\\xff.txt' is not UTF-8: rename it"


@pytest.mark.parametrize("make", [lambda p: p.symlink_to("/etc/shadow"), lambda p: os.mkfifo(p)], ids=["symlink", "fifo"])
def test_a_link_or_a_fifo_in_a_folder_is_not_gradable_and_named(make, assignment, tmp_path):
    """Only plain files are copied: a link could reach the host's files, and copying a FIFO blocks until someone writes to it."""
    folder = tmp_path / "student"
    folder.mkdir()
    (folder / "submission.py").write_text(GOOD)
    make(folder / "data.txt")

    def stuck(signum, frame):
        raise TimeoutError("grading a folder holding a FIFO blocked for 30 s")

    previous = signal.signal(signal.SIGALRM, stuck)
    signal.alarm(30)  # bounded: a copy that opens the FIFO blocks until someone writes to it
    try:
        result = grade(folder, assignment)
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)
    assert result.verdict == NOT_GRADABLE, reasons(result)
    assert result.reason.startswith("data.txt is ") and result.reason.endswith(": submit plain files"), result.reason


def test_a_submission_whose_own_name_is_not_utf8_is_not_gradable_and_its_reports_are_written(tmp_path):
    cohort = tmp_path / "cohort"
    cohort.mkdir()
    Path(os.fsdecode(bytes(cohort) + b"/st\xffu.py")).write_text(GOOD)
    out = tmp_path / "out"
    assert main(["--batch", str(cohort), "-a", str(FIXTURES / "assignments" / "hostile.toml"), "-o", str(out), "-q"]) == 0
    report = json.loads((out / "st_u" / "report.json").read_text())
    assert report["verdict"] == NOT_GRADABLE and report["reason"] == "the submission's name b'st\\xffu.py' is not UTF-8: rename it"
    assert report["submission"]["source"].endswith("st\\xffu.py") and (out / "class-summary.md").is_file()


# -- a batch's own files ---------------------------------------------------------------------------------------


def test_a_submission_named_like_the_class_summary_does_not_replace_it(tmp_path):
    cohort = tmp_path / "cohort"
    cohort.mkdir()
    with zipfile.ZipFile(cohort / "class-summary.md.zip", "w") as zf:
        zf.writestr("submission.py", GOOD)
    (cohort / "good.py").write_text(GOOD)
    out = tmp_path / "out"
    code = main(["--batch", str(cohort), "-a", str(FIXTURES / "assignments" / "hostile.toml"), "-o", str(out), "-q"])
    assert code == 0
    assert (out / "class-summary.md").is_file() and (out / "class-summary_md" / "report.json").is_file()
    assert "class-summary.md.zip" in (out / "class-summary.md").read_text()
    assert report_names([cohort / "class-summary.md.zip", cohort / "good.py"]) == ["class-summary_md", "good"]
    assert json.loads((out / "class-summary_md" / "report.json").read_text())["verdict"] == "passed"
