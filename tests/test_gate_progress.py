"""Progress while the gate grades: on a terminal only, per invariant of one submission and per submission of a batch."""

from __future__ import annotations

import io
import re
import sys
import types
from pathlib import Path

import pytest

from invariants.gate import batch, cli
from invariants.gate.cli import main

FIXTURES = Path(__file__).parent / "fixtures"
ASSIGNMENT = FIXTURES / "assignments" / "hostile.toml"


class _Terminal(io.StringIO):
    def isatty(self):
        return True


@pytest.mark.parametrize("where", ["terminal", "ci", "pipe", "quiet"])
def test_progress_is_a_line_in_place_on_a_terminal_and_whole_lines_in_a_log(where, tmp_path, monkeypatch):
    stderr = _Terminal() if where in ("terminal", "ci") else io.StringIO()
    monkeypatch.setattr(sys, "stderr", stderr)
    monkeypatch.delenv("CI", raising=False)
    monkeypatch.setattr(cli, "LOG_EVERY_SECONDS", 0)  # every line, here
    if where == "ci":
        monkeypatch.setenv("CI", "true")
    quiet = ["-q"] if where == "quiet" else []
    assert main([str(FIXTURES / "hostile" / "good.py"), "-a", str(ASSIGNMENT), "-o", str(tmp_path), *quiet]) == 0
    shown = stderr.getvalue()
    if where == "terminal":
        assert "[1/2] norms.layer_norm_known_values: " in shown and "[2/2] norms.layer_norm_affine: " in shown, shown
        assert re.search(r"\d+ s left of the run's 60 s", shown) and shown.endswith("\r\x1b[K"), shown
    elif where == "quiet":
        assert shown == "", shown
    else:
        lines = shown.splitlines()
        assert [line.split(":")[:2] for line in lines] == [["invariants-gate", " [1/2] norms.layer_norm_known_values"],
                                                           ["invariants-gate", " [2/2] norms.layer_norm_affine"]], shown
        assert "\r" not in shown and "\x1b" not in shown and re.search(r"\d+ s left of the run's 60 s\n$", shown), shown


def test_a_log_gets_a_progress_line_at_most_every_ten_seconds(tmp_path, monkeypatch):
    monkeypatch.setattr(sys, "stderr", io.StringIO())
    clock = iter([0.0, 4.0, 9.9, 10.0, 12.0, 25.0])
    monkeypatch.setattr(cli, "time", types.SimpleNamespace(monotonic=lambda: next(clock)))
    progress = cli._Progress()
    for n in range(6):
        progress(f"step {n}")
    assert sys.stderr.getvalue() == "invariants-gate: step 0\ninvariants-gate: step 3\ninvariants-gate: step 5\n"


def test_a_batch_reports_each_submission_graded(tmp_path, monkeypatch):
    monkeypatch.setattr(batch, "_grade_one", lambda job: {"path": job[0]})
    ticks = []
    rows = batch.grade_folder([tmp_path / "a.py", tmp_path / "b.py", tmp_path / "c.py"], tmp_path, {}, progress=lambda *t: ticks.append(t))
    assert [r["path"] for r in rows] == [str(tmp_path / n) for n in ("a.py", "b.py", "c.py")]
    assert ticks == [(1, 3), (2, 3), (3, 3)]


def test_a_hidden_invariant_runs_as_hidden_n_on_the_terminal(tmp_path, monkeypatch):
    hidden = ASSIGNMENT.read_text().replace('select = ["norms.layer_norm_known_values", "norms.layer_norm_affine"]',
                                            'select = ["norms.layer_norm_known_values"]\n\n[[invariants]]\n'
                                            'select = ["norms.layer_norm_affine"]\nvisibility = "after_due_date"')
    assert "after_due_date" in hidden
    (tmp_path / "hidden.toml").write_text(hidden)
    monkeypatch.setattr(sys, "stderr", _Terminal())
    monkeypatch.delenv("CI", raising=False)
    assert main([str(FIXTURES / "hostile" / "good.py"), "-a", str(tmp_path / "hidden.toml"), "-o", str(tmp_path / "out")]) == 0
    shown = sys.stderr.getvalue()
    assert "[2/2] hidden.1: " in shown and "layer_norm_affine" not in shown, shown


def test_what_cannot_be_graded_says_why_before_any_row(tmp_path, capsys):
    broken = tmp_path / "broken.py"
    broken.write_text("def layer_norm(x:\n")
    assert main([str(broken), "-a", str(ASSIGNMENT), "-o", str(tmp_path / "out"), "--seed", "1"]) == 3
    lines = capsys.readouterr().out.splitlines()
    assert lines[1].startswith("  not gradable (exit 3): SyntaxError at broken.py:1") and "NOT RUN" in lines[2], lines
