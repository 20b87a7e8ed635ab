"""The grading stages, in order; each takes what the earlier ones gave and returns values (new InvariantResult rows, a verdict).

    evidence = scan_code(layout, assignment)                           # forbidden APIs, the course's code imported
    fingerprints, similarity, copied = compare_code(layout, assignment)
    for row in run_invariants(rows, selected, impl, session, transport, assignment, ...): ...   # each row as it is graded
    rows, degenerate = void_vacuous(rows, selected, transport.log, assignment.dtype)
    rows = void_forbidden(rows, selected, evidence, layout, session.used_apis(), assignment)
    rows = void_copied(rows, similarity, assignment)
    verdict, reason = decide(rows, submission, evidence, similarity, assignment)

Fail closed: an invariant passes only by running to completion, and a pass earns its points only when it means something
(a degenerate function, a forbidden API, code copied from the reference earn nothing). `selected` maps each row's name to
its assignment entry (an invariants.gate.config.Selected).
"""

from __future__ import annotations

import dataclasses
import time

from hypothesis import settings as hypothesis_settings

from invariants.gate import confine, degenerate, similarity
from invariants.gate import result as R
from invariants.gate.scan import Reach, scan_files
from invariants.gate.text import QUOTED_CHARS, quoted
from invariants.profiles import profile_settings
from invariants.protocol import FUNCTIONS
from invariants.repro import repro_source, repro_stem
from invariants.runner import run_invariant

# -- the code, before it runs ---------------------------------------------------------------------


def scan_code(layout, assignment):
    """The evidence read from the submission's source: forbidden APIs, and imports of the course's own code (invariants.gate.scan)."""
    return scan_files(layout.root, layout.python_files(), forbidden=assignment.forbidden, blocked=set(confine.BLOCKED_PACKAGES),
                      shipped=set(confine.SHIPPED_MODULES))


def compare_code(layout, assignment):
    """(fingerprints, similarity, evidence): the submission's winnowing fingerprints, its similarity to the reference
    (invariants.gate.similarity; {} when the assignment does not compare), and the copied_code evidence from flag_above."""
    prints = similarity.fingerprint_files(layout.root, layout.python_files())
    if not assignment.similarity_reference:
        return similarity.portable(prints), {}, []
    match = similarity.compare(prints, similarity.reference_prints())
    found = {"reference": match, "flag_above": assignment.flag_above, "fail_above": assignment.fail_above, "k": similarity.K,
             "window": similarity.W}
    evidence = []
    if match["score"] >= assignment.flag_above:
        first = match["matches"][0] if match["matches"] else None
        evidence.append({"kind": "copied_code", "name": "reference", "where": f"{first['file']}:{first['lines'][0]}" if first else "?",
                         "detail": similarity.describe(match, "the reference"), "source": "similarity"})
    return similarity.portable(prints), found, evidence


# -- the invariants, against the worker ------------------------------------------------------------


def examples_settings(assignment):
    """The hypothesis settings of a grading: the assignment's profile and examples, seeded, never derandomized."""
    base = profile_settings(assignment.profile)
    extra = {"max_examples": assignment.max_examples} if assignment.max_examples else {}
    return hypothesis_settings(base, database=None, deadline=None, derandomize=False, print_blob=True, **extra)


def graded(row, status, reason, details="", examples=0):
    """The row with its status and what goes with it: the one place a status is set (its words capped: text.quoted)."""
    return dataclasses.replace(row, status=status, reason=quoted(reason), details=quoted(details), examples=examples,
                               score=row.max_score if status == "passed" else 0.0)


def _from_outcome(row, outcome, impl, source_name):
    """The row as the gate words the runner's Outcome (a skip is not a pass); a failure keeps its repro script, to run on source_name."""
    if outcome.status == "passed":
        return graded(row, "passed", outcome.reason, examples=outcome.examples)
    if outcome.status == "skipped":
        return graded(row, "skipped", f"did not run: {outcome.reason}; a required invariant that does not run is not a pass")
    repro, arrays = row.repro, row.repro_arrays
    if outcome.calls and _quotable(outcome):  # a replay quotes answers whole, to compare them: none for text too long to quote
        repro, arrays = repro_source(outcome, impl, target=source_name, npz_name=f"{repro_stem(outcome.invariant)}.npz")
    return dataclasses.replace(graded(row, outcome.status, outcome.reason, outcome.report, outcome.examples_to_failure or 0),
                               lost=outcome.lost or "", repro=repro, repro_arrays=arrays,
                               measured=outcome.measured)  # what the diagnosis reads: figures, never the words above


def _quotable(outcome):
    """Whether a failure's words and text answers are short enough to quote whole (text.QUOTED_CHARS), as its repro script must."""
    texts = [outcome.problem, *(answer for _, _, answer in outcome.calls if isinstance(answer, str))]
    return all(len(text) <= QUOTED_CHARS for text in texts)


def run_invariants(rows, selected, impl, session, transport, assignment, *, seed, source_name, progress=None):
    """Run each row's invariant against the session's worker, in order, yielding (index, the row graded) as each ends.

    A function the submission lacks makes its invariants "missing"; a lost worker is restarted for the next invariant, until
    the run's clock or max_worker_losses stops the run, and the rest are "not run". progress(row, seconds_left) is called
    before each invariant runs.
    """
    settings, losses, stopped = examples_settings(assignment), 0, None  # stopped: why the remaining invariants are not run
    limits = assignment.limits
    for index, row in enumerate(rows):
        inv = selected[row.name].invariant
        missing = impl.missing(inv.requires)
        if not stopped and time.monotonic() >= session.run_deadline:
            stopped = f"not run: the run's time limit ({limits.run_seconds:g} s) was reached"
        if not stopped and not missing and not session.alive:
            again = session.start()
            if again.problem is not None:
                stopped = f"not run: the worker could not be restarted ({again.problem['message']})"
        if stopped or missing:
            yield index, graded(row, "not_run" if stopped else "missing", stopped or missing)
            continue
        began = time.monotonic()
        if progress is not None:
            progress(row, session.run_deadline - began)
        session.invariant_deadline = began + limits.invariant_seconds
        transport.log.current = inv.name
        outcome = run_invariant(inv, impl, settings=settings, seed=seed, shrink_limit=limits.shrink_examples)
        transport.log.current = None
        yield index, dataclasses.replace(_from_outcome(row, outcome, impl, source_name), seconds=round(time.monotonic() - began, 2))
        if outcome.lost:
            losses += 1
            session.stop()
            if outcome.lost == "run_timeout":
                stopped = f"not run: the run's time limit ({limits.run_seconds:g} s) was reached"
            elif losses >= limits.max_worker_losses:
                stopped = f"not run: the worker was lost {losses} times (the limit is {limits.max_worker_losses})"


def missing_functions(rows, selected, impl):
    """The protocol functions that the "missing" rows' invariants need and the submission lacks, sorted."""
    return sorted({f for row in rows if row.status == "missing" for f in selected[row.name].invariant.requires if f not in impl.functions})


# -- points that mean something -------------------------------------------------------------------


def _voided(row, status, reason):
    """A passed row that earns nothing: "vacuous" (its function is degenerate) or "voided" (forbidden code, copied code)."""
    return graded(row, status, reason, f"The property held on every example ({row.reason}), but it earns no points: {reason}.", row.examples)


def void_vacuous(rows, selected, log, dtype):
    """(rows, degenerate): passed rows that call a function not shown to compute its component in the modes they called it in
    (invariants.gate.degenerate) become "vacuous", 0 points; degenerate: {function: what was found}.

    The judge reads the calls and probes recorded while the invariants ran and asks the
    submission nothing more, so it is made whatever the run's clock says.
    """
    passed = [r for r in rows if r.status == "passed"]
    needed = sorted({f for r in passed for f in selected[r.name].invariant.requires if f in degenerate.CHECKED})
    held = {r.name for r in passed}
    found, unshown = {}, {}  # unshown: function -> the modes it was not shown to compute in (None: every mode)
    for name in needed:
        verdict = degenerate.judge(name, log, held, dtype)
        if verdict is not None:
            found[name], unshown[name] = verdict

    def judged(row):
        hit = [f for f in selected[row.name].invariant.requires
               if f in found and (unshown[f] is None or log.modes_used(f, {row.name}) & unshown[f])] if row.status == "passed" else []
        return _voided(row, "vacuous", found[hit[0]]["why"]) if hit else row

    return [judged(r) for r in rows], found


def void_forbidden(rows, selected, evidence, layout, used, assignment):
    """With on_use = "fail", passed rows whose functions use a forbidden API (or the course's code) become "voided".
    used: {protocol function: forbidden APIs the worker saw it use}."""
    items = [e for e in evidence if e["kind"] in ("forbidden_api", "blocked_import")]
    if assignment.on_forbidden != "fail" or (not items and not used):
        return rows
    reach = Reach(layout.root, layout.python_files(), FUNCTIONS)
    everywhere, charged = None, {}  # evidence that reaches every invariant; {function: the forbidden name}
    for e in items:
        functions = None if e["kind"] == "blocked_import" else reach.functions(e["where"])
        if functions is None:
            everywhere = everywhere or e
        else:
            for f in functions:
                charged.setdefault(f, e["name"])
    for f, apis in used.items():
        if apis:
            charged.setdefault(f, sorted(apis)[0])

    def judged(row):
        if row.status != "passed":
            return row
        hit = [f for f in selected[row.name].invariant.requires if f in charged]
        if everywhere is not None:
            what = "imports the course's own code" if everywhere["kind"] == "blocked_import" else "uses"
            return _voided(row, "voided", f"the submission {what} {everywhere['name']} (at {everywhere['where']}, in code every function may "
                                          "run), which the assignment forbids (on_use = \"fail\")")
        if hit:
            return _voided(row, "voided", f"{hit[0]} uses {charged[hit[0]]}, which the assignment forbids (on_use = \"fail\")")
        return row

    return [judged(r) for r in rows]


def _copied(found, assignment):
    """The similarity match to the reference when it reaches the assignment's fail_above, else None."""
    match = (found or {}).get("reference")
    return match if match and assignment.fail_above is not None and match["score"] >= assignment.fail_above else None


def void_copied(rows, found, assignment):
    """Every passed row becomes "voided" when the code's similarity to the reference (found) reaches fail_above."""
    match = _copied(found, assignment)
    if match is None:
        return rows
    reason = (f"{100 * match['score']:.0f}% of the submission's code matches the reference "
              f"(the assignment fails a submission above {100 * assignment.fail_above:.0f}%)")
    return [_voided(r, "voided", reason) if r.status == "passed" else r for r in rows]


# -- the verdict ----------------------------------------------------------------------------------------


def decide(rows, submission, evidence, found, assignment):
    """(verdict, reason) from the graded rows alone (fail closed), the submission's record (its missing functions, its degenerate
    ones), the evidence and the similarity found."""
    missing = [r.name for r in rows if r.status == "missing"]
    if missing:
        return R.NOT_GRADABLE, (f"the submission does not provide {', '.join(submission['missing_functions'])}, needed by "
                                f"{len(missing)} required invariant(s)")
    bad = [r for r in rows if r.status != "passed"]
    forbidden = [e for e in evidence if e["kind"] in ("forbidden_api", "blocked_import")]
    match = _copied(found, assignment)
    if match is not None:
        return R.FAILED, (f"{100 * match['score']:.0f}% of the submission's code matches the reference (the assignment fails a "
                          f"submission above {100 * assignment.fail_above:.0f}%): every invariant is voided")
    if bad:
        names = ", ".join(r.name for r in bad[:5]) + (", ..." if len(bad) > 5 else "")
        reason = f"{len(bad)} of {len(rows)} required invariants did not pass: {names}"
        notes = []
        if any(r.status == "vacuous" for r in bad):
            degenerate_found = ", ".join(f"{f}: {v['kind'].replace('_', ' ')}" for f, v in submission.get("degenerate", {}).items())
            notes.append(f"{sum(r.status == 'vacuous' for r in bad)} held only vacuously ({degenerate_found})")
        if any(r.status == "voided" for r in bad) and forbidden:
            notes.append(f"{sum(r.status == 'voided' for r in bad)} voided: the submission uses what the assignment forbids ({forbidden[0]['name']})")
        return R.FAILED, reason + ("; " + "; ".join(notes) if notes else "")
    if forbidden and assignment.on_forbidden == "fail":
        return R.FAILED, f"every invariant passed, but the submission uses what the assignment forbids: {forbidden[0]['name']}"
    return R.PASSED, f"all {len(rows)} required invariants passed"
