"""Grade one submission: run the assignment's invariants in the parent against the worker, fail closed.

    result = grade("student.zip", load_assignment("assignments/p01.toml"))

The parent owns hypothesis, the reference and every comparison; the submission answers from
a confined worker (gate.sandbox). The verdict comes from the assignment's list alone: an
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

from gate import result as R
from gate.sandbox import Worker, WorkerLost
from gate.scan import scan_files
from gate.submission import SubmissionError, materialise
from gate.text import clean_output
from invariants.boundary import to_numpy
from invariants.conventions import CONVENTIONS, read_declarations
from invariants.profiles import profile_settings
from invariants.protocol import FUNCTIONS, Implementation, ImplementationError, ImplementationLoadError
from invariants.runner import describe_value, run_invariant

# -- seeds ------------------------------------------------------------------------------------


def derive_seed(secret, submission_sha256):
    """A 64-bit hypothesis seed from a course secret and a submission's hash (HMAC-SHA256)."""
    key = secret.encode() if isinstance(secret, str) else secret
    return int.from_bytes(hmac.new(key, submission_sha256.encode(), hashlib.sha256).digest()[:8], "big")


def secret_fingerprint(secret):
    """A short, non-reversible name for a secret, so staff can tell which one a report used."""
    key = secret.encode() if isinstance(secret, str) else secret
    return hashlib.sha256(b"invariants-gate:" + key).hexdigest()[:12]


# -- the implementation the invariants call ----------------------------------------------------


class Session:
    """The worker for one submission, restarted after it is lost, and the run's three clocks."""

    def __init__(self, layout, assignment, scratch, backend, run_deadline):
        self.layout, self.assignment, self.scratch = layout, assignment, scratch
        self.backend = backend
        self.limits = assignment.limits
        self.run_deadline = run_deadline
        self.invariant_deadline = None
        self.worker = None
        self.starts = 0
        self.evidence = []

    def start(self):
        self.starts += 1
        self.worker = Worker(
            scratch=self.scratch, layout=self.layout, backend=self.backend, device=self.assignment.device,
            dtype=self.assignment.dtype, limits=self.limits, forbidden=self.assignment.forbidden,
            functions={name: list(spec.params) for name, spec in FUNCTIONS.items()}, conventions=list(CONVENTIONS),
            drop_user=self.assignment.drop_user, network_namespace=self.assignment.network_namespace, generation=self.starts,
        )
        return self.worker.start()

    @property
    def alive(self):
        return self.worker is not None and self.worker.proc is not None

    def stop(self):
        if self.worker is not None:
            self.worker.stop()
            self.evidence += [e for e in self.worker.evidence if e not in self.evidence]

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

    def __init__(self, session, functions, declarations):
        self.session = session
        self.functions = frozenset(functions)
        self.declarations = declarations

    def call(self, name, args):
        return to_numpy(self.session.call(name, args), name)

    def raw(self, name):
        raise ImplementationError(f"{name} runs in the gate's worker: its own callables never reach the parent")


# -- grading ------------------------------------------------------------------------------------


def _settings(assignment, seed):
    base = profile_settings(assignment.profile)
    extra = {"max_examples": assignment.max_examples} if assignment.max_examples else {}
    return hypothesis_settings(base, database=None, deadline=None, derandomize=seed is None, print_blob=True, **extra)


def _record(inv_result, status, reason, details="", examples=0):
    """Set an invariant's status and what goes with it: the one place the grading loop sets a status."""
    inv_result.status, inv_result.reason, inv_result.details, inv_result.examples = status, reason, details, examples
    inv_result.score = inv_result.max_score if status == "passed" else 0.0


def _record_outcome(inv_result, outcome):
    """The runner's Outcome, as the gate words it (a skip is not a pass)."""
    if outcome.status == "passed":
        _record(inv_result, "passed", outcome.reason, examples=outcome.examples)
    elif outcome.status == "skipped":
        _record(inv_result, "skipped", f"did not run: {outcome.reason}; a required invariant that does not run is not a pass")
    else:
        _record(inv_result, outcome.status, outcome.reason, outcome.report, outcome.examples_to_failure or 0)


def _evidence(items):
    out = []
    for item in items:
        item = {"source": "worker", **item}
        if item not in out:
            out.append(item)
    return out


def grade(submission, assignment, *, seed=None, secret=None, scratch_root=None, keep_scratch=False):
    """Grade one submission (a path) against an Assignment; a GradeResult, whatever the submission does."""
    start = time.monotonic()
    result = R.GradeResult(
        assignment={"name": assignment.name, "path": assignment.path, "sha256": assignment.sha256, "backend": assignment.backend,
                    "dtype": assignment.dtype, "device": assignment.device, "profile": assignment.profile,
                    "max_examples": assignment.max_examples},
        submission={"source": str(submission)},
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
    session = None
    try:
        session = _grade_into(result, submission, assignment, scratch, seed, secret, start)
    except Exception as exc:  # noqa: BLE001 - the gate's own failure still gets a report
        result.verdict = R.GATE_ERROR
        result.reason = f"the gate failed: {type(exc).__name__}: {exc}"
        result.output["gate_traceback"] = traceback.format_exc()[-4000:]
    finally:
        if session is not None:
            session.stop()
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
    for stream in ("stdout", "stderr"):
        parts = []
        for generation in range(1, starts + 1):
            path = scratch / "capture" / f"{stream}.{generation}.txt"
            data = path.read_bytes() if path.exists() else b""
            if data:
                parts.append((f"[worker start {generation}]\n".encode() if starts > 1 else b"") + data)
        data = b"".join(parts).replace(str(scratch).encode(), b"<scratch>")  # the same report on every run ...
        for place, name in _INSTALL_PATHS:  # ... and on every machine, whichever environment runs the gate
            data = data.replace(place.encode(), name.encode())
        result.output[f"{stream}_bytes"] = len(data)
        result.output[stream] = clean_output(data, cap)


def _not_gradable(result, reason):
    result.verdict = R.NOT_GRADABLE
    result.reason = reason
    for inv in result.invariants:
        if inv.status == "not_run":
            inv.reason = "not run: the submission could not be graded"


def _grade_into(result, submission, assignment, scratch, seed, secret, start):
    from gate.sandbox import BLOCKED_PACKAGES

    try:
        layout = materialise(submission, scratch, entry=assignment.entry, blocked=BLOCKED_PACKAGES)
    except SubmissionError as exc:
        _not_gradable(result, str(exc))
        return None
    result.submission.update(kind=layout.kind, sha256=layout.sha256, entry=layout.entry, files=list(layout.files))
    if seed is not None:
        result.seed = {"mode": "fixed", "value": int(seed)}
    elif secret:
        seed = derive_seed(secret, layout.sha256)
        result.seed = {"mode": "secret", "value": seed, "secret_fingerprint": secret_fingerprint(secret)}
    else:
        result.seed = {"mode": "derandomized", "value": None}
    result.evidence = scan_files(layout.root, layout.python_files(), forbidden=assignment.forbidden, blocked=set(BLOCKED_PACKAGES))

    backend = assignment.backend if assignment.backend != "any" else None
    session = Session(layout, assignment, scratch, backend, start + assignment.limits.run_seconds)
    loaded = session.start()
    result.protections = loaded.protections
    result.submission.update(backend=loaded.backend, functions=loaded.functions)
    if loaded.problem is not None:
        _not_gradable(result, loaded.problem["message"])
        return session
    declared = loaded.backend  # the worker already converts to it when the assignment says "any"
    if backend is None and declared not in ("numpy", "torch"):
        _not_gradable(result, f"the submission says BACKEND = {declared!r}: set BACKEND = 'numpy' or 'torch' in it")
        return session
    if backend is not None and declared is not None and declared != backend:
        _not_gradable(result, f"the assignment is graded with the {backend} backend, but the submission says BACKEND = {declared!r}")
        return session
    backend = session.backend = backend or declared
    try:
        transport = WorkerTransport(session, loaded.functions, read_declarations(SimpleNamespace(**loaded.declarations)))
        impl = Implementation(transport=transport, label=f"submission {Path(str(submission)).name}", backend=backend,
                              device=assignment.device, dtype=assignment.dtype)
    except (ImplementationLoadError, ValueError) as exc:
        _not_gradable(result, str(exc))
        return session
    result.submission["declarations"] = dict(impl.declarations)

    settings = _settings(assignment, seed if result.seed["mode"] != "derandomized" else None)
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
        session.invariant_deadline = began + session.limits.invariant_seconds
        outcome = run_invariant(inv, impl, settings=settings, seed=seed, shrink_limit=session.limits.shrink_examples)
        _record_outcome(inv_result, outcome)
        inv_result.seconds = round(time.monotonic() - began, 2)
        if outcome.lost:
            losses += 1
            session.stop()
            if outcome.lost == "run_timeout":
                stopped = f"not run: the run's time limit ({assignment.limits.run_seconds:g} s) was reached"
            elif losses >= assignment.limits.max_worker_losses:
                stopped = f"not run: the worker was lost {losses} times (the limit is {assignment.limits.max_worker_losses})"
    result.submission["missing_functions"] = sorted(absent)
    _verdict(result, assignment)
    return session


def _verdict(result, assignment):
    result.score = sum(inv.score for inv in result.invariants)
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
    if bad:
        result.verdict = R.FAILED
        names = ", ".join(inv.name for inv in bad[:5]) + (", ..." if len(bad) > 5 else "")
        result.reason = f"{len(bad)} of {len(result.invariants)} required invariants did not pass: {names}"
    elif forbidden and assignment.on_forbidden == "fail":
        result.verdict = R.FAILED
        result.reason = f"every invariant passed, but the submission uses what the assignment forbids: {forbidden[0]['name']}"
    else:
        result.verdict = R.PASSED
        result.reason = f"all {len(result.invariants)} required invariants passed"
