"""Name the likely bug from the pattern of a run: which invariants failed and which held, read against the zoo's signatures.

    ranked = diagnose(failed={"norms.layer_norm_known_values", "block.agrees_with_reference"}, held={...})
    ranked[0].invariant, ranked[0].hint      # the bug its hint names, with the evidence in ranked[0].evidence

Every mutant of the zoo left a signature (`python -m mutants.matrix --whole --signatures`,
shipped as invariants/signatures.json): the invariants it fails and those it holds. A
candidate is a failing invariant, standing for the bug its hint names. Root causes come first:
a candidate's component must not depend on another failing component (a failing layer_norm
explains the block and model failures above it, not the other way round). Among the roots, the
candidates are ranked by how likely the other failures are when that bug is present
(naive Bayes over the signatures of the mutants that name it, or else of those that fail it,
each rate smoothed towards the whole zoo's, so a bug no mutant shows yet costs nothing),
times how specific the candidate is (an invariant that fails for half the zoo says little); a
comparison with the reference comes after the failing laws of its component, since it fails for
nearly every bug there and its hint can only list conventions.
The constants were chosen on the zoo with leave-one-out (a mutant's own signature is never
used to diagnose it): see mutants.matrix's diagnosis accuracy.
"""

from __future__ import annotations

import json
import math
from collections import Counter
from dataclasses import dataclass
from functools import cache
from pathlib import Path

from invariants.registry import all_invariants

SIGNATURES = Path(__file__).with_name("signatures.json")
DEPENDS = {  # component -> the components whose functions it calls (the reference's structure)
    "softmax": (), "norms": (), "activation": (), "attention": ("softmax",), "feed_forward": ("activation",),
    "block": ("norms", "attention", "feed_forward"), "model": ("block",), "moe": ("softmax", "feed_forward"),
    # the modern decoder: gqa and masking check one function (gqa_attention), the Llama block calls it with RoPE, RMSNorm, SwiGLU
    "rope": (), "gqa": ("softmax",), "masking": ("softmax",), "swiglu": (), "llama": ("norms", "rope", "gqa", "masking", "swiglu"),
    "decoding": ("llama",), "cross_attention": ("norms", "attention", "feed_forward"),
    "counts": (), "course": (), "dtypes": (),  # closed forms and the course's helpers; a dtype leak is its own root
}
SMOOTHING = 0.1  # pseudo-count of each co-failure frequency, drawn towards that failure's rate in the whole zoo
RAREST = 1e-3  # the rate assumed for a failure no mutant of the zoo shows
SPECIFICITY = 3.0  # weight of -log(share of the zoo that fails the candidate)
GENERIC = 2.0  # what a comparison with the reference gives up to a failing law of its own component: it fails for most bugs and names none
NON_FINITE = ", but should be finite"  # the assertion grammar's phrase for NaN and inf (invariants.asserts.assert_finite)


@dataclass(frozen=True)
class Diagnosis:
    """One likely cause: the invariant whose hint names it, its score and the evidence."""

    invariant: str
    score: float
    explained: tuple  # the other failures that mutants with this bug also show
    resembles: tuple  # (mutant, bug) of the zoo whose signatures are closest to the run's


def named_by(signature):
    """The invariants whose hints name a signature's bug: its killed_by, and any others the mutant lists."""
    return set(signature.get("named_by") or (signature["killed_by"],))


@cache
def load_signatures(path=SIGNATURES):
    """{mutant: {"bug", "killed_by", "named_by", "failing", "held"}} from the shipped file ({} when it is absent)."""
    path = Path(path)
    return json.loads(path.read_text()) if path.exists() else {}


def _below(component):
    """Every component `component` depends on, directly or not."""
    seen, todo = set(), list(DEPENDS.get(component, ()))
    while todo:
        current = todo.pop()
        if current not in seen:
            seen.add(current)
            todo.extend(DEPENDS.get(current, ()))
    return seen


def root_failures(failed):
    """The failing invariants whose component depends on no other failing component (root causes first)."""
    components = {name.split(".")[0] for name in failed}
    roots = {c for c in components if not _below(c) & components}
    return {name for name in failed if name.split(".")[0] in roots}


def _compares_with_reference(name):
    """Whether an invariant is an agreement with the float64 reference (e.g. block.agrees_with_reference) rather than a law."""
    return name.endswith(("agrees_with_reference", "agree_with_reference"))


def _jaccard(a, b):
    return len(a & b) / len(a | b) if a | b else 0.0


def diagnose(failed, held, signatures=None, *, exclude=()):
    """Candidates for the bug behind `failed` (invariant names) given `held`, most likely first; [] when nothing failed.

    `signatures` defaults to the shipped ones; mutants named in `exclude` are left out (leave-one-out).
    """
    failed, held = set(failed), set(held)
    signatures = load_signatures() if signatures is None else signatures
    zoo = {name: (named_by(s), set(s["failing"]), s["bug"]) for name, s in signatures.items() if name not in exclude}
    rate = Counter(j for _, fails, _ in zoo.values() for j in fails)  # how many of the zoo's mutants fail each invariant
    ranked = []
    for candidate in sorted(root_failures(failed)):
        named = [fails for names, fails, _ in zoo.values() if candidate in names]
        like = named or [fails for _, fails, _ in zoo.values() if candidate in fails]  # mutants that show this bug
        others = sorted(failed - {candidate})  # sorted: the same float sums, and so the same ties, in every process
        # P(j fails | this bug), an m-estimate: with no mutant to learn from, the zoo's base rate of j (no evidence either way)
        base = {j: max(rate[j] / max(len(zoo), 1), RAREST) for j in others}
        log_likelihood = sum(math.log((sum(j in f for f in like) + SMOOTHING * base[j]) / (len(like) + SMOOTHING)) for j in others)
        share = (rate[candidate] + 1) / (len(zoo) + 2)
        explained = tuple(sorted(j for j in others if like and sum(j in f for f in like) * 2 >= len(like)))
        score = log_likelihood - SPECIFICITY * math.log(share) - GENERIC * _compares_with_reference(candidate)
        ranked.append(Diagnosis(candidate, score, explained, ()))
    ranked.sort(key=lambda d: (-d.score, d.invariant))  # equal scores in name order: the same ranking in every process
    if ranked:
        closest = sorted(zoo.items(), key=lambda item: -_jaccard(item[1][1] & (failed | held), failed))[:3]
        ranked[0] = Diagnosis(ranked[0].invariant, ranked[0].score, ranked[0].explained,
                              tuple((name, bug) for name, (_, fails, bug) in closest if fails & failed))
    return ranked


def leave_one_out_accuracy(signatures):
    """(share, misses): how often the top diagnosis of each mutant, without its own signature, is an invariant whose hint names its bug."""
    misses = []
    for name, s in signatures.items():
        ranked = diagnose(s["failing"], s["held"], signatures, exclude={name})
        top = ranked[0].invariant if ranked else None
        if top not in named_by(s):
            misses.append((name, top, s["killed_by"]))
    return (1 - len(misses) / len(signatures) if signatures else 0.0), misses


def non_finite_first(failures):
    """Of (invariant, reason) pairs in registry order, the ones whose answer held NaN or inf: named once, first one first."""
    return [(name, reason) for name, reason in failures if NON_FINITE in reason]


FAILING = ("failed", "error")  # the statuses that are evidence of a bug: a wrong answer, or none


def likely_bugs(outcomes):
    """The likely bug, as lines to show (evidence indented below it), from (invariant, status, reason) triples; [] when nothing failed.

    NaN or inf in the answers is named once, first. Only the invariants given are read: leave out what a reader must not see.
    """
    outcomes = list(outcomes)
    hints = {inv.name: inv.hint for inv in all_invariants()}  # in registry order: root components first
    order = {name: i for i, name in enumerate(hints)}
    failures = sorted(((name, reason) for name, status, reason in outcomes if status in FAILING), key=lambda f: order.get(f[0], len(order)))
    if not failures:
        return []
    failed = {name for name, _ in failures}
    held = {name for name, status, _ in outcomes if status == "passed"}
    lines = []
    non_finite = non_finite_first(failures)
    if non_finite:
        first, reason = non_finite[0]
        lines.append(f"non-finite answers (NaN or inf) in {len(non_finite)} failure(s), first in {first}: {reason}")
    ranked = diagnose(failed, held)
    if ranked:
        top = ranked[0]
        downstream = len(failed) - len(root_failures(failed))
        lines.append(f"likely bug: {top.invariant}: {hints.get(top.invariant, '')}")
        if len(failed) > 1:
            lines.append(f"  evidence: {len(top.explained)} of the other {len(failed) - 1} failures go with it in the zoo's signatures"
                         + (f"; {downstream} failure(s) are in components built on a failing one" if downstream else ""))
        if top.resembles:
            lines.append("  resembles: " + "; ".join(f"{name} ({bug})" for name, bug in top.resembles))
        if len(ranked) > 1:
            lines.append("  next most likely: " + ", ".join(d.invariant for d in ranked[1:3]))
    return lines
