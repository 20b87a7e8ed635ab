"""What a report shows, read from its inputs: suite records (--invariants-json) or a gate batch folder.

Both become one Report: columns (implementations, or submissions), rows (invariants in the suite's
order), a cell per (row, column), and a Card per failure. A failure's parts (the example, the problem, hypothesis's
notes) are read from the record's fields, as the runner's Outcome has them; a record without them shows its text whole.
Nothing here parses a failure's words.
"""

from __future__ import annotations

import csv
import json
from dataclasses import dataclass, field
from pathlib import Path

from invariants.gate.reports import VERDICT_WORDS
from invariants.runner import FAILING as RUNNER_FAILING

SUITE_FORMAT = "transformer-invariants/suite-run"  # invariants.plugin.JSON_FORMAT
SUITE_VERSIONS = (1,)
GATE_SCHEMA_VERSIONS = (1, 2, 3)  # invariants.gate.result.SCHEMA_VERSION (2 adds the statuses vacuous and voided, similarity; 3 no score)
FAILING = (*RUNNER_FAILING, "vacuous", "voided")  # the statuses that get a card (the last two are the gate's: held, but earn nothing)
STATUS_ORDER = ("passed", "failed", "error", "vacuous", "voided", "missing", "skipped", "not_run")


class InputError(ValueError):
    """An input the report cannot be made from; the message names the file and what was expected."""


@dataclass(frozen=True)
class FailureText:
    """A failure report in its parts, as the record's fields give them."""

    headline: str = ""  # "<invariant>: <statement>"
    implementation: str = ""
    example: tuple = ()  # ((label, description), ...): the shrunk example
    problem: str = ""  # the violated assertion with its numbers (or, for a record without parts, its whole text)
    hint: str = ""
    notes: tuple = ()  # what follows the hint: hypothesis's own notes on the example (its @reproduce_failure line), a shrink note


def failure_parts(headline, implementation, fields, text, hint):
    """FailureText from a record's fields (example, problem, notes: invariants.plugin.FAILURE_FIELDS); without them, `text` whole."""
    if "problem" not in fields:
        return FailureText(headline, implementation, problem=(text or "").strip(), hint=hint)
    return FailureText(headline, implementation, tuple(tuple(pair) for pair in fields.get("example") or ()), fields["problem"], hint,
                       tuple(fields.get("notes") or ()))


@dataclass
class Card:
    id: str  # the HTML id, "card-<n>"
    column: int  # index into Report.columns
    invariant: str
    component: str
    status: str  # failed or error
    statement: str
    reason: str  # one line
    text: FailureText
    report: str  # the whole failure, as written
    hint: str
    repro_path: str = ""  # a runnable repro_<invariant>.py (the suite's --repro-dir, or one beside a gate report)
    repro_source: str = ""  # its text, when small enough to embed
    visibility: str = ""  # the gate's: visible or hidden (staff reports show both)


@dataclass
class Cell:
    status: str
    reason: str = ""
    card: str = ""  # the card's id, for a failure
    score: str = ""  # the gate's points, "3/3"


@dataclass
class Column:
    label: str  # short: the matrix header
    title: str  # long: the implementation or the submission's source
    facts: list = field(default_factory=list)  # [(name, value)] shown in its summary
    counts: dict = field(default_factory=dict)  # status -> invariants
    warning: str = ""  # why nothing ran (an implementation that did not load, a CUDA run without a GPU)
    verdict: str = ""  # the gate's
    score: float | None = None  # the report's (invariants.gate.result.GradeResult.score): None where the verdict carries none
    max_score: float | None = None
    reason: str = ""


@dataclass
class Report:
    kind: str  # "suite" or "batch"
    title: str
    subtitle: str
    columns: list
    rows: list  # invariant names, in the suite's order
    components: dict  # invariant -> component
    statements: dict  # invariant -> statement
    cells: dict  # (invariant, column index) -> Cell
    cards: list
    sources: list  # the input files, for the footer
    diagnoses: dict = field(default_factory=dict)  # column index -> [lines]: the likely bug (invariants.diagnosis)
    pairs: list | None = None  # a batch's submissions with alike code (Pair), as similar-pairs.csv has them; None without that file


@dataclass(frozen=True)
class Pair:
    """Two submissions whose code is alike (invariants.gate.batch.similar_pairs): how much of each the other has, and where."""

    a: str
    b: str
    a_column: int | None  # the submission's column, None when it is not in the report
    b_column: int | None
    share_of_a: float
    share_of_b: float
    spans: str  # "a.py:5-42 ~ b.py:4-41; ..."


def _read_json(path):
    try:
        return json.loads(Path(path).read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise InputError(f"{path}: no such file") from None
    except json.JSONDecodeError as exc:
        raise InputError(f"{path}: not JSON ({exc})") from None


def _suite_order():
    """{invariant: position} in the registry's order (component by component), and {invariant: component}."""
    from invariants.registry import all_invariants

    invariants = all_invariants()
    return {inv.name: i for i, inv in enumerate(invariants)}, {inv.name: inv for inv in invariants}


def _counts(statuses):
    """{status: how many}, the known statuses in STATUS_ORDER, then any other."""
    order = {s: i for i, s in enumerate(STATUS_ORDER)}
    present = sorted(set(statuses), key=lambda s: (order.get(s, len(order)), str(s)))
    return {s: statuses.count(s) for s in present}


def _short_label(record):
    target = record.get("target") or record.get("implementation") or "?"
    stem = Path(target.split(":")[0]).stem if target.split(":")[0].endswith(".py") else target
    return f"{stem} {record.get('dtype', '')}".strip() + (f" {record['device']}" if record.get("device") not in (None, "cpu") else "")


def _diagnosis(entries):
    """The likely bug (invariants.diagnosis.likely_bugs) for one column's entries ({invariant, status, reason, measured})."""
    from invariants.diagnosis import likely_bugs

    return [line.strip() for line in likely_bugs((e["invariant"], e["status"], e.get("reason", ""), e.get("measured")) for e in entries)]


def load_suite(paths, *, max_repro_bytes=16384):
    """A Report from one or more --invariants-json records: one column each, in the order given."""
    if not paths:
        raise InputError("no suite records given (write them with pytest --invariants-json PATH)")
    order, registry = _suite_order()
    columns, cells, cards, components, statements, diagnoses = [], {}, [], {}, {}, {}
    for c, path in enumerate(paths):
        record = _read_json(path)
        if not isinstance(record, dict) or record.get("format") != SUITE_FORMAT:
            raise InputError(f"{path}: not a suite record (expected \"format\": {SUITE_FORMAT!r}; write it with pytest --invariants-json)")
        if record.get("version") not in SUITE_VERSIONS:
            raise InputError(f"{path}: suite record version {record.get('version')!r}; this renderer reads {', '.join(map(str, SUITE_VERSIONS))}")
        entries = record.get("invariants") or []
        counts = _counts([e.get("status") for e in entries])
        declared = ", ".join(f"{k} = {v!r}" for k, v in (record.get("declared") or {}).items())
        facts = [("implementation", record.get("implementation", "")), ("profile", record.get("profile", "")),
                 ("examples run", f"{sum(e.get('examples', 0) for e in entries):,}")]
        if declared:
            facts.append(("declares", declared))
        facts.append(("record", Path(path).name))
        columns.append(Column(_short_label(record), record.get("implementation", str(path)), facts, counts, record.get("not_loaded") or ""))
        for e in entries:
            name = e["invariant"]
            inv = registry.get(name)
            components[name] = e.get("component") or (inv.component if inv else name.split(".")[0])
            statements[name] = e.get("statement") or (inv.statement if inv else "")
            cell = Cell(e["status"], e.get("reason", ""))
            if e["status"] in FAILING:
                cell.card = f"card-{len(cards)}"
                text = failure_parts(f"{name}: {statements[name]}", record.get("implementation", ""), e, e.get("report", ""),
                                     e.get("hint", ""))
                source = e.get("repro_source", "")
                cards.append(Card(cell.card, c, name, components[name], e["status"], statements[name], e.get("reason", ""), text,
                                  e.get("report", ""), text.hint or e.get("hint", ""), e.get("repro", ""),
                                  source if len(source.encode()) <= max_repro_bytes else ""))
            cells[(name, c)] = cell
        diagnoses[c] = _diagnosis(entries)
    rows = sorted({name for name, _ in cells}, key=lambda n: (order.get(n, len(order)), n))
    return Report("suite", "Invariant matrix", f"{len(columns)} run(s), {len(rows)} invariants", columns, rows, components,
                  statements, cells, cards, [str(p) for p in paths], diagnoses)


def gate_reports(folder):
    """[(folder name, report.json dict)] of a gate batch's output, in the batch's order (by submission name); or the one report in folder."""
    folder = Path(folder)
    if not folder.is_dir():
        raise InputError(f"{folder}: not a folder (give the -o folder of invariants-gate --batch)")
    if (folder / "report.json").is_file():
        found = [folder / "report.json"]
    else:
        found = sorted(folder.glob("*/report.json"))
    if not found:
        raise InputError(f"{folder}: no report.json in it or in its sub-folders (is it the -o folder of invariants-gate --batch?)")
    reports = []
    for path in found:
        data = _read_json(path)
        if not isinstance(data, dict) or data.get("schema_version") not in GATE_SCHEMA_VERSIONS or "invariants" not in data:
            raise InputError(f"{path}: not a gate report (expected schema_version {', '.join(map(str, GATE_SCHEMA_VERSIONS))} with invariants)")
        reports.append((path.parent, data))
    return sorted(reports, key=lambda t: Path(t[1]["submission"].get("source", t[0].name)).name)


def _points(x):
    return f"{x:g}"


def score_text(score, max_score):
    """'41 / 53', or 'no score' where the gate's report gives none (a submission that is not gradable, a gate error)."""
    return "no score" if score is None else f"{_points(score)} / {_points(max_score)}"


def load_batch(folder, *, max_repro_bytes=16384):
    """A Report from a gate batch folder (OUT/<submission>/report.json): one column per submission."""
    order, registry = _suite_order()
    reports = gate_reports(folder)
    columns, cells, cards, components, statements, diagnoses = [], {}, [], {}, {}, {}
    assignment = reports[0][1]["assignment"]
    for c, (where, data) in enumerate(reports):
        sub = data["submission"]
        name = Path(sub.get("source", where.name)).name
        invs = data["invariants"]
        counts = _counts([i["status"] for i in invs])
        facts = [("submission", f"{name} (sha256 {sub.get('sha256', '?')[:12]})"), ("backend", sub.get("backend") or "?"),
                 ("verdict", VERDICT_WORDS.get(data["verdict"], data["verdict"])), ("score", score_text(data["score"], data["max_score"]))]
        reference = (data.get("similarity") or {}).get("reference")
        if reference:
            facts.append(("like the reference", f"{reference['score']:.2f} (flagged above {data['similarity'].get('flag_above', '?')})"))
        facts.append(("report", f"{where.name}/report.json"))
        columns.append(Column(name, sub.get("source", name), facts, counts, "", data["verdict"], data["score"], data["max_score"],
                              data.get("reason", "")))
        for inv in invs:
            n = inv["name"]
            components[n] = inv.get("component") or n.split(".")[0]
            statements[n] = inv.get("statement", "")
            cell = Cell(inv["status"], inv.get("reason", ""), score=f"{_points(inv.get('score', 0))}/{_points(inv.get('max_score', 0))}")
            if inv["status"] in FAILING:
                cell.card = f"card-{len(cards)}"
                text = failure_parts(f"{n}: {statements[n]}", sub.get("source", name), inv.get("failure") or {},
                                     inv.get("details") or inv.get("reason", ""), inv.get("hint", ""))
                script = where / f"repro_{n.replace('.', '_')}.py"  # invariants.repro's name, should the gate write one
                source = script.read_text(encoding="utf-8") if script.is_file() and script.stat().st_size <= max_repro_bytes else ""
                cards.append(Card(cell.card, c, n, components[n], inv["status"], statements[n], inv.get("reason", ""), text,
                                  inv.get("details", ""), text.hint or inv.get("hint", ""), str(script) if script.is_file() else "",
                                  source, inv.get("visibility", "")))
            cells[(n, c)] = cell
        diagnoses[c] = _diagnosis([{"invariant": i["name"], "status": i["status"], "reason": i.get("reason", ""), "measured": i.get("measured", {})}
                                   for i in invs if not i.get("lost")])  # what a lost worker ended (a crash, a hang) is no evidence of a bug
    first_seen = {}
    for _, data in reports:
        for inv in data["invariants"]:
            first_seen.setdefault(inv["name"], len(first_seen))
    rows = sorted(first_seen, key=lambda n: (order.get(n, len(order)), first_seen[n]))
    subtitle = (f"{assignment['name']}: {len(columns)} submission(s), {assignment.get('dtype', '')} on {assignment.get('device', '')}, "
                f"hypothesis profile {assignment.get('profile', '')}")
    folders = {where.name: c for c, (where, _) in enumerate(reports)}
    return Report("batch", "Class report", subtitle, columns, rows, components, statements, cells, cards,
                  [str(Path(folder))], diagnoses, similar_pairs(Path(folder) / "similar-pairs.csv", folders))


def similar_pairs(path, folders):
    """The Pairs of a batch's similar-pairs.csv (invariants.gate.batch.pairs_csv), most alike first; None when there is no such file.

    folders maps a report folder's name (the csv's a and b) to its submission's column.
    """
    try:
        rows = list(csv.DictReader(Path(path).read_text(encoding="utf-8").splitlines()))
    except FileNotFoundError:
        return None
    try:
        return [Pair(r["a"], r["b"], folders.get(r["a"]), folders.get(r["b"]), float(r["share_of_a"]), float(r["share_of_b"]), r["spans"])
                for r in rows]
    except (KeyError, TypeError, ValueError) as exc:
        raise InputError(f"{path}: not the gate's similar-pairs.csv (a, b, share_of_a, share_of_b, spans): {exc!r}") from None


def pass_rates(report):
    """[(invariant, passed, graded)] across a batch's submissions, lowest rate first (ties by name)."""
    rates = []
    for name in report.rows:
        statuses = [report.cells[(name, c)].status for c in range(len(report.columns)) if (name, c) in report.cells]
        rates.append((name, sum(s == "passed" for s in statuses), len(statuses)))
    return sorted(rates, key=lambda t: (t[1] / t[2] if t[2] else 0.0, t[0]))


def score_histogram(report, bins=10):
    """(counts per bin, bin edges in percent): each scored submission's score as a share of its maximum; 100% falls in the last bin."""
    counts = [0] * bins
    for col in report.columns:
        if col.score is not None and col.max_score:
            share = col.score / col.max_score
            counts[min(int(share * bins + 1e-9), bins - 1)] += 1  # 0.7·10 is 7.000000000000001: no edge is lost to rounding
    return counts, [100 * i / bins for i in range(bins + 1)]
