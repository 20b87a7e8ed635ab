"""Grade one submission: run the assignment's invariants in the parent against the worker, fail closed.

    result = grade("student.zip", load_assignment("invariants/gate/assignments/p01.toml"))

The parent owns hypothesis, the reference and every comparison; the submission answers from
a confined worker (invariants.gate.sandbox). The verdict comes from the assignment's list alone: an
invariant passes only by running to completion, so a missing answer, a crash, a timeout,
a skip or an early exit is a failure with a reason, never a pass.
"""

from __future__ import annotations

import dataclasses
import datetime
import hashlib
import hmac
import os
import shutil
import sys
import sysconfig
import tempfile
import time
import traceback
from pathlib import Path
from types import SimpleNamespace

from hypothesis import settings as hypothesis_settings
from invariants.boundary import to_numpy
from invariants.conventions import CONVENTIONS, read_declarations, rounding_dtype
from invariants.gate.scan import Reach, scan_files
from invariants.gate.secret import CourseSecret, SecretError, course_secret, kept_path
from invariants.gate.submission import SubmissionError, materialise
from invariants.gate.text import QUOTED_CHARS, clean_output, cut_output, quoted
from invariants.profiles import profile_settings
from invariants.protocol import FUNCTIONS, Implementation, ImplementationError, ImplementationLoadError, OutputError
from invariants.repro import repro_source, repro_stem
from invariants.runner import describe_value, run_invariant

from invariants.gate import bitwise, confine, degenerate, similarity
from invariants.gate import result as R
from invariants.gate.sandbox import Worker, WorkerLost, read_capture

# -- seeds ------------------------------------------------------------------------------------


def derive_seed(secret, submission_sha256):
    """A 64-bit hypothesis seed from a course secret and a submission's hash (HMAC-SHA256)."""
    key = secret.encode() if isinstance(secret, str) else secret
    return int.from_bytes(hmac.new(key, submission_sha256.encode(), hashlib.sha256).digest()[:8], "big")


# -- the implementation the invariants call ----------------------------------------------------


class Session:
    """The worker for one submission, restarted after it is lost, and the run's three clocks."""

    def __init__(self, layout, assignment, scratch, backend, run_deadline, *, tool=None, hidden=()):
        self.layout, self.assignment, self.scratch = layout, assignment, scratch
        self.tool, self.hidden = tool, list(hidden)
        self.backend = backend
        self.limits = assignment.limits
        self.run_deadline = run_deadline
        self.invariant_deadline = None
        self.worker = None
        self.starts = 0
        self.evidence = []
        self.used = {}  # {protocol function: forbidden APIs used during its calls}, from workers already stopped

    def start(self):
        self.starts += 1
        self.worker = Worker(
            scratch=self.scratch, layout=self.layout, backend=self.backend, device=self.assignment.device,
            dtype=self.assignment.dtype, limits=self.limits, forbidden=self.assignment.forbidden,
            functions={name: list(spec.params) for name, spec in FUNCTIONS.items()}, conventions=list(CONVENTIONS),
            drop_user=self.assignment.drop_user, network_namespace=self.assignment.network_namespace, generation=self.starts,
            tool=self.tool, hidden=self.hidden, require=self.assignment.require,
        )
        return self.worker.start()

    @property
    def alive(self):
        return self.worker is not None and self.worker.proc is not None

    def stop(self):
        """Stop the worker (RuntimeError when a process of its uid survives it), keeping what it recorded."""
        if self.worker is not None:
            try:
                self.worker.stop()
            finally:
                self.evidence += [e for e in self.worker.evidence if e not in self.evidence]
                for name, apis in self.worker.used.items():
                    self.used.setdefault(name, set()).update(apis)

    def used_apis(self):
        """{protocol function: forbidden APIs the worker saw it use}, over every worker this session started."""
        used = {name: set(apis) for name, apis in self.used.items()}
        for name, apis in (self.worker.used if self.worker is not None else {}).items():
            used.setdefault(name, set()).update(apis)
        return used

    def call(self, name, args):
        now = time.monotonic()
        clocks = [
            (now + self.limits.call_seconds, "call_timeout",
             f"{name} did not answer within {self.limits.call_seconds:g} s (the per-call limit): an endless loop, or far too slow"),
            (self.invariant_deadline, "invariant_timeout", f"the invariant's time limit ({self.limits.invariant_seconds:g} s) ran out"),
            (self.run_deadline, "run_timeout", f"the run's time limit ({self.limits.run_seconds:g} s) ran out"),
        ]
        deadline, cause, late = min((c for c in clocks if c[0] is not None), key=lambda c: c[0])
        if deadline <= now:
            raise WorkerLost(cause, late)
        try:
            return self.worker.call(name, args, deadline, cause, late)
        except WorkerLost as lost:
            raise WorkerLost(lost.cause, f"{lost.message} during {describe_call(name, args)}") from None


def describe_call(name, args, limit=400):
    """'attention(x=float64 (1, 2, 4), ...)', cut to `limit` characters."""
    text = ", ".join(f"{p}={describe_value(a)}" for p, a in zip(FUNCTIONS[name].params, args, strict=False))
    return f"{name}({text if len(text) <= limit else text[: limit - 1] + '…'})"


class WorkerTransport:
    """The transport to the gate's worker: rounded numpy arguments over the pipe, its answers back as plain numpy.

    The worker converts and calls through invariants.boundary.answer, as an in-process run does;
    the parent runs the decoded answer through boundary.to_numpy again, so a hostile worker's
    lists and numbers are held to the same rules.
    """

    in_process = False

    def __init__(self, session, functions, declarations, *, seed=None, reference=None, dtype="float64"):
        self.session = session
        self.functions = frozenset(functions)
        self.declarations = declarations
        # a few of each function's calls, answers and probes, for the vacuous-pass check
        self.log = degenerate.CallLog(seed, reference=reference, dtype=dtype, declarations=declarations)

    def call(self, name, args):
        if (probe := self.log.probe_due(name)) is not None:
            self._probe(name, *probe)
        answer = to_numpy(self.session.call(name, args), name)
        self.log.record(name, args, answer)
        return answer

    def _ask(self, name, args):
        """The submission's answer to a probe, or None where it raises or answers wrongly (a lost worker is lost as for any call)."""
        try:
            return to_numpy(self.session.call(name, args), name)
        except (ImplementationError, OutputError):
            return None

    def _probe(self, name, kind, call):
        """Ask about a recorded call among the invariant's own calls (invariants.gate.degenerate): at a nearby point, or again and moved."""
        args, answer = call["args"], call["answer"]
        if kind == "near":
            near = degenerate.nearby(args, self.log.rng)
            self.log.answered_near(name, call, near, self._ask(name, near))
            return
        moved = degenerate.perturbed(args, self.log.rng)
        self.log.probed(name, args, answer, self._ask(name, args), moved, None if moved is None else self._ask(name, moved))

    def raw(self, name):
        raise ImplementationError(f"{name} runs in the gate's worker: its own callables never reach the parent")


# -- grading ------------------------------------------------------------------------------------


def _settings(assignment):
    base = profile_settings(assignment.profile)
    extra = {"max_examples": assignment.max_examples} if assignment.max_examples else {}
    return hypothesis_settings(base, database=None, deadline=None, derandomize=False, print_blob=True, **extra)  # seeded, never derandomized


def _record(inv_result, status, reason, details="", examples=0):
    """Set an invariant's status and what goes with it: the one place the grading loop sets a status (its words capped: text.quoted)."""
    inv_result.status, inv_result.reason, inv_result.details, inv_result.examples = status, quoted(reason), quoted(details), examples
    inv_result.score = inv_result.max_score if status == "passed" else 0.0


def _void(inv_result, status, reason):
    """A passed invariant that earns nothing: "vacuous" (its function is degenerate) or "voided" (forbidden code, copied code)."""
    details = f"The property held on every example ({inv_result.reason}), but it earns no points: {reason}."
    _record(inv_result, status, reason, details, inv_result.examples)


def _record_outcome(inv_result, outcome, impl, source_name):
    """The runner's Outcome, as the gate words it (a skip is not a pass); a failure keeps its repro script, to run on source_name."""
    if outcome.status == "passed":
        _record(inv_result, "passed", outcome.reason, examples=outcome.examples)
    elif outcome.status == "skipped":
        _record(inv_result, "skipped", f"did not run: {outcome.reason}; a required invariant that does not run is not a pass")
    else:
        _record(inv_result, outcome.status, outcome.reason, outcome.report, outcome.examples_to_failure or 0)
        inv_result.lost = outcome.lost or ""
        inv_result.measured = outcome.measured  # what the diagnosis reads: figures, never the words above
        if outcome.calls and _quotable(outcome):  # a replay quotes answers whole, to compare them: none for text too long to quote
            npz = f"{repro_stem(outcome.invariant)}.npz"
            inv_result.repro, inv_result.repro_arrays = repro_source(outcome, impl, target=source_name, npz_name=npz)


def _quotable(outcome):
    """Whether a failure's words and text answers are short enough to quote whole (text.QUOTED_CHARS), as its repro script must."""
    texts = [outcome.problem, *(answer for _, _, answer in outcome.calls if isinstance(answer, str))]
    return all(len(text) <= QUOTED_CHARS for text in texts)


def _evidence(items):
    out = []
    for item in items:
        item = {"source": "worker", **item}
        if item not in out:
            out.append(item)
    return out


def grade(submission, assignment, *, seed=None, secret=None, scratch_root=None, keep_scratch=False, hidden=(), cohort=None,
          progress=None):
    """Grade one submission (a path) against an Assignment; a GradeResult, whatever the submission does.

    seed: a fixed seed (reproducing a report's); else secret (a str, or an invariants.gate.secret.CourseSecret) seeds each
    submission, and without one the course's secret does (invariants.gate.secret.course_secret: never derandomized).
    hidden: more host paths the worker must not see (a batch's folder, the reports); cohort: the
    batch's other submissions' fingerprints (invariants.gate.similarity), when the batch compares them;
    progress: called as progress(result, inv_result, seconds_left) before each invariant runs.
    """
    start = time.monotonic()
    result = R.GradeResult(
        assignment={"name": assignment.name, "path": assignment.path, "sha256": assignment.sha256, "backend": assignment.backend,
                    "dtype": assignment.dtype, "device": assignment.device, "profile": assignment.profile,
                    "max_examples": assignment.max_examples},
        submission={"source": os.fsencode(submission).decode("utf-8", "backslashreplace")},  # a name that is not UTF-8, escaped
        started_at=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        limits=dataclasses.asdict(assignment.limits),
        excluded=[{"name": n, "reason": r} for n, r in assignment.excluded],
    )
    result.invariants = [
        R.InvariantResult(s.name, s.invariant.component, s.invariant.statement, s.invariant.hint, s.visibility, s.points)
        for s in assignment.selected
    ]
    result.max_score = sum(s.points for s in assignment.selected)
    scratch = Path(tempfile.mkdtemp(prefix="gate-", dir=scratch_root))
    os.chmod(scratch, 0o755)
    sessions = []  # the session _grade_into starts, there even when it raises afterwards
    try:
        _grade_into(result, submission, assignment, scratch, seed, secret, start, hidden, progress, sessions=sessions)
    except Exception as exc:  # noqa: BLE001 - the gate's own failure still gets a report
        result.verdict = R.GATE_ERROR
        result.reason = f"the gate failed: {type(exc).__name__}: {quoted(str(exc))}"
        result.output["gate_traceback"] = traceback.format_exc()[-4000:]
    finally:
        for session in sessions:
            try:
                session.stop()
            except RuntimeError as exc:  # a process of the worker's uid outlived SIGKILL: the gate's fault, whatever the verdict
                result.verdict, result.reason = R.GATE_ERROR, f"the gate failed: {exc}"
            result.evidence = result.evidence + _evidence(session.evidence)
            result.worker_starts = session.starts
            _collect_output(result, scratch, session.starts, assignment.limits.output_kib << 10)
        if not keep_scratch:
            shutil.rmtree(scratch, ignore_errors=True)
        result.seconds = round(time.monotonic() - start, 2)
    return result


# Longest first, so that site-packages is named before the prefix that contains it.
_PATHS = sysconfig.get_paths()
_INSTALL_PATHS = sorted(
    {_PATHS["purelib"]: "<site-packages>", _PATHS["platlib"]: "<site-packages>", _PATHS["stdlib"]: "<stdlib>", sys.prefix: "<python>"}.items(),
    key=lambda pair: -len(pair[0]),
)


def _collect_output(result, scratch, starts, cap):
    """Each stream's captured output of every worker start, as its head and tail of at most `cap` bytes in all (read in place:
    a flood is never loaded whole) with the middle counted; the byte count is the whole's (as written, where it was cut)."""
    for stream in ("stdout", "stderr"):
        parts = []
        for generation in range(1, starts + 1):
            path = scratch / "capture" / f"{stream}.{generation}.txt"
            if path.exists() and path.stat().st_size:
                parts += [f"[worker start {generation}]\n".encode(), path] if starts > 1 else [path]
        size, head, tail = read_capture(parts, cap // 2)
        if tail is None:
            head = _portable(head, scratch)
            result.output[f"{stream}_bytes"], result.output[stream] = len(head), clean_output(head, cap)
        else:
            result.output[f"{stream}_bytes"] = size
            result.output[stream] = cut_output(_portable(head, scratch), _portable(tail, scratch), size - len(head) - len(tail))


def _portable(data, scratch):
    """Captured bytes with the scratch folder and the install's paths named, not written out: the same report on every run and machine."""
    data = data.replace(str(scratch).encode(), b"<scratch>")
    for place, name in _INSTALL_PATHS:
        data = data.replace(place.encode(), name.encode())
    return data


def _not_gradable(result, reason):
    result.verdict = R.NOT_GRADABLE
    result.reason = quoted(reason)
    for inv in result.invariants:
        if inv.status == "not_run":
            inv.reason = "not run: the submission could not be graded"


def _grade_into(result, submission, assignment, scratch, seed, secret, start, hidden=(), progress=None, *, sessions):
    from invariants.gate.sandbox import BLOCKED_PACKAGES

    try:
        layout = materialise(submission, scratch, entry=assignment.entry, blocked=BLOCKED_PACKAGES)
    except SubmissionError as exc:
        _not_gradable(result, str(exc))
        return None
    result.submission.update(kind=layout.kind, sha256=layout.sha256, entry=layout.entry, files=list(layout.files))
    key = None
    if seed is not None:
        result.seed = {"mode": "fixed", "value": int(seed)}
    else:
        try:
            key = secret if isinstance(secret, CourseSecret) else CourseSecret(secret, "given") if secret else course_secret(assignment)
        except SecretError as exc:
            result.verdict, result.reason = R.GATE_ERROR, str(exc)
            return
        if key is None:  # a --visible-only preview without the course's secret: a fresh seed, never a grade of record
            seed = int.from_bytes(os.urandom(8), "big")
            result.seed = {"mode": "random", "value": seed}
        else:
            seed = derive_seed(key.value, layout.sha256)
            result.seed = {"mode": "secret", "value": seed, "secret_fingerprint": key.fingerprint, "secret_source": key.source}
    result.evidence = scan_files(layout.root, layout.python_files(), forbidden=assignment.forbidden, blocked=set(BLOCKED_PACKAGES),
                                 shipped=set(confine.SHIPPED_MODULES))
    _compare_code(result, layout, assignment)

    backend = assignment.backend if assignment.backend != "any" else None
    tool = confine.choose(assignment.tool)
    source = Path(str(submission)).resolve()
    hidden = [assignment.path, assignment.secret_file, str(kept_path()), key and key.path, str(source), str(source.parent), *hidden]
    session = Session(layout, assignment, scratch, backend, start + assignment.limits.run_seconds, tool=tool, hidden=hidden)
    sessions.append(session)  # grade() stops it, whatever happens next
    loaded = session.start()
    result.protections = loaded.protections
    result.sandbox = {"tool": tool.name, "detail": tool.detail, "missing": list(loaded.missing), "required": list(assignment.require),
                      "seconds": round(session.worker.start_seconds, 3)}  # the sandbox's start-up
    result.submission.update(backend=loaded.backend, functions=loaded.functions)
    if loaded.problem is not None and loaded.problem["kind"] == "refused":
        result.verdict = R.GATE_ERROR
        result.reason = loaded.problem["message"]
        return
    if loaded.problem is not None:
        _not_gradable(result, loaded.problem["message"])
        return
    declared = loaded.backend  # the worker already converts to it when the assignment says "any"
    if backend is None and declared not in ("numpy", "torch"):
        _not_gradable(result, f"the submission says BACKEND = {declared!r}: set BACKEND = 'numpy' or 'torch' in it")
        return
    if backend is not None and declared is not None and declared != backend:
        _not_gradable(result, f"the assignment is graded with the {backend} backend, but the submission says BACKEND = {declared!r}")
        return
    backend = session.backend = backend or declared
    try:
        import invariants.reference.numpy as reference

        own = read_declarations(SimpleNamespace(**loaded.declarations))
        transport = WorkerTransport(session, loaded.functions, assignment.graded_under(own),
                                    seed=result.seed["value"], reference=reference, dtype=assignment.dtype)
        impl = Implementation(transport=transport, label=f"submission {Path(str(submission)).name}", backend=backend,
                              device=assignment.device, dtype=assignment.dtype)
    except (ImplementationLoadError, ValueError) as exc:
        _not_gradable(result, str(exc))
        return
    result.submission["declarations"] = dict(own)
    result.submission["rounding"] = rounding_dtype(impl)  # the rounding its answers are held to (COMPUTE_DTYPE, [assignment] rounding)
    refused = assignment.refused_declaration(own)
    if refused:
        _not_gradable(result, refused)
        return

    settings = _settings(assignment)
    losses = 0
    absent = set()  # protocol functions that required invariants need and the submission lacks
    stopped = None  # why the remaining invariants are not run
    by_name = {s.name: s for s in assignment.selected}
    for inv_result in result.invariants:
        inv = by_name[inv_result.name].invariant
        missing = impl.missing(inv.requires)
        if not stopped and time.monotonic() >= session.run_deadline:
            stopped = f"not run: the run's time limit ({assignment.limits.run_seconds:g} s) was reached"
        if not stopped and not missing and not session.alive:
            again = session.start()
            if again.problem is not None:
                stopped = f"not run: the worker could not be restarted ({again.problem['message']})"
        if stopped or missing:
            _record(inv_result, "not_run" if stopped else "missing", stopped or missing)
            absent.update(name for name in inv.requires if name not in impl.functions and not stopped)
            continue
        began = time.monotonic()
        if progress is not None:
            progress(result, inv_result, session.run_deadline - began)
        session.invariant_deadline = began + session.limits.invariant_seconds
        transport.log.current = inv.name
        outcome = run_invariant(inv, impl, settings=settings, seed=seed, shrink_limit=session.limits.shrink_examples)
        transport.log.current = None
        _record_outcome(inv_result, outcome, impl, Path(str(submission)).name)
        inv_result.seconds = round(time.monotonic() - began, 2)
        if outcome.lost:
            losses += 1
            session.stop()
            if outcome.lost == "run_timeout":
                stopped = f"not run: the run's time limit ({assignment.limits.run_seconds:g} s) was reached"
            elif losses >= assignment.limits.max_worker_losses:
                stopped = f"not run: the worker was lost {losses} times (the limit is {assignment.limits.max_worker_losses})"
    result.submission["missing_functions"] = sorted(absent)
    _vacuous(result, by_name, transport, assignment)
    result.bitwise = bitwise.evidence(transport.log)
    _void_forbidden(result, by_name, layout, session, assignment)
    _void_copied(result, assignment)
    _verdict(result, assignment)


# -- points that mean something -------------------------------------------------------------------


def _vacuous(result, by_name, transport, assignment):
    """Passed invariants that call a function not shown to compute its component in the modes they called it in
    (invariants.gate.degenerate) become "vacuous", 0 points.

    The judge reads the calls and probes recorded while the invariants ran and asks the
    submission nothing more, so it is made whatever the run's clock says.
    """
    passed = [r for r in result.invariants if r.status == "passed"]
    needed = sorted({f for r in passed for f in by_name[r.name].invariant.requires if f in degenerate.CHECKED})
    held = {r.name for r in passed}
    log, found, unshown = transport.log, {}, {}  # unshown: function -> the modes it was not shown to compute in (None: every mode)
    for name in needed:
        verdict = degenerate.judge(name, log, held, assignment.dtype)
        if verdict is not None:
            found[name], unshown[name] = verdict
    result.submission["degenerate"] = found
    for r in passed:
        hit = [f for f in by_name[r.name].invariant.requires
               if f in found and (unshown[f] is None or log.modes_used(f, {r.name}) & unshown[f])]
        if hit:
            _void(r, "vacuous", found[hit[0]]["why"])


def _void_forbidden(result, by_name, layout, session, assignment):
    """With on_use = "fail", passed invariants whose functions use a forbidden API (or the course's code) become "voided"."""
    if assignment.on_forbidden != "fail":
        return
    items = [e for e in result.evidence if e["kind"] in ("forbidden_api", "blocked_import")]
    used = session.used_apis()
    if not items and not used:
        return
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
    for r in result.invariants:
        if r.status != "passed":
            continue
        hit = [f for f in by_name[r.name].invariant.requires if f in charged]
        if everywhere is not None:
            what = "imports the course's own code" if everywhere["kind"] == "blocked_import" else "uses"
            _void(r, "voided", f"the submission {what} {everywhere['name']} (at {everywhere['where']}, in code every function may run), "
                               "which the assignment forbids (on_use = \"fail\")")
        elif hit:
            _void(r, "voided", f"{hit[0]} uses {charged[hit[0]]}, which the assignment forbids (on_use = \"fail\")")


def _compare_code(result, layout, assignment):
    """Winnowing fingerprints of the submission, and its similarity to the reference (invariants.gate.similarity)."""
    prints = similarity.fingerprint_files(layout.root, layout.python_files())
    result.fingerprints = similarity.portable(prints)
    if not assignment.similarity_reference:
        return
    match = similarity.compare(prints, similarity.reference_prints())
    result.similarity = {"reference": match, "flag_above": assignment.flag_above, "fail_above": assignment.fail_above,
                         "k": similarity.K, "window": similarity.W}
    if match["score"] >= assignment.flag_above:
        first = match["matches"][0] if match["matches"] else None
        result.evidence.append({"kind": "copied_code", "name": "reference", "where": f"{first['file']}:{first['lines'][0]}" if first else "?",
                                "detail": similarity.describe(match, "the reference"), "source": "similarity"})


def _void_copied(result, assignment):
    match = (result.similarity or {}).get("reference")
    if assignment.fail_above is None or not match or match["score"] < assignment.fail_above:
        return
    for r in result.invariants:
        if r.status == "passed":
            _void(r, "voided", f"{100 * match['score']:.0f}% of the submission's code matches the reference "
                               f"(the assignment fails a submission above {100 * assignment.fail_above:.0f}%)")


def _verdict(result, assignment):
    by_status = {}
    for inv in result.invariants:
        by_status.setdefault(inv.status, []).append(inv.name)
    if by_status.get("missing"):
        result.verdict = R.NOT_GRADABLE
        result.reason = (f"the submission does not provide {', '.join(result.submission['missing_functions'])}, needed by "
                         f"{len(by_status['missing'])} required invariant(s)")
        return
    bad = [inv for inv in result.invariants if inv.status != "passed"]
    forbidden = [e for e in result.evidence if e["kind"] in ("forbidden_api", "blocked_import")]
    match = (result.similarity or {}).get("reference")
    if match and assignment.fail_above is not None and match["score"] >= assignment.fail_above:
        result.verdict = R.FAILED
        result.reason = (f"{100 * match['score']:.0f}% of the submission's code matches the reference (the assignment fails a "
                         f"submission above {100 * assignment.fail_above:.0f}%): every invariant is voided")
    elif bad:
        result.verdict = R.FAILED
        names = ", ".join(inv.name for inv in bad[:5]) + (", ..." if len(bad) > 5 else "")
        result.reason = f"{len(bad)} of {len(result.invariants)} required invariants did not pass: {names}"
        notes = []
        if any(i.status == "vacuous" for i in bad):
            found = ", ".join(f"{f}: {v['kind'].replace('_', ' ')}" for f, v in result.submission.get("degenerate", {}).items())
            notes.append(f"{sum(i.status == 'vacuous' for i in bad)} held only vacuously ({found})")
        if any(i.status == "voided" for i in bad) and forbidden:
            notes.append(f"{sum(i.status == 'voided' for i in bad)} voided: the submission uses what the assignment forbids ({forbidden[0]['name']})")
        if notes:
            result.reason += "; " + "; ".join(notes)
    elif forbidden and assignment.on_forbidden == "fail":
        result.verdict = R.FAILED
        result.reason = f"every invariant passed, but the submission uses what the assignment forbids: {forbidden[0]['name']}"
    else:
        result.verdict = R.PASSED
        result.reason = f"all {len(result.invariants)} required invariants passed"
