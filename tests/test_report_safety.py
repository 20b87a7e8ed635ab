"""What a submission controls reaches every report as text: escaped for Python source, XML, Markdown, HTML and CI logs.

And what students see: hidden invariants as hidden.N, the likely bug first, no score where nothing
was graded. One graded run of a submission built to break each format
(tests/fixtures/hostile/hostile_text.py) under a file name that closes a docstring and runs code.
"""

from __future__ import annotations

import contextlib
import copy
import csv
import dataclasses
import io
import json
import re
import shutil
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from invariants.gate.config import load_assignment
from invariants.gate.grade import grade
from invariants.gate.reports import headline, to_gradescope, to_junit, to_markdown, to_terminal, write_reports
from invariants.gate.result import NOT_GRADABLE
from invariants.htmlreport import batch_html

FIXTURES = Path(__file__).parent / "fixtures"
ASSIGNMENT = FIXTURES / "assignments" / "hostile.toml"
HOSTILE_NAME = 'x"""; __import__("pathlib").Path("PWNED").touch(); """\u2028##teamcity[x]\x0b::error::vt.py'
HIDDEN = "norms.layer_norm_affine"  # the assignment's second invariant, hidden until the due date here
LINE_COMMAND = re.compile(r"^[\s\u200b-\u200d\u2060\ufeff]*(::|section_start:|section_end:)")
ANYWHERE_COMMAND = re.compile(r"##(vso|teamcity)?\[", re.I)
LINE_BREAKS = re.compile("[\r\x0b\x0c\x1c-\x1e\x85\u2028\u2029]")  # what some viewer takes for a new line, besides LF


@pytest.fixture(scope="module")
def graded(tmp_path_factory):
    """(result, reports folder, submission): hostile_text.py under HOSTILE_NAME, graded with its second invariant hidden."""
    root = tmp_path_factory.mktemp("hostile_text")
    submission = root / "submitted" / HOSTILE_NAME
    submission.parent.mkdir()
    shutil.copy(FIXTURES / "hostile" / "hostile_text.py", submission)
    assignment = load_assignment(ASSIGNMENT)
    assignment = dataclasses.replace(assignment, selected=(assignment.selected[0],
                                                           dataclasses.replace(assignment.selected[1], visibility="after_due_date")))
    result = grade(submission, assignment)
    assert [i.status for i in result.invariants] == ["error", "error"], [(i.name, i.status, i.reason) for i in result.invariants]
    write_reports(result, root / "reports")
    return result, root / "reports", submission


def _commands(text):
    """The lines (as any viewer splits them) a CI runner would act on."""
    return [line for line in text.splitlines() if LINE_COMMAND.match(line) or ANYWHERE_COMMAND.search(line)]


def _strings(value):
    if isinstance(value, dict):
        return [s for k, v in value.items() for s in (k, *_strings(v))]
    if isinstance(value, list):
        return [s for v in value for s in _strings(v)]
    return [value] if isinstance(value, str) else []


def test_no_repro_script_runs_code_from_the_file_name_or_the_output(graded):
    _, reports, submission = graded
    scripts = sorted(reports.glob("repro_*.py"))
    assert scripts, "a visible failure with calls has a repro script"
    for script in scripts:
        given = subprocess.run([sys.executable, str(script), str(submission)], capture_output=True, text=True, timeout=120, cwd=reports)
        default = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120, cwd=submission.parent)
        planted = [p for p in (reports, submission.parent) for p in p.glob("PWNED*")]
        assert not planted, f"running {script.name} ran code the submission wrote: {planted}"
        assert given.returncode == 1 and "raised ValueError" in given.stdout, given.stderr  # 1: the failure reproduces
        assert default.returncode == 1, default.stderr  # its default target: the file name as written, found in the current folder


def test_every_report_parses_and_carries_no_ci_command(graded):
    result, reports, _ = graded
    texts = {p.name: p.read_text(encoding="utf-8") for p in sorted(reports.iterdir()) if p.suffix in (".json", ".xml", ".md", ".py")}
    texts["terminal"] = to_terminal(result)
    texts["terminal, hidden shown"] = to_terminal(result, show_hidden=True)
    texts["headline"] = headline(result)
    assert "#\\#teamcity[" in texts["summary.md"] and "\\u2028" in texts["summary.md"], "the student's words are shown, escaped"
    ET.fromstring(texts["junit.xml"])  # U+FFFF, U+FFFE and C0 controls would make it unparseable
    for name, text in texts.items():
        assert not _commands(text), (name, _commands(text)[:3])
        if name.endswith(".json"):  # the values, as `jq -r` prints them
            assert not [s for s in _strings(json.loads(text)) if _commands(s)], name
        elif name != "report.json":
            assert not LINE_BREAKS.search(text), (name, LINE_BREAKS.search(text))


def _outside_fences(markdown):
    """The Markdown's lines that are not inside a fenced code block (CommonMark: closed by a fence at least as long)."""
    lines, fence = [], None
    for line in markdown.split("\n"):
        opening = re.match(r"(`{3,})", line)
        if fence is None and opening:
            fence = opening.group(1)
        elif fence is not None and re.fullmatch(re.escape(fence) + "`*[ \t]*", line):
            fence = None
        elif fence is None:
            lines.append(line)
    assert fence is None, "a fence is left open"
    return lines


def test_summary_markdown_keeps_submission_text_in_its_fences_cells_and_code_spans(graded):
    _, reports, _ = graded
    outside = _outside_fences((reports / "summary.md").read_text(encoding="utf-8"))
    prose = "\n".join(re.sub(r"(`+)(?!`).*?(?<!`)\1(?!`)", "", line) for line in outside)  # code spans show their text as written
    assert "<script" not in prose and "<img" not in prose and "forged" not in prose, prose
    assert not re.search(r"(?<!\\)\]\(", prose), "a link or image the submission wrote"
    assert prose.count("<details>") == prose.count("</details>")
    for table in re.findall(r"(?m)^(\|.*\|\n)+", prose + "\n"):
        rows = [line for line in table.splitlines() if line]
        assert len({len(re.findall(r"(?<!\\)\|", row)) for row in rows}) == 1, rows


def test_html_report_escapes_submission_text(graded):
    _, reports, _ = graded
    page = batch_html(reports)
    assert "&lt;script&gt;alert(1)" in page and "<script>alert(1)" not in page and "<img src=x" not in page


def test_hidden_invariants_are_hidden_n_in_what_students_see(graded):
    result, reports, _ = graded
    results = json.loads((reports / "results.json").read_text(encoding="utf-8"))
    seen = {"terminal": to_terminal(result), "summary.md": (reports / "summary.md").read_text(encoding="utf-8"),
            "junit.xml": (reports / "junit.xml").read_text(encoding="utf-8"), "results.json output": results["output"],
            **{f"results.json {t['name']}": t["output"] for t in results["tests"] if t["visibility"] == "visible"},
            **{p.name: p.read_text(encoding="utf-8") for p in reports.glob("repro_*")}}
    assert HIDDEN in result.reason, "the staff's record names it"
    leaks = [name for name, text in seen.items() if HIDDEN in text or HIDDEN.replace(".", "_") in text]
    assert not leaks, f"{HIDDEN} is named before the due date in {leaks}"
    assert "hidden.1" in headline(result) and "hidden.1" in results["output"]
    assert results["output_format"] == results["test_output_format"] == "text", "Gradescope renders no HTML or Markdown of theirs"
    assert HIDDEN in headline(result, show_hidden=True) and HIDDEN in to_terminal(result, show_hidden=True)


def test_the_students_report_leads_with_the_likely_bug(graded):
    result, reports, _ = graded
    summary = (reports / "summary.md").read_text(encoding="utf-8")
    assert summary.index("likely bug: norms.layer\\_norm\\_known\\_values") < summary.index("Submission ") < summary.index("| |")
    terminal = to_terminal(result).splitlines()
    assert terminal[1].startswith("  likely bug: norms.layer_norm_known_values"), terminal[:3]
    assert json.loads((reports / "results.json").read_text(encoding="utf-8"))["output"].startswith("likely bug: norms.layer_norm_known_values")


def test_a_file_name_that_is_not_utf8_is_written_escaped_in_every_report(graded, tmp_path):
    result = copy.deepcopy(graded[0])
    result.submission["source"] = "/submissions/caf\udce9.py"  # os.fsdecode of b"caf\xe9.py"
    written = write_reports(result, tmp_path)
    texts = {p.name: p.read_bytes().decode("utf-8") for p in written}
    assert all("caf\\udce9" in texts[name] for name in ("report.json", "junit.xml", "summary.md")), texts["summary.md"][:300]
    assert json.loads(texts["report.json"])["submission"]["source"] == "/submissions/caf\udce9.py"
    ET.fromstring(texts["junit.xml"])


def test_a_result_that_is_not_gradable_reports_no_score(graded):
    result = copy.deepcopy(graded[0])
    result.verdict, result.reason = NOT_GRADABLE, "the submission does not provide attention, needed by 1 required invariant(s)"
    assert result.score is None, "GradeResult.score: none without a grade, whatever ran"
    assert "no score" in headline(result) and "1/2" not in headline(result), headline(result)
    assert "no score" in to_terminal(result).splitlines()[-1]
    assert to_markdown(result).splitlines()[0].endswith("not gradable — no score")
    assert json.loads(to_gradescope(result))["score"] == 0
    names = [p.get("name") for p in ET.fromstring(to_junit(result)).iter("property")]
    assert "score" not in names and "max_score" in names, names


# -- a batch with answers built to be read as the gate's words, formulas, math and mentions (issue 34 §5) ---------------------

COURSE_TEXT = FIXTURES / "assignments" / "course_text.toml"
HONEST_TOKENIZER = '''import numpy as np
BACKEND = "numpy"
def build_vocab(text):
    return "".join(sorted(set(text)))
def encode(text, vocab):
    return np.array([vocab.index(ch) for ch in text], dtype=np.int64)
def decode(ids, vocab):
    return "".join(vocab[int(i)] for i in ids)
'''
FORMULA_NAME = "=SUM(1+1) @course-staff $x$.py"  # sorts between the two honest ones: graded second of three
REPORT_BYTES = 256 << 10  # what one report may weigh, whatever a submission answers or prints (its answer is 4 MB)
FORMULA_START = re.compile(r"^[ ]*[=+\-@\t\r\n\uff1d\uff0b\uff0d\uff20]")


def _batch_of_three(root):
    """A batch of an honest tokenizer, hostile_answers.py under FORMULA_NAME, and another honest one: (exit code, reports, what it printed)."""
    from invariants.gate.cli import main

    folder = root / "submissions"
    folder.mkdir()
    (folder / "0_first.py").write_text(HONEST_TOKENIZER)
    shutil.copy(FIXTURES / "hostile" / "hostile_answers.py", folder / FORMULA_NAME)
    (folder / "z_last.py").write_text(HONEST_TOKENIZER)
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        code = main(["--batch", str(folder), "-a", str(COURSE_TEXT), "-o", str(root / "reports"), "--seed", "1"])
    return code, root / "reports", printed.getvalue()


@pytest.fixture(scope="module")
def batch(tmp_path_factory):
    """The batch of three, graded once."""
    return _batch_of_three(tmp_path_factory.mktemp("batch"))


def _report_folders(reports):
    return sorted(p for p in reports.iterdir() if p.is_dir())


def test_answers_written_as_the_gates_words_stop_no_grading_and_no_report(batch):
    """`atol=1.2.3` and "float32 rounding size" in an answer: the diagnosis reads figures, not words; every student gets every report."""
    code, reports, _ = batch
    folders = _report_folders(reports)
    assert [p.name for p in folders] == ["0_first", "_SUM_1_1___course-staff__x_", "z_last"], folders
    for folder in folders:
        assert {"report.json", "junit.xml", "results.json", "summary.md"} <= {p.name for p in folder.iterdir()}, folder
    verdicts = [json.loads((f / "report.json").read_text(encoding="utf-8"))["verdict"] for f in folders]
    assert verdicts == ["passed", "failed", "passed"] and code == 0, verdicts
    said = json.loads((folders[1] / "results.json").read_text(encoding="utf-8"))["output"]
    assert said.startswith("likely bug: course.vocabulary_is_sorted_characters") and "float32 rounding size in a float64 run" not in said
    assert len((reports / "class-summary.csv").read_text(encoding="utf-8").splitlines()) == 4


def test_no_class_summary_cell_is_a_spreadsheet_formula(batch):
    _, reports, _ = batch
    for name in ("class-summary.csv", "pass-rates.csv", "similar-pairs.csv"):
        rows = list(csv.reader(io.StringIO((reports / name).read_text(encoding="utf-8"))))
        formulas = [cell for row in rows for cell in row if FORMULA_START.match(cell)]
        assert not formulas, (name, formulas)
    assert "'=SUM(1+1) @course-staff $x$.py" in (reports / "class-summary.csv").read_text(encoding="utf-8")


def _prose(markdown):
    """The Markdown outside fenced blocks and code spans: what GitHub renders as math, mentions and links."""
    return "\n".join(re.sub(r"(`+)(?!`).*?(?<!`)\1(?!`)", "", line) for line in _outside_fences(markdown))


def test_markdown_renders_no_math_and_mentions_no_one(batch):
    _, reports, _ = batch
    for path in [reports / "class-summary.md", *(f / "summary.md" for f in _report_folders(reports))]:
        prose = _prose(path.read_text(encoding="utf-8"))
        assert "$" not in prose, (path, prose[prose.index("$") - 80: prose.index("$") + 20])
        assert not re.search(r"@(?!&#8288;)", prose), (path, re.findall(r".{40}@(?!&#8288;).{20}", prose)[:3])
    assert "@&#8288;course-staff" in (reports / "class-summary.md").read_text(encoding="utf-8")


def test_every_report_of_a_4_mb_answer_is_bounded_and_says_what_was_cut(batch):
    _, reports, printed = batch
    sizes = {str(p.relative_to(reports)): p.stat().st_size for p in reports.rglob("*") if p.is_file()}
    assert max(sizes.values()) < REPORT_BYTES, sorted(sizes.items(), key=lambda kv: -kv[1])[:3]
    assert len(printed.encode()) < REPORT_BYTES
    hostile = json.loads((_report_folders(reports)[1] / "report.json").read_text(encoding="utf-8"))
    assert "characters cut ...]" in hostile["invariants"][0]["reason"], hostile["invariants"][0]["reason"][:300]


def test_a_report_writer_that_fails_is_one_students_gate_error_and_the_batch_goes_on(tmp_path, monkeypatch):
    """A writer's fault (here results.json's, on the second submission) is that submission's gate error, in its report.json and its
    batch line; its other reports are written; the third submission is graded and the class summary written."""
    from invariants.gate import reports as R

    writer = R.to_gradescope

    def failing(result, **kwargs):
        if "SUM" in result.submission["source"]:
            raise ValueError("could not convert string to float: '1.2.3'")
        return writer(result, **kwargs)

    monkeypatch.setattr(R, "to_gradescope", failing)
    code, reports, printed = _batch_of_three(tmp_path)
    folders = _report_folders(reports)
    records = [json.loads((f / "report.json").read_text(encoding="utf-8")) for f in folders]
    assert [r["verdict"] for r in records] == ["passed", "gate_error", "passed"] and code == 4, [r["reason"] for r in records]
    assert records[1]["reason"].startswith("the gate failed writing results.json: ValueError") and "before that, failed" in records[1]["reason"]
    assert {"junit.xml", "summary.md"} <= {p.name for p in folders[1].iterdir()} and not (folders[1] / "results.json").exists()
    assert all((f / "results.json").exists() for f in (folders[0], folders[2]))
    assert (reports / "class-summary.csv").exists() and "gate_error" in printed


def test_one_quoted_value_is_capped_with_what_was_cut():
    from invariants.gate.text import QUOTED_CHARS, quoted

    text = "head" + "x" * (4 << 20) + "tail"
    capped = quoted(text)
    assert capped.startswith("head") and capped.endswith("tail") and f"[... {len(text) - QUOTED_CHARS} characters cut ...]" in capped
    assert len(capped) < QUOTED_CHARS + 50 and quoted("short") == "short"
