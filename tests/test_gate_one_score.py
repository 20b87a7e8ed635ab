"""One verdict and one score per submission, computed once (GradeResult.score) and read by every writer.

- For each verdict (passed, failed, not gradable, gate error), every report gives the figure GradeResult.score
  gives: report.json, results.json (its score and its tests'), summary.md, junit.xml, the terminal, the batch's
  line, class-summary.csv and .md, and the HTML class report (its table and its histogram). A submission that
  is not gradable, or met a gate error, has no score anywhere, even where some invariants ran and passed.
- A verdict other than "failed" leads every report with its reason, and no likely bug is drawn from what a
  crash caused: a failure that a lost worker ended (an exit, a hang, a segfault) is marked so (InvariantResult.lost),
  as data, and is no evidence of a bug.

The submissions are tests/fixtures/hostile's layer_norm files, graded against two layer_norm laws and a softmax law
they do not provide (so a correct layer_norm is "not gradable" with 2 of 3 points run and passed), with short limits.
"""

from __future__ import annotations

import csv
import json
import re
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from invariants.gate import grade as grading
from invariants.gate import stages
from invariants.gate.cli import main
from invariants.gate.config import load_assignment
from invariants.gate.reports import to_terminal, write_reports
from invariants.gate.result import FAILED, GATE_ERROR, NOT_GRADABLE, PASSED
from invariants.htmlreport import batch_html
from invariants.htmlreport.inputs import load_batch, score_histogram

FIXTURES = Path(__file__).parent / "fixtures"
HOSTILE = FIXTURES / "hostile"
SECRET_ENV = "INVARIANTS_TEST_ONE_SCORE_SECRET"
SECRET = "one score, computed once"
SOFTMAX = '''

def softmax(x, axis=-1):
    e = np.exp(x - x.max(axis=axis, keepdims=True))
    return e / e.sum(axis=axis, keepdims=True)
'''
COHORT = {  # submission: (its text, the verdict it gets)
    "passed.py": (HOSTILE / "good.py", SOFTMAX, PASSED),
    "failed.py": (HOSTILE / "wrong_shape.py", SOFTMAX, FAILED),
    "not_gradable.py": (HOSTILE / "good.py", "", NOT_GRADABLE),  # no softmax: its two layer_norm laws run and pass
    "gate_error.py": (HOSTILE / "good.py", SOFTMAX, GATE_ERROR),  # every law passes, then the gate fails (gate_fails below)
}


def _assignment_text():
    text = (FIXTURES / "assignments" / "hostile.toml").read_text()
    laws = 'select = ["norms.layer_norm_known_values", "norms.layer_norm_affine"]'
    assert laws in text
    return text.replace(laws, laws[:-1] + ', "softmax.softmax_shift_invariance"]')


@pytest.fixture(scope="module")
def partial(tmp_path_factory):
    """The hostile fixtures' assignment plus a softmax law: a layer_norm-only submission is not gradable."""
    path = tmp_path_factory.mktemp("assignment") / "partial.toml"
    path.write_text(_assignment_text())
    return path


@pytest.fixture
def gate_fails(monkeypatch):
    """The gate fails on gate_error.py once its verdict is made (every law has run and passed): a gate error, in process."""
    decide = stages.decide

    def failing(rows, submission, *args):
        decided = decide(rows, submission, *args)
        if Path(submission["source"]).name == "gate_error.py":
            raise RuntimeError("the gate's own fault, after every invariant ran")
        return decided

    monkeypatch.setattr(stages, "decide", failing)


# -- each writer's figure: a number, or None where it gives no score ----------------------------------


def _number(text):
    return None if text in ("", "no score") else float(text)


def _from_report_json(folder):
    return json.loads((folder / "report.json").read_text())["score"]


def _from_results_json(folder):
    """Gradescope's: its score, which its tests' points add up to; without a grade both are 0 and the output says "no score"."""
    data = json.loads((folder / "results.json").read_text())
    tests = sum(t["score"] for t in data["tests"])
    if tests != data["score"]:
        return f"score {data['score']:g}, its tests' points {tests:g}"
    return None if "no score" in data["output"] and data["score"] == 0 else data["score"]


def _from_summary_md(folder):
    title = (folder / "summary.md").read_text().splitlines()[0]
    return _number(re.search(r"— (no score|([\d.]+) / [\d.]+ points)$", title).group(2) or "")


def _from_junit(folder):
    properties = {p.get("name"): p.get("value") for p in ET.parse(folder / "junit.xml").iter("property")}
    return _number(properties.get("score", ""))


def _from_terminal(text):
    verdict = [line for line in text.splitlines() if line.startswith("verdict: ")][-1]
    return _number(re.search(r"; (?:no score|score ([\d.]+)/[\d.]+)", verdict).group(1) or "")


BATCH_LINE = re.compile(r"^(\w+)\s+(no score|([\d.]+)/[\d.]+)\s+(\S+): ")


def _from_batch_lines(stdout):
    return {m.group(4): _number(m.group(3) or "") for m in map(BATCH_LINE.match, stdout.splitlines()) if m}


def _from_class_csv(out):
    return {row["submission"]: _number(row["score"]) for row in csv.DictReader((out / "class-summary.csv").open())}


def _from_class_md(out):
    rows = [line.split(" | ") for line in (out / "class-summary.md").read_text().splitlines() if line.startswith("| [")]
    return {re.match(r"\| \[(.*?)\]", cells[0]).group(1).replace("\\_", "_"): _number(re.match(r"(no score|([\d.]+) ?/ ?[\d.]+)$",
                                                                                             cells[2]).group(2) or "") for cells in rows}


def _from_html(out):
    """The class report's table, in the batch's order (by submission name), and the histogram's count of scored submissions."""
    page = batch_html(out)
    table = page[page.index('<table class="subs">'):]
    table = table[:table.index("</table>")]
    cells = re.findall(r'<td class="mono nowrap">([^<]*)</td>', table)
    names = [col.title for col in load_batch(out).columns]
    scores = {Path(name).name: _number(re.match(r"(no score|([\d.]+) / [\d.]+)$", cell).group(2) or "")
              for name, cell in zip(names, cells, strict=True)}
    bars = sum(int(n) for n in re.findall(r"<title>\d+–\d+%: (\d+)</title>", page))
    assert bars == sum(score_histogram(load_batch(out))[0])
    return scores, bars


# -- the tests -------------------------------------------------------------------------------------


def test_every_writer_gives_the_one_score_for_every_verdict(partial, gate_fails, tmp_path, monkeypatch, capsys):
    cohort = tmp_path / "cohort"
    cohort.mkdir()
    for name, (source, extra, _) in COHORT.items():
        (cohort / name).write_text(source.read_text() + extra)
    results = {}
    grade = grading.grade

    def kept(path, *args, **kwargs):  # the batch grades in this process (one job): keep each GradeResult to compare with
        result = grade(path, *args, **kwargs)
        results[Path(path).name] = result
        return result

    monkeypatch.setattr(grading, "grade", kept)
    monkeypatch.setenv(SECRET_ENV, SECRET)
    out = tmp_path / "out"
    main(["--batch", str(cohort), "-a", str(partial), "-o", str(out), "-q", "--secret-env", SECRET_ENV])
    stdout = capsys.readouterr().out
    assert {name: r.verdict for name, r in results.items()} == {name: verdict for name, (_, _, verdict) in COHORT.items()}, \
        {name: r.reason for name, r in results.items()}
    assert sum(i.passed for i in results["not_gradable.py"].invariants) == 2, "2 of its 3 points ran and passed"

    figures = {}
    for name, result in results.items():
        folder = out / Path(name).stem
        figures[name] = {"report.json": _from_report_json(folder), "results.json": _from_results_json(folder),
                         "summary.md": _from_summary_md(folder), "junit.xml": _from_junit(folder), "terminal": _from_terminal(to_terminal(result))}
    for writer, read in (("batch line", _from_batch_lines(stdout)), ("class-summary.csv", _from_class_csv(out)),
                         ("class-summary.md", _from_class_md(out))):
        for name, figure in read.items():
            figures[name][writer] = figure
    html, scored = _from_html(out)
    for name, figure in html.items():
        figures[name]["html report"] = figure
    assert all(len(seen) == 9 for seen in figures.values()), figures
    split = {f"{name} ({results[name].verdict})": seen for name, seen in figures.items() if len(set(seen.values())) > 1}
    assert not split, f"the writers give one submission different scores: {split}"
    expected = {name: r.score for name, r in results.items()}
    wrong = {f"{name} in {writer}": figure for name, seen in figures.items() for writer, figure in seen.items() if figure != expected[name]}
    assert not wrong, f"every writer gives GradeResult.score ({expected}); these differ: {wrong}"
    assert expected == {"passed.py": 3, "failed.py": 1, "not_gradable.py": None, "gate_error.py": None}, "no score without a grade"
    assert scored == sum(score is not None for score in expected.values()), "the histogram counts the scored submissions only"


CRASHES = ["os_exit_in_call.py", "exit_in_call.py", "segfault.py", "infinite_loop.py"]  # bounded: hostile.toml's 2 s a call, 3 losses


def _leads_with_reason(result, folder):
    """Where each report leads, for a result that is not "failed": [(report, its leading text)]; and every report's text."""
    summary = (folder / "summary.md").read_text()
    results = json.loads((folder / "results.json").read_text())
    report = json.loads((folder / "report.json").read_text())
    first_case = next(ET.parse(folder / "junit.xml").iter("testcase"))
    terminal = to_terminal(result)
    leads = {"report.json": list(report)[1:4] == ["verdict", "exit_code", "reason"] and report["reason"] == result.reason,
             "results.json output": results["output"].startswith("not gradable (exit 3): "),
             "results.json tests": results["tests"][0]["name"] == "The submission can be graded",
             "summary.md": [line for line in summary.splitlines()[1:] if line][0].startswith("> "),
             "junit.xml": first_case.get("classname") == "gate" and len(first_case) == 1 and first_case[0].tag == "error",
             "terminal": terminal.splitlines()[1].startswith("  not gradable (exit 3): ")}
    texts = {"summary.md": summary, "results.json": json.dumps(results), "junit.xml": (folder / "junit.xml").read_text(), "terminal": terminal}
    return leads, texts


@pytest.mark.parametrize("fixture", CRASHES, ids=[c.removesuffix(".py") for c in CRASHES])
def test_a_crash_that_is_not_gradable_leads_with_its_reason_and_no_likely_bug(fixture, partial, tmp_path):
    result = grading.grade(HOSTILE / fixture, load_assignment(partial), secret=SECRET)
    assert result.verdict == NOT_GRADABLE, result.reason
    write_reports(result, tmp_path)
    leads, texts = _leads_with_reason(result, tmp_path)
    assert not [name for name, text in texts.items() if "likely bug" in text], "no likely bug is drawn from what a crash caused"
    assert all(leads.values()), f"every report leads with the verdict's reason: {leads}"
    assert result.score is None


@pytest.mark.parametrize("fixture", ["os_exit_in_call.py", "exit_in_call.py", "memory_bomb.py", "segfault.py", "infinite_loop.py"],
                         ids=["os_exit_in_call", "exit_in_call", "memory_bomb", "segfault", "infinite_loop"])
def test_what_a_lost_worker_ended_is_marked_and_is_no_evidence_of_a_bug(fixture, tmp_path):
    """Graded "failed" (hostile.toml asks for layer_norm only), the failures are the crash's: each is marked lost, and none is a likely bug."""
    result = grading.grade(HOSTILE / fixture, load_assignment(FIXTURES / "assignments" / "hostile.toml"), secret=SECRET)
    assert result.verdict == FAILED and result.score == 0, result.reason
    write_reports(result, tmp_path)
    texts = {p.name: p.read_text() for p in tmp_path.iterdir() if p.suffix in (".json", ".md", ".xml")}
    texts["terminal"] = to_terminal(result)
    assert not [name for name, text in texts.items() if "likely bug" in text], "a crash is no evidence of a bug"
    ended = [i for i in result.invariants if i.status == "error"]
    assert ended and all(i.lost for i in ended), [(i.name, i.status, i.lost) for i in result.invariants]
    written = {inv["name"]: inv["lost"] for inv in json.loads(texts["report.json"])["invariants"]}
    assert written == {i.name: i.lost for i in result.invariants}, "report.json keeps the mark"
