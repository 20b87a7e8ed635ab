"""Grade a folder of submissions in parallel: one report folder each and a class summary.

The summary has one row per submission (verdict, score, each invariant's status) and the
pass rate of every invariant across the cohort, as CSV and as Markdown.
"""

from __future__ import annotations

import csv
import io
import multiprocessing
import re
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

from gate import result as R

_STATE = {}


def submissions_in(folder):
    """The submissions in a folder, sorted: .py files, .zip files and sub-folders (hidden names skipped)."""
    entries = []
    for path in sorted(Path(folder).iterdir()):
        if path.name.startswith((".", "_")):
            continue
        if path.is_dir() or path.suffix in (".py", ".zip"):
            entries.append(path)
    return entries


def report_names(paths):
    """A unique, filesystem-safe folder name per submission."""
    names, used = [], set()
    for path in paths:
        base = re.sub(r"[^A-Za-z0-9_.-]", "_", path.stem if path.is_file() else path.name) or "submission"
        name, n = base, 1
        while name in used:
            n += 1
            name = f"{base}-{n}"
        used.add(name)
        names.append(name)
    return names


def _grade_one(job):
    """In a pool process: grade one submission, write its reports, return its summary row."""
    from gate.cli import grade_and_report

    path, out_dir, options = job
    result, _ = grade_and_report(path, out_dir, options, state=_STATE)
    return {
        "submission": Path(path).name, "report": Path(out_dir).name, "verdict": result.verdict, "score": result.score,
        "max_score": result.max_score, "seconds": result.seconds, "reason": result.reason,
        "statuses": {inv.name: inv.status for inv in result.invariants},
    }


def grade_folder(paths, out_dir, options, *, jobs=1):
    """Grade every path (in parallel with jobs > 1); the summary rows, in the paths' order."""
    out = Path(out_dir)
    work = [(str(p), str(out / name), options) for p, name in zip(paths, report_names(paths), strict=True)]
    if jobs <= 1:
        return [_grade_one(job) for job in work]
    with ProcessPoolExecutor(max_workers=jobs, mp_context=multiprocessing.get_context("spawn")) as pool:
        return list(pool.map(_grade_one, work))


def pass_rates(rows):
    """[(invariant, passed, graded)] in the assignment's order."""
    names = list(dict.fromkeys(name for row in rows for name in row["statuses"]))
    return [(n, sum(row["statuses"].get(n) == "passed" for row in rows), sum(n in row["statuses"] for row in rows)) for n in names]


def summary_csv(rows):
    names = [n for n, _, _ in pass_rates(rows)]
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    writer.writerow(["submission", "verdict", "score", "max_score", "reason", *names])
    for row in rows:
        writer.writerow([row["submission"], row["verdict"], f"{row['score']:g}", f"{row['max_score']:g}", row["reason"],
                         *(row["statuses"].get(n, "") for n in names)])
    return buffer.getvalue()


def pass_rates_csv(rows):
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    writer.writerow(["invariant", "passed", "graded", "pass_rate"])
    for name, passed, graded in pass_rates(rows):
        writer.writerow([name, passed, graded, f"{passed / graded:.3f}" if graded else ""])
    return buffer.getvalue()


def summary_markdown(rows, assignment_name):
    from gate.reports import VERDICT_WORDS, _cell

    counts = {v: sum(r["verdict"] == v for r in rows) for v in VERDICT_WORDS}
    lines = [f"## Class summary: {_cell(assignment_name)}", "",
             f"{len(rows)} submissions: " + ", ".join(f"{n} {VERDICT_WORDS[v]}" for v, n in counts.items() if n) + ".", "",
             "| Submission | Verdict | Score | Reason |", "|---|---|---|---|"]
    lines += [f"| [{_cell(r['submission'])}]({r['report']}/summary.md) | {VERDICT_WORDS[r['verdict']]} | "
              f"{r['score']:g} / {r['max_score']:g} | {_cell(r['reason'])} |" for r in rows]
    lines += ["", "### Pass rate of each invariant", "", "| Invariant | Passed | Rate |", "|---|---|---|"]
    for name, passed, graded in sorted(pass_rates(rows), key=lambda t: (t[1] / t[2] if t[2] else 0, t[0])):
        lines.append(f"| `{name}` | {passed} / {graded} | {100 * passed / graded:.0f}% |" if graded else f"| `{name}` | 0 / 0 | |")
    return "\n".join(lines) + "\n"


def write_summary(rows, out_dir, assignment_name):
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    paths = {"class-summary.csv": summary_csv(rows), "pass-rates.csv": pass_rates_csv(rows),
             "class-summary.md": summary_markdown(rows, assignment_name)}
    for name, text in paths.items():
        (out / name).write_text(text, encoding="utf-8")
    return [out / name for name in paths]


def batch_exit_code(rows):
    """0 when every submission got a verdict; 4 when the gate failed on any."""
    return R.EXIT_CODES[R.GATE_ERROR] if any(r["verdict"] == R.GATE_ERROR for r in rows) else 0
