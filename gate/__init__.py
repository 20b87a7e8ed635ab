"""The CI gate: grade untrusted transformer submissions with a verdict they cannot fake.

    invariants-gate student.zip -a assignments/p01.toml -o reports/      (docs/gate.md)

The trusted parent (gate.grade) runs hypothesis, the reference and every comparison; the
submission runs in a confined worker process (gate.worker, gate.sandbox) and answers with
plain arrays over a pipe (gate.wire). This package imports nothing heavy at the top: the
worker imports gate.wire through it before it loads a submission.
"""

__all__ = ["grade", "load_assignment"]


def __getattr__(name):
    if name == "grade":
        from gate.grade import grade

        return grade
    if name == "load_assignment":
        from gate.config import load_assignment

        return load_assignment
    raise AttributeError(name)
