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

from hypothesis import settings as hypothesis_settings
from hypothesis.errors import Flaky

from gate import result as R
from gate.sandbox import Worker, WorkerLost
from gate.scan import scan_files
from gate.submission import SubmissionError, materialise
from gate.text import clean_output
from invariants.asserts import InvariantViolation
from invariants.protocol import FUNCTIONS, Implementation, ImplementationError, ImplementationLoadError, OutputError
from invariants.runner import InvariantFailure, InvariantSkipped, describe_value, format_failure, run_invariant

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
        self.last_call = None

    def start(self):
        self.starts += 1
        self.worker = Worker(
            scratch=self.scratch, layout=self.layout, backend=self.backend, device=self.assignment.device,
            dtype=self.assignment.dtype, limits=self.limits, forbidden=self.assignment.forbidden,
            functions={name: list(spec.params) for name, spec in FUNCTIONS.items()},
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
        self.last_call = (name, args)
        return self.worker.call(name, args, deadline, cause, late)

    def describe_last_call(self, limit=400):
        if self.last_call is None:
            return ""
        name, args = self.last_call
        params = FUNCTIONS[name].params
        text = ", ".join(f"{p}={describe_value(a)}" for p, a in zip(params, args, strict=False))
        return f"{name}({text if len(text) <= limit else text[: limit - 1] + '…'})"


class WorkerImplementation(Implementation):
    """An Implementation whose functions run in the gate's worker: numpy in, numpy out, over a pipe.

    Inputs are rounded to the implementation's dtype here in the parent (as_seen and to_backend
    keep their meaning); the worker only converts them to its backend's arrays.
    """

    in_process = False

    def __init__(self, session, functions, *, label, backend, device, dtype):
        self.session = session
        namespace = type("Remote", (), {name: staticmethod(lambda *a, _n=name: self.call(_n, *a)) for name in functions})
        super().__init__(namespace, label=label, backend=backend, device=device, dtype=dtype)

    def _rounded(self, value):
        if isinstance(value, dict):
            return {k: self._rounded(v) for k, v in value.items()}
        if isinstance(value, (list, tuple)):
            return type(value)(self._rounded(v) for v in value)
        import numpy as np

        if isinstance(value, np.ndarray):
            return self.to_numpy(self.to_backend(value), "input")
        if isinstance(value, np.generic):  # in process a numpy scalar passes through unconverted; here it becomes a number
            return value.item()
        return value

    def _answer(self, value, what):
        """The base class's conversions (lists become tuples, numbers 0-d arrays), on decoded wire values."""
        import numpy as np

        if isinstance(value, (tuple, list)):
            return tuple(self._answer(v, f"{what}[{i}]") for i, v in enumerate(value))
        if isinstance(value, dict):
            return {k: self._answer(v, f"{what}[{k!r}]") for k, v in value.items()}
        if isinstance(value, (str, np.ndarray)):
            return value
        if isinstance(value, (bool, int, float)):
            return np.asarray(value)
        raise OutputError(f"{what} returned a builtins.{type(value).__name__}, not an array")

    def call(self, name, *args):
        if name not in self.functions:
            raise AttributeError(f"{self.label} does not provide {name}")
        return self._answer(self.session.call(name, self._rounded(args)), name)

    def raw(self, name):
        raise ImplementationError(f"{name} runs in the gate's worker: its own callables never reach the parent")


# -- grading ------------------------------------------------------------------------------------


def _settings(assignment, seed):
    base = hypothesis_settings.get_profile(assignment.profile)
    extra = {"max_examples": assignment.max_examples} if assignment.max_examples else {}
    return hypothesis_settings(base, database=None, deadline=None, derandomize=seed is None, print_blob=True, **extra)


class ShrinkBudgetSpent(BaseException):
    """Hypothesis tried limits.shrink_examples examples after the first failure: report the smallest one so far."""


def _find_lost(exc):
    if isinstance(exc, (WorkerLost, ShrinkBudgetSpent)):
        return exc
    for inner in getattr(exc, "exceptions", ()):
        found = _find_lost(inner)
        if found is not None:
            return found
    return None


def _run_one(selected, impl, session, settings, seed):
    """Run one invariant; (status, reason, details, examples). WorkerLost propagates for the caller to restart."""
    inv = selected.invariant
    seen = {"case": None, "failure": None, "after": 0, "spent": False}
    budget = session.limits.shrink_examples

    def check(impl_, case):
        if seen["failure"] is not None:
            seen["after"] += 1
            if seen["after"] > budget:
                seen["spent"] = True
                raise ShrinkBudgetSpent()
        seen["case"] = case
        try:
            return inv.check(impl_, case)
        except (InvariantViolation, ImplementationError, OutputError) as exc:
            seen["failure"] = (exc, case)
            raise

    watched = dataclasses.replace(inv, check=check)
    session.invariant_deadline = time.monotonic() + session.limits.invariant_seconds

    try:
        outcome = _run_hypothesis(watched, impl, session, settings, seed, seen)
    except BaseException:  # hypothesis may report a stopped shrink as a flaky strategy: the flag says what happened
        if not seen["spent"]:
            raise
        outcome = None
    if seen["spent"]:
        return _smallest_so_far(inv, impl, seen, f"shrinking stopped after {budget} more examples: the smallest counterexample found so far")
    return outcome


def _smallest_so_far(inv, impl, seen, note):
    failure, case = seen["failure"]  # the most recent failing example is the smallest hypothesis has found
    status = "failed" if isinstance(failure, InvariantViolation) else "error"
    return status, str(failure).split("\n")[0], f"{format_failure(inv, impl, failure, case)}\n({note})", 0


def _run_hypothesis(inv, impl, session, settings, seed, seen):
    try:
        examples = run_invariant(inv, impl, settings=settings, seed=seed)
        return "passed", f"held on {examples} examples", "", examples
    except InvariantSkipped as exc:
        return "skipped", f"did not run: {exc}; a required invariant that does not run is not a pass", "", 0
    except InvariantFailure as exc:
        status = "failed" if exc.kind == "violation" else "error"
        first = str(exc).split("\n")
        problem = next((line for line in first[3:] if line and not line.startswith("  ")), first[-1])
        return status, problem, str(exc), exc.examples_to_failure or 0
    except Flaky as exc:
        return "error", "the implementation answered the same inputs differently on a second try (nondeterministic?)", str(exc), 0
    except BaseException as exc:  # noqa: BLE001 - sorted below: a lost worker, or the check choking on an answer
        lost = _find_lost(exc)
        if isinstance(lost, ShrinkBudgetSpent):
            raise
        if lost is not None:
            if seen["failure"] is not None and lost.cause in ("invariant_timeout", "run_timeout"):
                return _smallest_so_far(inv, impl, seen, f"time ran out while shrinking: {lost.message}; this example may not be the smallest")
            during = session.describe_last_call()
            again = WorkerLost(lost.cause, f"{lost.message}" + (f" during {during}" if during else ""))
            again.case = seen["case"]
            raise again from None
        if not isinstance(exc, Exception):
            raise
        where = traceback.extract_tb(exc.__traceback__)[-1]
        problem = (f"the check itself raised {type(exc).__name__}: {exc} (at {Path(where.filename).name}:{where.lineno}); "
                   "usually an answer of an unexpected shape or type — if the shapes look right, tell the course staff")
        details = format_failure(inv, impl, problem, seen["case"])
        return "error", problem.split(";")[0], details, 0


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
        impl = WorkerImplementation(session, loaded.functions, label=f"submission {Path(str(submission)).name}", backend=backend,
                                    device=assignment.device, dtype=assignment.dtype)
    except ImplementationLoadError as exc:
        _not_gradable(result, str(exc))
        return session

    settings = _settings(assignment, seed if result.seed["mode"] != "derandomized" else None)
    losses = 0
    absent = set()  # protocol functions that required invariants need and the submission lacks
    stopped = None  # why the remaining invariants are not run
    by_name = {s.name: s for s in assignment.selected}
    for inv_result in result.invariants:
        selected = by_name[inv_result.name]
        if stopped:
            inv_result.status, inv_result.reason = "not_run", stopped
            continue
        missing = impl.missing(selected.invariant.requires)
        if missing:
            inv_result.status, inv_result.reason = "missing", missing
            absent.update(name for name in selected.invariant.requires if name not in impl.functions)
            continue
        if time.monotonic() >= session.run_deadline:
            stopped = f"not run: the run's time limit ({assignment.limits.run_seconds:g} s) was reached"
            inv_result.status, inv_result.reason = "not_run", stopped
            continue
        if not session.alive:
            again = session.start()
            if again.problem is not None:
                stopped = f"not run: the worker could not be restarted ({again.problem['message']})"
                inv_result.status, inv_result.reason = "not_run", stopped
                continue
        began = time.monotonic()
        try:
            status, reason, details, examples = _run_one(selected, impl, session, settings, seed)
        except WorkerLost as lost:
            losses += 1
            details = format_failure(selected.invariant, impl, lost.message, getattr(lost, "case", None))
            status, reason, examples = "error", lost.message, 0
            session.stop()
            if lost.cause == "run_timeout":
                stopped = f"not run: the run's time limit ({assignment.limits.run_seconds:g} s) was reached"
            elif losses >= assignment.limits.max_worker_losses:
                stopped = f"not run: the worker was lost {losses} times (the limit is {assignment.limits.max_worker_losses})"
        inv_result.status, inv_result.reason, inv_result.details, inv_result.examples = status, reason, details, examples
        inv_result.seconds = round(time.monotonic() - began, 2)
        inv_result.score = inv_result.max_score if status == "passed" else 0.0
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
