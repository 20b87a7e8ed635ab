"""The session: one submission's confined worker, restarted after it is lost, and the implementation the invariants call through it.

    session = Session(layout, assignment, scratch, backend, run_deadline, tool=tool, hidden=hidden)
    loaded = session.start()                                         # the worker imported the submission
    impl, transport, declared = implementation(session, loaded, assignment, seed=seed, label=label)

The worker answers with plain arrays (invariants.gate.sandbox); WorkerTransport holds each answer to the
protocol's rules again in the parent and keeps the call log that the grading stages judge
(invariants.gate.degenerate). What the worker printed is read back by captured_output.
"""

from __future__ import annotations

import sys
import sysconfig
import time
from types import SimpleNamespace

from invariants.boundary import to_numpy
from invariants.conventions import CONVENTIONS, read_declarations
from invariants.failure_text import describe_value
from invariants.gate import degenerate
from invariants.gate.result import GATE_ERROR, NOT_GRADABLE, Ungraded
from invariants.gate.sandbox import Worker, WorkerLost, read_capture
from invariants.gate.text import clean_output, cut_output
from invariants.protocol import FUNCTIONS, Implementation, ImplementationError, ImplementationLoadError, OutputError


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

    def worker_evidence(self):
        """What the workers reported of the submission's code (forbidden APIs, blocked imports), each once, marked as the worker's."""
        out = []
        for item in self.evidence:
            item = {"source": "worker", **item}
            if item not in out:
                out.append(item)
        return out

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


def assigned_backend(assignment):
    """The backend the assignment grades with; None where it says "any" (the submission's BACKEND decides)."""
    return assignment.backend if assignment.backend != "any" else None


def graded_backend(loaded, assignment):
    """The backend the submission is graded with: the assignment's, or where it says "any" the one the submission declares.
    Ungraded where the worker refused to grade (a protection the assignment requires is missing), the submission could not
    be loaded, or its BACKEND does not fit."""
    if loaded.problem is not None:
        raise Ungraded(GATE_ERROR if loaded.problem["kind"] == "refused" else NOT_GRADABLE, loaded.problem["message"])
    wanted = assigned_backend(assignment)
    declared = loaded.backend  # the worker already converts to it when the assignment says "any"
    if wanted is None and declared not in ("numpy", "torch"):
        raise Ungraded(NOT_GRADABLE, f"the submission says BACKEND = {declared!r}: set BACKEND = 'numpy' or 'torch' in it")
    if wanted is not None and declared is not None and declared != wanted:
        raise Ungraded(NOT_GRADABLE, f"the assignment is graded with the {wanted} backend, but the submission says BACKEND = {declared!r}")
    return wanted or declared


def implementation(session, loaded, assignment, *, seed, label):
    """The Implementation the invariants call, its WorkerTransport and the declarations the submission made ({convention: value});
    Ungraded (not gradable) where its functions or declarations break the protocol."""
    session.backend = graded_backend(loaded, assignment)
    try:
        import invariants.reference.numpy as reference

        declared = read_declarations(SimpleNamespace(**loaded.declarations))
        transport = WorkerTransport(session, loaded.functions, assignment.graded_under(declared),
                                    seed=seed, reference=reference, dtype=assignment.dtype)
        impl = Implementation(transport=transport, label=label, backend=session.backend, device=assignment.device, dtype=assignment.dtype)
    except (ImplementationLoadError, ValueError) as exc:
        raise Ungraded(NOT_GRADABLE, str(exc)) from None
    return impl, transport, declared


# Longest first, so that site-packages is named before the prefix that contains it.
_PATHS = sysconfig.get_paths()
_INSTALL_PATHS = sorted(
    {_PATHS["purelib"]: "<site-packages>", _PATHS["platlib"]: "<site-packages>", _PATHS["stdlib"]: "<stdlib>", sys.prefix: "<python>"}.items(),
    key=lambda pair: -len(pair[0]),
)


def captured_output(scratch, starts, cap):
    """{stdout, stdout_bytes, stderr, stderr_bytes}: each stream's captured output of every worker start, as its head and tail of at most
    `cap` bytes in all (read in place: a flood is never loaded whole) with the middle counted; the byte count is the whole's (as
    written, where it was cut)."""
    output = {}
    for stream in ("stdout", "stderr"):
        parts = []
        for generation in range(1, starts + 1):
            path = scratch / "capture" / f"{stream}.{generation}.txt"
            if path.exists() and path.stat().st_size:
                parts += [f"[worker start {generation}]\n".encode(), path] if starts > 1 else [path]
        size, head, tail = read_capture(parts, cap // 2)
        if tail is None:
            head = _portable(head, scratch)
            output[f"{stream}_bytes"], output[stream] = len(head), clean_output(head, cap)
        else:
            output[f"{stream}_bytes"] = size
            output[stream] = cut_output(_portable(head, scratch), _portable(tail, scratch), size - len(head) - len(tail))
    return output


def _portable(data, scratch):
    """Captured bytes with the scratch folder and the install's paths named, not written out: the same report on every run and machine."""
    data = data.replace(str(scratch).encode(), b"<scratch>")
    for place, name in _INSTALL_PATHS:
        data = data.replace(place.encode(), name.encode())
    return data
