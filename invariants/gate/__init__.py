"""The CI gate: grade untrusted transformer submissions with a verdict they cannot fake.

    invariants-gate student.zip -a p01 -o reports/      (docs/gate.md)

The trusted parent (invariants.gate.grade) runs hypothesis, the reference and every comparison: the job
(invariants.gate.job: the submission unpacked and seeded), the session (invariants.gate.session: the worker and the
implementation the invariants call through it), then the grading stages (invariants.gate.stages). The submission runs
in a worker process (invariants.gate.worker, started by invariants.gate.sandbox) that the kernel confines to a root of
its own (invariants.gate.confine: bubblewrap, or invariants.gate.launch with unshare as root) and answers with plain
arrays over a pipe (invariants.gate.wire). What a pass earns is checked too: degenerate functions
(invariants.gate.degenerate), forbidden APIs (invariants.gate.scan) and code copied from the reference
(invariants.gate.similarity) earn nothing. One grading with its reports, batches, shards and their merge:
invariants.gate.batch; the command: invariants.gate.cli. docs/gate.md, "The gate's modules", maps them.
This package imports nothing heavy at the top.
"""

__all__ = ["grade", "load_assignment"]


def __getattr__(name):
    if name == "grade":
        from invariants.gate.grade import grade

        return grade
    if name == "load_assignment":
        from invariants.gate.config import load_assignment

        return load_assignment
    raise AttributeError(name)
