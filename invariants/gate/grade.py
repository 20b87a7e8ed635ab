"""Grade one submission: the job, the session, then the grading stages, in that order; fail closed.

    result = grade("student.zip", load_assignment("invariants/gate/assignments/p01.toml"))

The job (invariants.gate.job) unpacks the submission and fixes its seed; the session (invariants.gate.session)
starts the confined worker and is the implementation the invariants call; the stages (invariants.gate.stages) run
the invariants, take away what a pass does not earn and give the verdict, each returning values. This module puts
them in order and writes what each returns into the one GradeResult every report is written from. The parent owns
hypothesis, the reference and every comparison; the verdict comes from the assignment's list alone: a missing answer,
a crash, a timeout, a skip or an early exit is a failure with a reason, never a pass.
"""

from __future__ import annotations

import dataclasses
import datetime
import os
import shutil
import tempfile
import time
import traceback
from pathlib import Path

from invariants.conventions import rounding_dtype
from invariants.gate import bitwise, confine, job, stages
from invariants.gate import result as R
from invariants.gate.session import Session, assigned_backend, captured_output, implementation
from invariants.gate.text import quoted


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
    result = _blank(submission, assignment)
    scratch = Path(tempfile.mkdtemp(prefix="gate-", dir=scratch_root))
    os.chmod(scratch, 0o755)
    session = None  # stopped below, whatever happens once it exists
    try:
        layout, seeding = _open_job(result, submission, assignment, scratch, seed, secret)
        session = Session(layout, assignment, scratch, assigned_backend(assignment), start + assignment.limits.run_seconds,
                          tool=confine.choose(assignment.tool), hidden=job.hidden_paths(submission, assignment, seeding.key, hidden))
        impl, transport = _open_session(result, session, assignment, seeding, label=f"submission {Path(str(submission)).name}")
        _run_stages(result, session, impl, transport, layout, assignment, seeding, Path(str(submission)).name, progress)
    except R.Ungraded as stop:
        _ungraded(result, stop)
    except Exception as exc:  # noqa: BLE001 - the gate's own failure still gets a report
        result.verdict = R.GATE_ERROR
        result.reason = f"the gate failed: {type(exc).__name__}: {quoted(str(exc))}"
        result.output["gate_traceback"] = traceback.format_exc()[-4000:]
    finally:
        if session is not None:
            _close_session(result, session, scratch, assignment)
        if not keep_scratch:
            shutil.rmtree(scratch, ignore_errors=True)
        result.seconds = round(time.monotonic() - start, 2)
    return result


def _blank(submission, assignment):
    """The GradeResult before anything is graded: the assignment's record and one row per selected invariant, not run."""
    return R.GradeResult(
        assignment={"name": assignment.name, "path": assignment.path, "sha256": assignment.sha256, "backend": assignment.backend,
                    "dtype": assignment.dtype, "device": assignment.device, "profile": assignment.profile,
                    "max_examples": assignment.max_examples},
        submission={"source": os.fsencode(submission).decode("utf-8", "backslashreplace")},  # a name that is not UTF-8, escaped
        started_at=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        limits=dataclasses.asdict(assignment.limits),
        excluded=[{"name": n, "reason": r} for n, r in assignment.excluded],
        invariants=[R.InvariantResult(s.name, s.invariant.component, s.invariant.statement, s.invariant.hint, s.visibility, s.points)
                    for s in assignment.selected],
        max_score=sum(s.points for s in assignment.selected),
    )


def _open_job(result, submission, assignment, scratch, seed, secret):
    """The job (invariants.gate.job) and what its code shows before it runs (invariants.gate.stages): (layout, seeding)."""
    layout = job.unpack(submission, scratch, assignment)
    result.submission.update(kind=layout.kind, sha256=layout.sha256, entry=layout.entry, files=list(layout.files))
    seeding = job.seed_for(layout, assignment, seed=seed, secret=secret)
    result.seed = seeding.record
    result.evidence = stages.scan_code(layout, assignment)
    result.fingerprints, result.similarity, copied = stages.compare_code(layout, assignment)
    result.evidence = result.evidence + copied
    return layout, seeding


def _open_session(result, session, assignment, seeding, *, label):
    """Start the worker and build the implementation the invariants call (invariants.gate.session): (impl, transport)."""
    loaded = session.start()
    result.protections = loaded.protections
    result.sandbox = {"tool": session.tool.name, "detail": session.tool.detail, "missing": list(loaded.missing),
                      "required": list(assignment.require), "seconds": round(session.worker.start_seconds, 3)}  # the sandbox's start-up
    result.submission.update(backend=loaded.backend, functions=loaded.functions)
    impl, transport, declared = implementation(session, loaded, assignment, seed=seeding.record["value"], label=label)
    result.submission["declarations"] = dict(declared)
    result.submission["rounding"] = rounding_dtype(impl)  # the rounding its answers are held to (COMPUTE_DTYPE, [assignment] rounding)
    refused = assignment.refused_declaration(declared)
    if refused:
        raise R.Ungraded(R.NOT_GRADABLE, refused)
    return impl, transport


def _run_stages(result, session, impl, transport, layout, assignment, seeding, source_name, progress):
    """The grading stages (invariants.gate.stages) in order, each row stored as it is graded, then the verdict."""
    selected = {s.name: s for s in assignment.selected}
    shown = None if progress is None else (lambda row, left: progress(result, row, left))
    for index, row in stages.run_invariants(list(result.invariants), selected, impl, session, transport, assignment,
                                            seed=seeding.value, source_name=source_name, progress=shown):
        result.invariants[index] = row
    result.submission["missing_functions"] = stages.missing_functions(result.invariants, selected, impl)
    result.invariants, result.submission["degenerate"] = stages.void_vacuous(result.invariants, selected, transport.log, assignment.dtype)
    result.bitwise = bitwise.evidence(transport.log)
    result.invariants = stages.void_forbidden(result.invariants, selected, result.evidence, layout, session.used_apis(), assignment)
    result.invariants = stages.void_copied(result.invariants, result.similarity, assignment)
    result.verdict, result.reason = stages.decide(result.invariants, result.submission, result.evidence, result.similarity, assignment)


def _ungraded(result, stop):
    """The verdict of a grading that ended before the invariants ran; a not gradable one says so on each row not run."""
    result.verdict = stop.verdict
    if stop.verdict != R.NOT_GRADABLE:
        result.reason = stop.reason
        return
    result.reason = quoted(stop.reason)
    result.invariants = [dataclasses.replace(r, reason="not run: the submission could not be graded") if r.status == "not_run" else r
                         for r in result.invariants]


def _close_session(result, session, scratch, assignment):
    """Stop the worker (a process of its uid that outlives it is the gate's fault, whatever the verdict) and keep what it left:
    its evidence, how often it started, its captured output."""
    try:
        session.stop()
    except RuntimeError as exc:
        result.verdict, result.reason = R.GATE_ERROR, f"the gate failed: {exc}"
    result.evidence = result.evidence + session.worker_evidence()
    result.worker_starts = session.starts
    result.output.update(captured_output(scratch, session.starts, assignment.limits.output_kib << 10))
