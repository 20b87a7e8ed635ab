"""The result model every report is written from: one GradeResult per submission.

Its dictionary form (as_dict) is the JSON report, whose schema is versioned (SCHEMA_VERSION)
and documented in docs/gate.md. Fields that change from run to run (timestamps, durations)
are listed in VOLATILE so that tests and staff can compare two runs.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

SCHEMA_VERSION = 3  # 3: score null without a grade, invariants[].lost; 2: sandbox, similarity, statuses vacuous and voided, submission.degenerate

# Outcomes of a whole submission, and the process exit code of each.
PASSED, FAILED, NOT_GRADABLE, GATE_ERROR = "passed", "failed", "not_gradable", "gate_error"
EXIT_CODES = {PASSED: 0, FAILED: 1, NOT_GRADABLE: 3, GATE_ERROR: 4}
GRADED = (PASSED, FAILED)  # the verdicts that carry a score; the others carry their reason instead
USAGE_ERROR_EXIT = 2

# Statuses of one invariant. Only "passed" scores; every other status is a failure (fail closed).
STATUSES = {
    "passed": "the invariant held on every example",
    "failed": "a counterexample: the implementation answered, and the answer is wrong",
    "error": "the implementation raised, answered with the wrong type, crashed, hung or exited",
    "missing": "the submission does not provide a function this invariant needs",
    "skipped": "the invariant did not run on this submission (the reason says why); never a pass",
    "not_run": "the run stopped before this invariant (a time limit, a submission that could not load)",
    "vacuous": "it held, but a function it calls was not shown to compute its component: it disagrees with the reference "
               "(or is constant, the identity, not finite or random)",
    "voided": "it held, but the code it tests uses an API the assignment forbids (on_use = \"fail\"), or copies the reference",
}
VOLATILE = ("started_at", "seconds")  # keys whose values differ between two identical runs


class Ungraded(Exception):
    """Grading ends before the invariants run, with this verdict (NOT_GRADABLE or GATE_ERROR) and its reason."""

    def __init__(self, verdict, reason):
        super().__init__(reason)
        self.verdict, self.reason = verdict, reason


@dataclass
class InvariantResult:
    name: str
    component: str
    statement: str
    hint: str
    visibility: str
    max_score: float
    score: float = 0.0
    status: str = "not_run"
    reason: str = ""  # one line
    details: str = ""  # the full failure report: statement, example, expected vs actual, hint
    examples: int = 0
    seconds: float = 0.0
    repro: str = ""  # a failing example as a plain-python script (invariants.repro), where the example made calls
    repro_arrays: dict | None = field(default=None, repr=False)  # its large inputs (an .npz beside it); not in report.json
    lost: str = ""  # the worker's loss that ended it ("died", "call_timeout", "protocol", ...): what a crash caused, no evidence of a bug
    measured: dict = field(default_factory=dict)  # a failure's figures (invariants.runner.measured_of): what the diagnosis reads

    @property
    def passed(self):
        return self.status == "passed"


@dataclass
class GradeResult:
    assignment: dict  # name, path, sha256, backend, dtype, device, profile, max_examples
    submission: dict  # source, kind, sha256, entry, backend, functions
    verdict: str = GATE_ERROR
    reason: str = ""
    max_score: float = 0.0
    seed: dict = field(default_factory=dict)  # mode ("secret", "fixed", "random"), value; secret_fingerprint, secret_source
    protections: dict = field(default_factory=dict)
    sandbox: dict = field(default_factory=dict)  # tool, detail, missing, required, seconds (the worker's start, to its hello)
    limits: dict = field(default_factory=dict)
    invariants: list = field(default_factory=list)  # of InvariantResult
    excluded: list = field(default_factory=list)  # [{"name", "reason"}]: selected by a glob, not gradable by the gate
    evidence: list = field(default_factory=list)  # [{"kind", "name", "where", "detail", "source"}]
    similarity: dict = field(default_factory=dict)  # {"reference": {score, tokens, matched, matches[]}, flag_above, fail_above, k, window}
    bitwise: dict = field(default_factory=dict)  # answers that round like the reference (invariants.gate.bitwise.evidence): staff evidence
    output: dict = field(default_factory=dict)  # stdout, stderr (escaped, capped), stdout_bytes, stderr_bytes
    worker_starts: int = 0
    started_at: str = ""
    seconds: float = 0.0
    fingerprints: dict = field(default_factory=dict, repr=False)  # similarity.portable(); written to fingerprints.json, not report.json

    @property
    def exit_code(self):
        return EXIT_CODES[self.verdict]

    @property
    def score(self):
        """The submission's one score, which every report reads: the points its invariants earned; None when the verdict carries none."""
        return sum(inv.score for inv in self.invariants) if self.verdict in GRADED else None

    def as_dict(self):
        data = asdict(self)
        for inv in data["invariants"]:
            inv.pop("repro_arrays")
        return {"schema_version": SCHEMA_VERSION, "verdict": self.verdict, "exit_code": self.exit_code, "reason": self.reason,
                "score": self.score, **{k: v for k, v in data.items() if k not in ("verdict", "reason", "fingerprints")}}


def without_volatile(data):
    """A copy of a report dictionary with timestamps and durations zeroed: equal for identical runs."""
    if isinstance(data, dict):
        return {k: (0 if k in VOLATILE else without_volatile(v)) for k, v in data.items()}
    if isinstance(data, list):
        return [without_volatile(v) for v in data]
    return data
