"""The course secret that seeds each submission's examples: given by the course, or made by the gate on first use and kept.

    key = course_secret(assignment, secret_env="GATE_SECRET")   # a CourseSecret, or None for a preview

A grade never rests on inputs a student can know in advance: with no secret given (--secret-file,
--secret-env, the assignment's [seed] secret_file or secret_env, set and not empty), the gate makes
one with os.urandom on first use and keeps it in the course's own folder, KEPT_FILE under
$INVARIANTS_GATE_SECRET_HOME, else $XDG_CONFIG_HOME/invariants-gate, else ~/.config/invariants-gate:
per user, outside the project and every submission, a folder of mode 0700 holding a file of mode 0600
(refused when it is readable by anyone else), and hidden from every worker (invariants.gate.grade). An
assignment with [seed] secret = "required" refuses to grade without a given secret instead; a
--visible-only preview uses a fresh random seed and keeps nothing.
"""

from __future__ import annotations

import hashlib
import os
import stat
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

HOME_ENV = "INVARIANTS_GATE_SECRET_HOME"  # the folder that holds the kept secret (tests and CI point it elsewhere)
KEPT_FILE = "course-secret"
POLICIES = ("make", "required")  # [seed] secret: what the gate does when no secret is given (a preview: "random")


class SecretError(Exception):
    """No usable course secret: the message names the fix."""


@dataclass(frozen=True)
class CourseSecret:
    """A course secret and where it came from ("file", "env:NAME", "kept" or "given"), and its file, which workers must not see."""

    value: str
    source: str
    path: str | None = None

    @property
    def fingerprint(self):
        """A short, non-reversible name for the secret, so staff can tell which one graded a report."""
        return hashlib.sha256(b"invariants-gate:" + self.value.encode()).hexdigest()[:12]


def kept_path():
    """Where the gate keeps the secret it makes: $INVARIANTS_GATE_SECRET_HOME, $XDG_CONFIG_HOME/invariants-gate or ~/.config/invariants-gate."""
    home = os.environ.get(HOME_ENV) or os.path.join(os.environ.get("XDG_CONFIG_HOME") or os.path.expanduser("~/.config"), "invariants-gate")
    return Path(home).absolute() / KEPT_FILE


def course_secret(assignment, *, secret_file=None, secret_env=None):
    """The secret that grades: the given file, the given environment variable, then the assignment's; else its [seed] secret policy.

    The policy "make" keeps (making it on first use) the secret at kept_path(); "required"
    raises SecretError; "random" (a --visible-only preview) is None: a fresh seed per run.
    """
    file = secret_file or assignment.secret_file
    env = secret_env or assignment.secret_env
    if file:
        value = Path(file).read_text(encoding="utf-8").strip()
        if not value:
            raise SecretError(f"the course secret file {file} is empty: put the secret in it")
        return CourseSecret(value, "file", str(Path(file).absolute()))
    if env and os.environ.get(env, "").strip():
        return CourseSecret(os.environ[env].strip(), f"env:{env}")
    if assignment.secret_policy == "random":
        return None
    if assignment.secret_policy == "required":
        named = f"${env} is not set" if env else "no secret is given"
        raise SecretError(f"{assignment.path} requires a course secret ([seed] secret = \"required\") and {named}: "
                          f"set {'$' + env if env else 'one'} in CI, or pass --secret-env VAR or --secret-file PATH")
    return _kept()


def _kept():
    """The secret kept at kept_path(), made with os.urandom (atomically, mode 0600) when there is none; one line on stderr when made."""
    path = kept_path()
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    made = False
    if not path.exists():
        fd, draft = tempfile.mkstemp(dir=path.parent, prefix=f".{KEPT_FILE}.")  # mode 0600
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as out:
                out.write(os.urandom(32).hex() + "\n")
                out.flush()
                os.fsync(out.fileno())
            try:
                os.link(draft, path)  # atomic, and never over a secret another gate process made meanwhile
                made = True
            except FileExistsError:
                pass
        finally:
            os.unlink(draft)
    info = path.lstat()
    if not stat.S_ISREG(info.st_mode) or info.st_uid != os.getuid() or info.st_mode & 0o077:
        raise SecretError(f"the kept course secret {path} must be a file of yours that no one else may read: chmod 600 {path}")
    value = path.read_text(encoding="utf-8").strip()
    if not value:
        raise SecretError(f"the kept course secret {path} is empty: delete it and the gate makes a new one")
    secret = CourseSecret(value, "kept", str(path))
    if made:
        print(f"invariants-gate: made a course secret (fingerprint {secret.fingerprint}) at {path}; every grade is seeded from it: "
              f"keep it, and give every CI shard one secret (--secret-env)", file=sys.stderr)
    return secret
