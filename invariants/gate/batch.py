"""Grade submissions and write their reports: one (grade_and_report), a folder in parallel, or one shard of it; merge shards into one class summary.

    invariants-gate --batch submissions/ -a p01 -o reports/ --jobs 2            # one machine
    invariants-gate --batch submissions/ -a p01 -o reports/ --shard 3/8         # one CI job of eight
    invariants-gate --merge reports/ -o reports/                                                 # after the eight

A shard grades the submissions whose position in the sorted folder is K-1 modulo N, writes one
report folder each (named from the whole folder's list, so names never collide across shards)
and a manifest, shard-K-of-N.json. The merge reads every report.json (and fingerprints.json)
under the folders it is given, checks that they come from one assignment and that no shard is
missing, and writes the class summary: one row per submission (verdict, score, seconds, the
similarity to the reference, each invariant's status), the pass rate of every invariant, and
the pairs of submissions whose code is alike (invariants.gate.similarity), for review.
"""

from __future__ import annotations

import csv
import dataclasses
import io
import json
import multiprocessing
import os
import re
import statistics
from concurrent.futures import ProcessPoolExecutor, as_completed
from pathlib import Path

from invariants.gate import result as R
from invariants.gate import similarity
from invariants.gate.text import csv_cell, neutralise, one_line, quoted

_STATE = {}
MANIFEST = re.compile(r"^shard-(\d+)-of-(\d+)\.json$")
COMMON_SHARE = 0.2  # a fingerprint most of a cohort shares (starter code, the lecture's idioms) is evidence against no pair
SEARCH_DEPTH = 4  # how deep --merge looks for report.json under each folder


class MergeError(Exception):
    """The reports cannot be merged (none found, two assignments, a shard missing); the message says which."""


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
    """A unique, filesystem-safe folder name per submission, never one of the batch's own files (no .csv, .md or .json name)."""
    names, used = [], set()
    for path in paths:
        base = re.sub(r"[^A-Za-z0-9_.-]", "_", path.stem if path.is_file() else path.name) or "submission"
        base = re.sub(r"\.(csv|md|json)$", r"_\1", base, flags=re.IGNORECASE)  # class-summary.md.zip -> class-summary_md
        name, n = base, 1
        while name in used:
            n += 1
            name = f"{base}-{n}"
        used.add(name)
        names.append(name)
    return names


def parse_shard(text):
    """'3/8' -> (3, 8); ValueError with the fix otherwise."""
    match = re.fullmatch(r"\s*(\d+)\s*/\s*(\d+)\s*", text or "")
    if not match:
        raise ValueError(f"--shard {text!r} must be K/N, e.g. 3/8 (the third of eight shards)")
    k, n = int(match.group(1)), int(match.group(2))
    if not 1 <= k <= n:
        raise ValueError(f"--shard {text!r}: K must be between 1 and N ({n})")
    return k, n


def in_shard(index, shard):
    """Is the submission at `index` (in the sorted folder) part of shard (K, N)? Round robin: balanced, and the same on every machine."""
    return shard is None or index % shard[1] == shard[0] - 1


def load(options, state):
    """The assignment named in options, loaded once per process and options (state caches it: a batch's pool workers keep theirs)."""
    from invariants.gate.config import load_assignment

    key = tuple(str(options.get(name)) for name in ("assignment", "max_examples", "entry", "visible_only"))
    if state.get("key") != key:  # a second batch in the same process (a test, a library caller) may name another assignment
        state.clear()
        state["key"] = key
        assignment = load_assignment(options["assignment"])
        if options.get("max_examples"):
            assignment = dataclasses.replace(assignment, max_examples=options["max_examples"])
        if options.get("entry"):
            assignment = dataclasses.replace(assignment, entry=options["entry"])
        if options.get("visible_only"):
            assignment = assignment.visible_only()
        state["assignment"] = assignment
    return state["assignment"]


def grade_and_report(path, out_dir, options, *, state, progress=None):
    """Grade one submission and write its reports; (GradeResult, paths written). progress: as invariants.gate.grade.grade takes it."""
    from invariants.gate.grade import grade
    from invariants.gate.reports import write_reports

    assignment = load(options, state)
    result = grade(path, assignment, seed=options.get("seed"), secret=options.get("secret"),
                   scratch_root=options.get("scratch_root"), keep_scratch=options.get("keep_scratch", False),
                   hidden=[*options.get("hidden", ()), str(Path(out_dir).resolve())], progress=progress)
    written = write_reports(result, out_dir, options["formats"], show_hidden=options.get("show_hidden", False))
    return result, written


def _grade_one(job):
    """In a pool process: grade one submission, write its reports, return its summary row; a gate error's row if any of that fails."""
    path, out_dir, options = job
    try:
        result, _ = grade_and_report(path, out_dir, options, state=_STATE)
        return row_from_report(Path(out_dir), report=result.as_dict())
    except Exception as exc:  # noqa: BLE001 - the gate's fault on one submission is that submission's gate error: the batch goes on
        return gate_error_row(job, exc)


def gate_error_row(job, exc):
    """The row of a submission the gate failed on outside grade() (a report, a pool process lost), and its report.json saying so."""
    from invariants.gate.reports import to_json

    path, out_dir, options = job
    result = R.GradeResult(assignment={"name": "?", "sha256": ""}, submission={"source": path}, verdict=R.GATE_ERROR,
                           reason=f"the gate failed: {type(exc).__name__}: {one_line(quoted(str(exc)))}")
    try:
        assignment = load(options, _STATE)
        result.assignment, result.max_score = {"name": assignment.name, "sha256": assignment.sha256}, sum(s.points for s in assignment.selected)
        Path(out_dir).mkdir(parents=True, exist_ok=True)
        (Path(out_dir) / "report.json").write_text(to_json(result), encoding="utf-8")
    except Exception:  # noqa: BLE001 - the row alone says it, in the class summary
        pass
    return row_from_report(Path(out_dir), report=result.as_dict())


def grade_folder(paths, out_dir, options, *, jobs=1, shard=None, progress=None):
    """Grade every path of the shard (all without one), in parallel with jobs > 1; the summary rows, in the paths' order.

    progress: called as progress(done, total) as each submission is graded.
    """
    out = Path(out_dir)
    work = [(str(p), str(out / name), options) for i, (p, name) in enumerate(zip(paths, report_names(paths), strict=True))
            if in_shard(i, shard)]
    tick = progress or (lambda done, total: None)
    if jobs <= 1 or len(work) <= 1:
        rows = []
        for job in work:
            rows.append(_grade_one(job))
            tick(len(rows), len(work))
        return rows
    with ProcessPoolExecutor(max_workers=jobs, mp_context=multiprocessing.get_context("spawn")) as pool:
        futures = [pool.submit(_grade_one, job) for job in work]
        for done, _ in enumerate(as_completed(futures), 1):
            tick(done, len(work))
        return [gate_error_row(job, f.exception()) if f.exception() else f.result() for job, f in zip(work, futures, strict=True)]


def write_manifest(out_dir, shard, rows, cohort):
    """shard-K-of-N.json: which report folders this shard wrote, out of how many submissions."""
    path = Path(out_dir) / f"shard-{shard[0]}-of-{shard[1]}.json"
    path.write_text(json.dumps({"shard": shard[0], "of": shard[1], "cohort": cohort, "reports": [r["report"] for r in rows]}, indent=2) + "\n")
    return path


# -- rows, from the reports on disk ---------------------------------------------------------------


def row_from_report(folder, report=None):
    """The class summary's row for the report folder `folder` (its report.json)."""
    folder = Path(folder)
    report = report if report is not None else json.loads((folder / "report.json").read_text(encoding="utf-8"))
    reference = (report.get("similarity") or {}).get("reference") or {}
    seed = report.get("seed") or {}  # which course secret graded it: a merge notes shards seeded from different ones
    return {
        "submission": Path(report["submission"]["source"]).name, "report": folder.name, "path": str(folder),
        "verdict": report["verdict"], "score": report["score"], "max_score": report["max_score"], "seconds": report.get("seconds", 0),
        "reason": report["reason"], "assignment": report["assignment"].get("name", ""),
        "assignment_sha256": report["assignment"].get("sha256", ""), "similarity": reference.get("score"),
        "flag_above": (report.get("similarity") or {}).get("flag_above", 0.5),
        "bitwise": report.get("bitwise") or {},  # answers that round like the reference (invariants.gate.bitwise)
        "statuses": {inv["name"]: inv["status"] for inv in report["invariants"]},
        "secret": f"secret {seed['secret_fingerprint']}" if seed.get("secret_fingerprint") else f"no course secret ({seed.get('mode', 'no seed')})",
    }


def secret_notice(rows):
    """A line when the rows were not all seeded from one course secret (shards given different secrets, or none); else None."""
    graded = [r for r in rows if r["verdict"] in R.GRADED]
    secrets = sorted({r["secret"] for r in graded})
    if len(secrets) <= 1:
        return None
    counts = ", ".join(f"{sum(r['secret'] == s for r in graded)} from {s}" for s in secrets)
    return (f"the grades were seeded from {len(secrets)} different sources ({counts}): give every shard the same course secret "
            "(a CI secret passed as GATE_SECRET or --secret-env) so that each submission's seed can be reproduced")


def points(row):
    """A row's score out of its maximum, "41/53", as its report.json gives it (GradeResult.score); "no score" where the verdict carries none."""
    return "no score" if row["score"] is None else f"{row['score']:g}/{row['max_score']:g}"


def find_reports(folders):
    """Every folder holding a report.json under `folders` (depth-limited), sorted by name; and the shard manifests found."""
    found, manifests = {}, []
    for top in folders:
        top = Path(top)
        if not top.is_dir():
            raise MergeError(f"no folder {str(top)!r}")
        for dirpath, dirnames, filenames in os.walk(top):
            depth = len(Path(dirpath).relative_to(top).parts)
            if depth >= SEARCH_DEPTH:
                dirnames[:] = []
            dirnames.sort()
            if "report.json" in filenames and Path(dirpath) != top:
                found.setdefault(Path(dirpath).name, Path(dirpath))
            manifests += [Path(dirpath) / f for f in filenames if MANIFEST.match(f)]
    return [found[name] for name in sorted(found)], manifests


def merge_rows(folders):
    """The rows of every report under `folders`, checked: one assignment, every shard present; MergeError otherwise."""
    paths, manifests = find_reports(folders)
    if not paths:
        raise MergeError(f"no report.json under {', '.join(map(str, folders))}")
    rows = []
    for path in paths:
        try:
            rows.append(row_from_report(path))
        except (OSError, ValueError, KeyError) as exc:
            raise MergeError(f"{path / 'report.json'} is not a gate report ({exc})") from None
    assignments = {r["assignment_sha256"] for r in rows}
    if len(assignments) > 1:
        raise MergeError(f"the reports come from {len(assignments)} different assignment files: merge one assignment's reports at a time")
    if manifests:
        seen = {}
        for path in manifests:
            data = json.loads(path.read_text())
            seen[int(data["shard"])] = (int(data["of"]), data["reports"])
        totals = {of for of, _ in seen.values()}
        if len(totals) != 1:
            raise MergeError(f"shard manifests of different splits ({', '.join(map(str, sorted(totals)))} shards)")
        total = totals.pop()
        absent = sorted(set(range(1, total + 1)) - set(seen))
        if absent:
            raise MergeError(f"shard(s) {', '.join(map(str, absent))} of {total} are missing: their reports were not found")
        names = {r["report"] for r in rows}
        lost = sorted(name for _, listed in seen.values() for name in listed if name not in names)
        if lost:
            raise MergeError(f"the manifests list {len(lost)} report(s) that are not there: {', '.join(lost[:5])}")
    return rows


# -- similar pairs -----------------------------------------------------------------------------


def similar_pairs(rows, threshold=None):
    """Pairs of submissions whose code is alike: [{a, b, a_share, b_share, matches}], most alike first.

    Reads each report's fingerprints.json. Fingerprints that more than COMMON_SHARE of the cohort
    has (and at least three submissions) are left out of the comparison.
    """
    prints = {}
    for row in rows:
        path = Path(row["path"]) / "fingerprints.json"
        try:
            prints[row["report"]] = similarity.from_portable(json.loads(path.read_text()))
        except (OSError, ValueError):
            continue
    threshold = threshold if threshold is not None else min((r["flag_above"] for r in rows), default=0.5)
    holders = {}
    for name, files in prints.items():
        for h in {h for fp in files.values() for h, _ in fp["prints"]}:
            holders.setdefault(h, []).append(name)
    common = max(3, int(COMMON_SHARE * len(prints)))
    shared = {}
    for names in holders.values():
        if 1 < len(names) <= common:
            for i, a in enumerate(names):
                for b in names[i + 1 :]:
                    key = (a, b) if a < b else (b, a)
                    shared[key] = shared.get(key, 0) + 1
    pairs = []
    for (a, b), count in sorted(shared.items()):
        smaller = min(sum(len(fp["prints"]) for fp in prints[x].values()) for x in (a, b)) or 1
        if count / smaller < threshold / 2:  # too few shared fingerprints for either share to reach the threshold
            continue
        ab, ba = similarity.compare(prints[a], prints[b]), similarity.compare(prints[b], prints[a])
        if max(ab["score"], ba["score"]) >= threshold:
            pairs.append({"a": a, "b": b, "a_share": ab["score"], "b_share": ba["score"], "matches": ab["matches"]})
    return sorted(pairs, key=lambda p: (-max(p["a_share"], p["b_share"]), p["a"], p["b"]))


# -- the summary files ---------------------------------------------------------------------------


def pass_rates(rows):
    """[(invariant, passed, graded)] in the assignment's order."""
    names = list(dict.fromkeys(name for row in rows for name in row["statuses"]))
    return [(n, sum(row["statuses"].get(n) == "passed" for row in rows), sum(n in row["statuses"] for row in rows)) for n in names]


def _share(value):
    return "" if value is None else f"{value:.3f}"


def summary_csv(rows):
    names = [n for n, _, _ in pass_rates(rows)]
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    writer.writerow(map(csv_cell, ["submission", "verdict", "score", "max_score", "seconds", "similarity_to_reference", "bitwise_share",
                                   "bitwise_calls", "bitwise_flag", "reason", *names]))
    for row in rows:  # no score: an empty cell
        score = "" if row["score"] is None else f"{row['score']:g}"
        writer.writerow(map(csv_cell, [row["submission"], row["verdict"], score, f"{row['max_score']:g}", f"{row['seconds']:g}",
                         _share(row["similarity"]), _share(row["bitwise"].get("share")), row["bitwise"].get("discriminating", ""),
                         "yes" if row["bitwise"].get("flag") else "", row["reason"], *(row["statuses"].get(n, "") for n in names)]))
    return neutralise(buffer.getvalue())


def pass_rates_csv(rows):
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    writer.writerow(map(csv_cell, ["invariant", "passed", "graded", "pass_rate"]))
    for name, passed, graded in pass_rates(rows):
        writer.writerow(map(csv_cell, [name, passed, graded, f"{passed / graded:.3f}" if graded else ""]))
    return buffer.getvalue()


def pairs_csv(pairs):
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    writer.writerow(map(csv_cell, ["a", "b", "share_of_a", "share_of_b", "spans"]))
    for p in pairs:
        writer.writerow(map(csv_cell, [p["a"], p["b"], f"{p['a_share']:.3f}", f"{p['b_share']:.3f}", _spans(p, 20)]))
    return neutralise(buffer.getvalue())


def _percent(share):
    return "" if share is None else f"{100 * share:.0f}%"


def _rounds_like(bitwise):
    """'100% of 80 calls, flagged': the share of the discriminating calls answered to the bit as the reference does."""
    if not bitwise.get("discriminating"):
        return ""
    return f"{_percent(bitwise['share'])} of {bitwise['discriminating']} calls" + (", flagged" if bitwise.get("flag") else "")


def _spans(pair, limit):
    return "; ".join(f"{m['file']}:{m['lines'][0]}-{m['lines'][1]} ~ {m['other_file']}:{m['other_lines'][0]}-{m['other_lines'][1]}"
                     for m in pair["matches"][:limit])


def timing(rows):
    """'mean 5.1 s, median 5.0 s, slowest 7.2 s per submission' over the rows' seconds."""
    seconds = [float(r["seconds"]) for r in rows if r["seconds"]]
    if not seconds:
        return "no timings"
    return (f"mean {statistics.fmean(seconds):.1f} s, median {statistics.median(seconds):.1f} s, slowest {max(seconds):.1f} s per submission "
            f"({sum(seconds):.0f} s in all)")


def summary_markdown(rows, assignment_name, pairs=(), base=None):
    from invariants.gate.reports import VERDICT_WORDS, _cell

    counts = {v: sum(r["verdict"] == v for r in rows) for v in VERDICT_WORDS}

    def link(row):
        target = os.path.relpath(Path(row["path"]) / "summary.md", base) if base is not None else f"{row['report']}/summary.md"
        return f"[{_cell(row['submission'])}]({Path(target).as_posix()})"

    lines = [f"## Class summary: {_cell(assignment_name)}", "",
             f"{len(rows)} submissions: " + ", ".join(f"{n} {VERDICT_WORDS[v]}" for v, n in counts.items() if n) + ". "
             f"Grading time: {timing(rows)}.", "", *([f"**Note:** {secret_notice(rows)}.", ""] if secret_notice(rows) else []),
             "| Submission | Verdict | Score | Similar to the reference | Rounds like the reference | Reason |", "|---|---|---|---|---|---|"]
    lines += [f"| {link(r)} | {VERDICT_WORDS[r['verdict']]} | {points(r)} | {_percent(r['similarity'])} | {_rounds_like(r['bitwise'])} | "
              f"{_cell(r['reason'])} |" for r in rows]
    if any(r["bitwise"].get("flag") for r in rows):
        lines += ["", "*Rounds like the reference*: of the calls where equally correct code can round otherwise, the share answered to the bit "
                  "as the reference does (invariants/gate/bitwise.py). Copies of the reference, however disguised, answer 100%; so does "
                  "numpy code written the textbook way. A reason to read the code, not a verdict."]
    lines += ["", "### Pass rate of each invariant", "", "| Invariant | Passed | Rate |", "|---|---|---|"]
    for name, passed, graded in sorted(pass_rates(rows), key=lambda t: (t[1] / t[2] if t[2] else 0, t[0])):
        lines.append(f"| `{name}` | {passed} / {graded} | {100 * passed / graded:.0f}% |" if graded else f"| `{name}` | 0 / 0 | |")
    if pairs:
        lines += ["", "### Submissions with alike code (for review)", "",
                  "Winnowing fingerprints (invariants/gate/similarity.py); a share is how much of one submission's code the other has too. "
                  "Alike code is a reason for a person to look, not a verdict.", "",
                  "| A | B | Share of A | Share of B | Matching spans |", "|---|---|---|---|---|"]
        lines += [f"| {_cell(p['a'])} | {_cell(p['b'])} | {100 * p['a_share']:.0f}% | {100 * p['b_share']:.0f}% | {_cell(_spans(p, 4))} |"
                  for p in pairs]
    return neutralise("\n".join(lines) + "\n")


def write_summary(rows, out_dir, assignment_name, *, pairs=None):
    """class-summary.csv, pass-rates.csv, class-summary.md and similar-pairs.csv in out_dir; the paths."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    pairs = similar_pairs(rows) if pairs is None else pairs
    paths = {"class-summary.csv": summary_csv(rows), "pass-rates.csv": pass_rates_csv(rows),
             "class-summary.md": summary_markdown(rows, assignment_name, pairs, base=out), "similar-pairs.csv": pairs_csv(pairs)}
    for name, text in paths.items():
        (out / name).write_text(text, encoding="utf-8")
    return [out / name for name in paths]


def batch_exit_code(rows):
    """0 when every submission got a verdict; 4 when the gate failed on any."""
    return R.EXIT_CODES[R.GATE_ERROR] if any(r["verdict"] == R.GATE_ERROR for r in rows) else 0
