"""Reports written from one GradeResult: JSON, JUnit XML, Gradescope results.json, Markdown, a terminal table.

The JSON report is the staff's full record. The others are what students may see: hidden
invariants appear there by count only, and wherever their names would be quoted (a verdict's
reason) as hidden.N, numbered as in junit.xml (Gradescope, which enforces visibility itself,
gets their tests with their visibility), unless show_hidden is set. The student's reports
lead with the likely bug of a failed verdict (invariants.diagnosis.likely_bugs), read from the shown invariants
whose answers failed them (what a lost worker ended is no evidence); any other verdict leads with its reason.
Every report reads the one score, GradeResult.score: none for a submission that is not gradable or met a gate error.

Submission text is escaped for the format it lands in (invariants.gate.text): printable() on a terminal,
xml_text() in XML, md_cell()/md_code()/_fenced() in Markdown, and neutralise() over each file.
"""

from __future__ import annotations

import json
import re
import traceback
import xml.etree.ElementTree as ET
from pathlib import Path

from invariants.diagnosis import likely_bugs
from invariants.gate import result as R
from invariants.gate.text import md_cell as _cell
from invariants.gate.text import md_code, neutralise, neutralise_tree, one_line, printable, quoted, xml_text
from invariants.repro import repro_stem, save_repro

FILES = {"json": "report.json", "junit": "junit.xml", "gradescope": "results.json", "markdown": "summary.md"}
FINGERPRINTS = "fingerprints.json"  # written beside report.json: what `--merge` compares across a cohort
MARK = {"passed": "✅", "failed": "❌", "error": "⚠️", "missing": "⛔", "skipped": "⏭️", "not_run": "⏭️", "vacuous": "🕳️", "voided": "🚫"}
WORD = {"passed": "PASS", "failed": "FAIL", "error": "ERROR", "missing": "MISSING", "skipped": "SKIPPED", "not_run": "NOT RUN",
        "vacuous": "VACUOUS", "voided": "VOIDED"}
FAILURES = ("failed", "vacuous", "voided")  # JUnit <failure>: the answers came, and they earn nothing; the rest are <error>
REVIEW = ("forbidden_api", "blocked_import", "copied_code")
VERDICT_WORDS = {R.PASSED: "passed", R.FAILED: "failed", R.NOT_GRADABLE: "not gradable", R.GATE_ERROR: "gate error"}


def _shown(result, show_hidden):
    """(invariants to show by name, hidden ones summarised)."""
    if show_hidden:
        return list(result.invariants), []
    return [i for i in result.invariants if i.visibility == "visible"], [i for i in result.invariants if i.visibility != "visible"]


def _points(x):
    return f"{x:g}"


def _score_text(result):
    if result.score is None:
        return "no score: nothing is graded until this is fixed"
    return f"score {_points(result.score)}/{_points(result.max_score)}"


def hide_names(result, show_hidden):
    """text -> text with each hidden invariant's name written hidden.N, as junit.xml numbers them (unchanged with show_hidden)."""
    hidden = [] if show_hidden else _shown(result, False)[1]
    if not hidden:
        return lambda text: text
    number = {inv.name: f"hidden.{n}" for n, inv in enumerate(hidden, 1)}
    names = re.compile(r"(?<![\w.])(" + "|".join(map(re.escape, sorted(number, key=len, reverse=True))) + r")(?![\w])")
    return lambda text: names.sub(lambda m: number[m.group(1)], text)


def headline(result, *, show_hidden=False):
    """The verdict in one line: what it is, why, and the score (none for a result that is not graded)."""
    return hide_names(result, show_hidden)(printable(" ".join(f"{VERDICT_WORDS[result.verdict]} (exit {result.exit_code}): "
                                                           f"{result.reason}; {_score_text(result)}".split())))


def leads_with_reason(result):
    """Whether a report opens with the verdict's reason: every verdict but "failed", whose likely bug leads instead."""
    return result.verdict != R.FAILED


def diagnosis(result, *, show_hidden=False):
    """A failed verdict's likely bug (invariants.diagnosis.likely_bugs) from the invariants shown (a hidden one is no evidence a student
    may see), less those a lost worker ended (a crash, a hang: no evidence of a bug); none for another verdict, which its reason explains."""
    if leads_with_reason(result):
        return []
    return likely_bugs((i.name, i.status, i.reason, i.measured) for i in _shown(result, show_hidden)[0] if not i.lost)


# -- JSON ----------------------------------------------------------------------------------------


def to_json(result):
    return json.dumps(neutralise_tree(result.as_dict()), indent=2, ensure_ascii=False) + "\n"


# -- JUnit XML -------------------------------------------------------------------------------------


def to_junit(result, *, show_hidden=False):
    """failure = a wrong answer; error = could not be evaluated (raised, crashed, missing, skipped, not run)."""
    shown, hidden = _shown(result, show_hidden)
    cases = []  # a result without a score leads with its verdict's reason
    if result.verdict == R.NOT_GRADABLE:
        cases.append(("gate", "gate.submission_is_gradable", "error", result.reason, result.reason, 0.0))
    if result.verdict == R.GATE_ERROR:
        cases.append(("gate", "gate.gate_error", "error", result.reason, result.output.get("gate_traceback", result.reason), 0.0))
    for inv in shown:
        kind = None if inv.status == "passed" else "failure" if inv.status in FAILURES else "error"
        cases.append((f"invariants.{inv.component}", inv.name, kind, f"{inv.status}: {inv.reason}", inv.details or inv.reason, inv.seconds))
    for n, inv in enumerate(hidden, 1):
        kind = None if inv.status == "passed" else "failure" if inv.status in FAILURES else "error"
        cases.append(("invariants.hidden", f"hidden.{n}", kind, f"hidden invariant: {inv.status}", "details are hidden", inv.seconds))
    if result.verdict == R.FAILED and result.reason.startswith("every invariant passed"):
        cases.append(("gate", "gate.forbidden_apis", "failure", result.reason, _evidence_text(result), 0.0))
    suites = ET.Element("testsuites", name="invariants-gate")
    suite = ET.SubElement(suites, "testsuite", name=f"{result.assignment['name']}: {Path(result.submission['source']).name}",
                          tests=str(len(cases)), failures=str(sum(c[2] == "failure" for c in cases)),
                          errors=str(sum(c[2] == "error" for c in cases)), skipped="0", time=f"{result.seconds:.2f}",
                          timestamp=result.started_at)
    props = ET.SubElement(suite, "properties")
    score = [("score", _points(result.score))] if result.score is not None else []
    for key, value in (("verdict", result.verdict), *score, ("max_score", _points(result.max_score)),
                       ("submission_sha256", result.submission.get("sha256", "")), ("seed", json.dumps(result.seed))):
        ET.SubElement(props, "property", name=key, value=str(value))
    for classname, name, kind, message, text, seconds in cases:
        case = ET.SubElement(suite, "testcase", classname=classname, name=name, time=f"{seconds:.2f}")
        if kind:
            element = ET.SubElement(case, kind, message=message.splitlines()[0][:500] if message else "", type=kind)
            element.text = text
    ET.SubElement(suite, "system-out").text = result.output.get("stdout", "")
    ET.SubElement(suite, "system-err").text = result.output.get("stderr", "")
    suites.set("tests", suite.get("tests"))
    suites.set("failures", suite.get("failures"))
    suites.set("errors", suite.get("errors"))
    public = hide_names(result, show_hidden)
    for element in suites.iter():  # every text and attribute: shown as printable, and only characters XML 1.0 allows
        element.text = element.text and xml_text(printable(public(element.text)))
        for key, value in list(element.attrib.items()):
            element.set(key, xml_text(printable(public(value))))
    ET.indent(suites)
    return neutralise('<?xml version="1.0" encoding="utf-8"?>\n' + ET.tostring(suites, encoding="unicode") + "\n")


def _evidence_text(result):
    return "\n".join(f"{e['kind']}: {e['name']} at {e['where']} ({e['detail']}; {e['source']})" for e in result.evidence) or "none"


# -- Gradescope ----------------------------------------------------------------------------------


def to_gradescope(result, *, show_hidden=False):
    """Gradescope's results.json: score (0 when not graded, and every test's), max_score, execution_time, output (the likely bug
    or the verdict's reason first), tests[] (a result without a score leads with its reason)."""
    public = hide_names(result, show_hidden)
    tests = []
    if result.score is None:
        tests.append({"name": "The submission can be graded", "score": 0, "max_score": 0, "status": "failed",
                      "output": public(result.reason), "visibility": "visible"})
    for inv in result.invariants:
        output = f"{inv.statement}\n\n{inv.details or inv.reason}" if not inv.passed else f"{inv.statement}\n\n{inv.reason}"
        tests.append({"name": inv.name, "score": inv.score if result.score is not None else 0, "max_score": inv.max_score,
                      "status": "passed" if inv.passed else "failed",
                      "output": printable(public(output) if inv.visibility == "visible" else output), "visibility": inv.visibility})
    evidence = [e for e in result.evidence if e["kind"] in REVIEW]
    if evidence:
        tests.append({"name": "Forbidden APIs, the course's code and copied code (for review)", "score": 0, "max_score": 0,
                      "status": "failed", "output": _evidence_text(result), "visibility": "visible"})
    return json.dumps(neutralise_tree({
        "score": result.score if result.score is not None else 0, "max_score": result.max_score, "execution_time": round(result.seconds),
        "output": "\n".join([*map(printable, diagnosis(result, show_hidden=show_hidden)), headline(result, show_hidden=show_hidden)]),
        "output_format": "text", "test_output_format": "text", "test_name_format": "text",  # shown as written: no HTML or Markdown
        "visibility": "visible", "stdout_visibility": "hidden", "tests": tests,
    }), indent=2, ensure_ascii=False) + "\n"


# -- Markdown ------------------------------------------------------------------------------------


def _fenced(text, info="text"):
    """A fenced code block showing the text as printable: its fence longer than any run of backticks inside."""
    text = printable(text)
    longest = max((len(run) for run in text.split("\n") for run in _backtick_runs(run)), default=0)
    fence = "`" * max(3, longest + 1)
    return f"{fence}{info}\n{text.rstrip()}\n{fence}"


def _backtick_runs(line):
    run, runs = 0, []
    for ch in line + " ":
        if ch == "`":
            run += 1
        elif run:
            runs.append("`" * run)
            run = 0
    return runs


def to_markdown(result, *, show_hidden=False):
    shown, hidden = _shown(result, show_hidden)
    public = hide_names(result, show_hidden)
    sub = result.submission
    mark = {R.PASSED: "✅", R.FAILED: "❌", R.NOT_GRADABLE: "⛔", R.GATE_ERROR: "🛠️"}[result.verdict]
    points = f"{_points(result.score)} / {_points(result.max_score)} points" if result.score is not None else "no score"
    reason = [f"> {_cell(public(result.reason))}", "",
              *([] if result.score is not None else ["No score: nothing is graded until this is fixed (report.json keeps what ran).", ""])]
    lines = [
        f"## {mark} {_cell(result.assignment['name'])}: {VERDICT_WORDS[result.verdict]} — {points}",
        "",
        *(reason if leads_with_reason(result) else _markdown_diagnosis(diagnosis(result, show_hidden=show_hidden))),
        f"Submission {md_code(Path(sub['source']).name)} (sha256 {sub.get('sha256', '?')[:12]}), backend {_cell(sub.get('backend') or '?')}, "
        f"{result.assignment['dtype']} on {result.assignment['device']}, hypothesis profile {result.assignment['profile']}, "
        f"seed {_seed_text(result.seed)}.",
        "",
        *([] if leads_with_reason(result) else reason),
    ]
    if shown:
        lines += ["| | Invariant | Points | Result |", "|---|---|---|---|"]
        lines += [f"| {MARK[i.status]} | `{i.name}` | {_points(i.score)} / {_points(i.max_score)} | {_cell(public(i.reason))} |" for i in shown]
        lines.append("")
    if hidden:
        ok = sum(i.passed for i in hidden)
        lines += [f"Hidden invariants: {ok} of {len(hidden)} passed.", ""]
    failures = [i for i in shown if not i.passed and i.details]
    if failures:
        lines += ["### What went wrong", ""]
        for inv in failures:
            command = md_code(f"python {repro_stem(inv.name)}.py {Path(sub['source']).name}")
            replay = [f"Replay it without the suite: {command} "
                      "(beside this report; it needs numpy, and torch for a torch submission).", ""] if inv.repro else []
            lines += [f"<details><summary>{MARK[inv.status]} <code>{inv.name}</code>: {_cell(inv.statement)}</summary>", "",
                      _fenced(public(inv.details)), "", *replay, "</details>", ""]
    if result.evidence:
        lines += ["### Evidence for review", "", "Imports of the course's own code, uses of APIs the assignment forbids and code "
                  "that matches the reference; a person decides what they mean.", "", "| Kind | Name | Where | Detail | Found by |",
                  "|---|---|---|---|---|"]
        lines += [f"| {_cell(e['kind'])} | {md_code(e['name'], cell=True)} | {_cell(e['where'])} | {_cell(e['detail'])} | {_cell(e['source'])} |"
                  for e in result.evidence]
        lines.append("")
    if sub.get("declarations"):
        lines += [f"Declared conventions: {_cell(', '.join(f'{k} = {v!r}' for k, v in sub['declarations'].items()))}.", ""]
    if (result.similarity or {}).get("reference"):
        lines += [f"Similarity of the code to the reference: {_cell(_similarity_text(result))}.", ""]
    if result.excluded:
        lines += ["<details><summary>Selected but not gradable by the gate</summary>", ""]
        lines += [f"- `{e['name']}`: {_cell(e['reason'])}" for e in result.excluded]
        lines += ["", "</details>", ""]
    if result.protections:
        missing = result.sandbox.get("missing", [])
        title = f"Sandbox ({result.sandbox.get('tool', '?')}{'; NOT in effect: ' + ', '.join(missing) if missing else ''})"
        lines += [f"<details><summary>{_cell(title)}</summary>", "", "| Protection | In effect |", "|---|---|"]
        lines += [f"| {k} | {_cell(v)} |" for k, v in result.protections.items()]
        lines += ["", "</details>", ""]
    for stream in ("stdout", "stderr"):
        if result.output.get(stream):
            lines += [f"<details><summary>Submission {stream} ({result.output[f'{stream}_bytes']} bytes)</summary>", "",
                      _fenced(result.output[stream]), "", "</details>", ""]
    return neutralise("\n".join(lines))


def _markdown_diagnosis(lines):
    """The likely bug as a list (its evidence nested), ahead of everything else in summary.md."""
    if not lines:
        return []
    items = [("  " if line.startswith(" ") else "") + f"- {_cell(line)}" for line in lines]
    return ["### First, the likely bug", "", *items, ""]


def _similarity_text(result):
    sim = result.similarity
    score = sim["reference"]["score"]
    limits = [f"flagged from {100 * sim['flag_above']:.0f}%"] + ([f"failed from {100 * sim['fail_above']:.0f}%"] if sim.get("fail_above") else [])
    return f"{100 * score:.0f}% ({', '.join(limits)}; winnowing, k = {sim['k']} tokens)"


def _seed_text(seed):
    """The seed and what it rests on: the course secret (a grade), --seed (a reproduction) or a fresh draw (a preview)."""
    words = {"secret": f"from the course secret {seed.get('secret_fingerprint')}", "fixed": "fixed with --seed: a reproduction",
             "random": "drawn for this preview: no course secret"}
    return f"{seed['value']} ({words[seed['mode']]})" if seed.get("mode") in words else "none (not graded)"


# -- terminal ------------------------------------------------------------------------------------


def to_terminal(result, *, show_hidden=False, details=True, max_detail_lines=30):
    shown, hidden = _shown(result, show_hidden)
    lines = [f"invariants-gate: {result.assignment['name']} — {Path(result.submission['source']).name}"]
    lead = [headline(result, show_hidden=show_hidden)] if leads_with_reason(result) else diagnosis(result, show_hidden=show_hidden)
    lines += [f"  {line}" for line in lead]
    width = max((len(i.name) for i in shown), default=10)
    for inv in shown:
        reason = inv.reason if len(inv.reason) <= 100 else inv.reason[:99] + "…"
        lines.append(f"  {WORD[inv.status]:<8}{_points(inv.score):>4}/{_points(inv.max_score):<4} {inv.name:<{width}}  {reason}")
    if hidden:
        lines.append(f"  hidden invariants: {sum(i.passed for i in hidden)} of {len(hidden)} passed")
    if details:
        for inv in (i for i in shown if not i.passed and i.details):
            body = printable(inv.details).splitlines()  # printable first: a line separator in it is text, not a line
            more = len(body) - max_detail_lines
            cut = body[:max_detail_lines] + ([f"... ({more} more lines in the reports)"] if more > 0 else [])
            lines += ["", f"--- {inv.name} ({WORD[inv.status]})", *cut]
    for e in result.evidence:
        lines.append(f"  evidence: {e['kind']} {e['name']} at {e['where']} ({e['detail']}; {e['source']})")
    if result.submission.get("declarations"):
        lines.append(f"  declared: {', '.join(f'{k} = {v!r}' for k, v in result.submission['declarations'].items())}")
    if (result.similarity or {}).get("reference"):
        lines.append(f"  similarity to the reference: {_similarity_text(result)}")
    if result.sandbox:
        missing = result.sandbox.get("missing", [])
        lines.append(f"  sandbox: {result.sandbox.get('detail', result.sandbox.get('tool'))}"
                     + (f"; NOT in effect: {', '.join(missing)}" if missing else ""))
    lines += ["", f"verdict: {headline(result, show_hidden=show_hidden)} [{result.seconds:.1f} s]"]
    return printable(hide_names(result, show_hidden)("\n".join(lines)) + "\n")


def report_failed(result, what, exc):
    """Make `result` a gate error because the gate could not write `what` (a report); the verdict it had stays in the reason."""
    before = f"{VERDICT_WORDS[result.verdict]}: {result.reason}"
    result.verdict = R.GATE_ERROR
    result.reason = f"the gate failed writing {what}: {type(exc).__name__}: {one_line(quoted(str(exc)))} (before that, {before})"
    result.output["gate_traceback"] = "".join(traceback.format_exception(exc))[-4000:]


def _rendered(result, writers):
    """({format: text}, {format: the exception}) of each writer run on its own: one that fails stops none of the others."""
    texts, faults = {}, {}
    for fmt, writer in writers.items():
        try:
            texts[fmt] = writer(result)
        except Exception as exc:  # noqa: BLE001 - a writer's fault is this submission's gate error, never the end of a batch
            faults[fmt] = exc
    return texts, faults


def write_reports(result, out_dir, formats=tuple(FILES), *, show_hidden=False):
    """Write the chosen formats into out_dir; the list of paths written.

    A writer that fails makes the result a gate error for this submission alone (report_failed: report.json says which
    writer and why), and every format is written again from that verdict; one that fails again is left unwritten.
    """
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    writers = {"json": to_json, "junit": lambda r: to_junit(r, show_hidden=show_hidden),
               "gradescope": lambda r: to_gradescope(r, show_hidden=show_hidden), "markdown": lambda r: to_markdown(r, show_hidden=show_hidden)}
    writers = {fmt: writers[fmt] for fmt in formats}
    texts, faults = _rendered(result, writers)
    if faults:
        fmt, exc = next(iter(faults.items()))
        report_failed(result, FILES[fmt], exc)
        texts, _ = _rendered(result, writers)
    written = []
    for fmt, text in texts.items():
        path = out / FILES[fmt]
        path.write_text(text, encoding="utf-8", errors="backslashreplace")  # a lone surrogate (a file name's bytes) as \udcxx
        written.append(path)
    if "json" in formats and result.fingerprints:
        (out / FINGERPRINTS).write_text(json.dumps(result.fingerprints, separators=(",", ":")) + "\n", encoding="utf-8")
    for inv in _shown(result, show_hidden)[0]:  # a hidden invariant's inputs stay hidden
        if inv.repro:
            written.append(save_repro(out, repro_stem(inv.name), neutralise(inv.repro), inv.repro_arrays))
    return written
