"""A command whose standard output's reader leaves early (`invariants-card --list | head -1`) ends quietly: no traceback, no
message, status 0 for a list and the verdict's own status for a grading."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

FIXTURES = Path(__file__).parent / "fixtures"
COMMANDS = {  # what the console scripts run (pyproject's [project.scripts]), and python -m invariants
    "invariants-card --list": ("from invariants.accounting.cli import main", ["--list"]),
    "invariants-gate --list": ("from invariants.gate.cli import main", ["--list"]),
    "python -m invariants": ("from invariants.__main__ import main", []),
}


def _with_the_reader_gone(code, args, **options):
    """Run `code`'s main(args) as its console script does, its standard output a pipe whose reader closed it before a word came."""
    script = f"import sys\n{code}\nsys.exit(main())"
    done = subprocess.Popen([sys.executable, "-c", script, *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **options)
    done.stdout.close()
    try:
        stderr = done.stderr.read()
        return done.wait(timeout=120), stderr
    finally:
        done.kill()


@pytest.mark.parametrize("command", COMMANDS)
def test_a_list_into_a_pipe_closed_early_ends_quietly_with_status_0(command):
    status, stderr = _with_the_reader_gone(*COMMANDS[command], env={**os.environ, "GATE_SECRET": "x"})
    assert (status, stderr) == (0, ""), stderr


def test_a_grading_into_a_pipe_closed_early_keeps_its_verdict(tmp_path):
    broken = tmp_path / "broken.py"
    broken.write_text("def layer_norm(x:\n")
    args = [str(broken), "-a", str(FIXTURES / "assignments" / "hostile.toml"), "-o", str(tmp_path / "out"), "--seed", "1"]
    status, stderr = _with_the_reader_gone("from invariants.gate.cli import main", args)
    assert (status, stderr) == (3, ""), stderr  # not gradable, said in its reports
    assert (tmp_path / "out" / "report.json").exists()
