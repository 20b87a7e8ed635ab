"""The job: one submission unpacked into its scratch folder, the seed it is graded under, and the host paths its worker must not see.

    layout = unpack(submission, scratch, assignment)                # Ungraded: not gradable
    seeding = seed_for(layout, assignment, seed=None, secret=None)  # Ungraded: a gate error (no course secret)
    hidden = hidden_paths(submission, assignment, seeding.key)

The assignment itself is loaded by invariants.gate.config; nothing here starts a process.
"""

from __future__ import annotations

import hashlib
import hmac
import os
from dataclasses import dataclass
from pathlib import Path

from invariants.gate.confine import BLOCKED_PACKAGES
from invariants.gate.result import GATE_ERROR, NOT_GRADABLE, Ungraded
from invariants.gate.secret import CourseSecret, SecretError, course_secret, kept_path
from invariants.gate.submission import SubmissionError, materialise


def derive_seed(secret, submission_sha256):
    """A 64-bit hypothesis seed from a course secret and a submission's hash (HMAC-SHA256)."""
    key = secret.encode() if isinstance(secret, str) else secret
    return int.from_bytes(hmac.new(key, submission_sha256.encode(), hashlib.sha256).digest()[:8], "big")


@dataclass(frozen=True)
class Seeding:
    """The seed a submission is graded under."""

    record: dict  # as the report gives it: mode ("fixed", "secret", "random"), value; secret_fingerprint, secret_source
    value: object  # the seed the invariants run under
    key: CourseSecret | None = None  # the course secret it was derived from


def unpack(submission, scratch, assignment):
    """The submission (a path) unpacked under scratch, as an invariants.gate.submission.Layout; Ungraded (not gradable) where it cannot be."""
    try:
        return materialise(submission, scratch, entry=assignment.entry, blocked=BLOCKED_PACKAGES)
    except SubmissionError as exc:
        raise Ungraded(NOT_GRADABLE, str(exc)) from None


def seed_for(layout, assignment, *, seed=None, secret=None):
    """The Seeding: a fixed seed as given; else derived from the course secret (given, or the course's: invariants.gate.secret)
    and the submission's hash; without a secret (a --visible-only preview) a fresh one, never a grade of record.
    Ungraded (a gate error) where the course's secret is required and missing."""
    if seed is not None:
        return Seeding({"mode": "fixed", "value": int(seed)}, seed)
    try:
        key = secret if isinstance(secret, CourseSecret) else CourseSecret(secret, "given") if secret else course_secret(assignment)
    except SecretError as exc:
        raise Ungraded(GATE_ERROR, str(exc)) from None
    if key is None:
        value = int.from_bytes(os.urandom(8), "big")
        return Seeding({"mode": "random", "value": value}, value)
    value = derive_seed(key.value, layout.sha256)
    return Seeding({"mode": "secret", "value": value, "secret_fingerprint": key.fingerprint, "secret_source": key.source}, value, key)


def hidden_paths(submission, assignment, key, more=()):
    """The host paths the worker must not see: the assignment, the course secret (its file, the kept one, the key's), the submission
    as given and its folder, and `more` (a batch's folder, the reports)."""
    source = Path(str(submission)).resolve()
    return [assignment.path, assignment.secret_file, str(kept_path()), key and key.path, str(source), str(source.parent), *more]
