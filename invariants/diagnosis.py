"""Name the likely bug from the pattern of a run: which invariants failed and which held, read against the zoo's signatures.

    ranked = diagnose(failed={"norms.layer_norm_known_values", "block.agrees_with_reference"}, held={...})
    ranked[0].invariant, ranked[0].hint      # the bug its hint names, with the evidence in ranked[0].evidence

Every mutant of the zoo left a signature (`python -m invariants.mutants.matrix --whole --signatures`,
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
used to diagnose it): see invariants.mutants.matrix's diagnosis accuracy.

What the likely-bug line says then depends on what the failures show, not only on which failed
(`said`): a refusal or an exception in most of them, errors no larger than float32 rounding in a
float64 run, a sliding window in every failing example, a wrong shape or NaN where the hint names
neither. Those rules were written before measuring them on bugs no hint was written for
(tests/heldout_bugs.py: the figures are in docs/power.md).

What a failure shows is read from its figures as data (invariants.runner.measured_of: the violation's check
and tolerance, a refusal, the windows of its calls), never from its words, which may quote what a submission
wrote; a clue a failure carries no figure for is not drawn. Only a record with no figures at all (None: the
plugin's and the HTML report's suite records, written from the user's own code, until they carry them) is
read from the suite's own phrases (measured_from_words), and that reading never raises.
"""

from __future__ import annotations

import json
import math
import re
from collections import Counter
from dataclasses import dataclass
from functools import cache
from pathlib import Path

import numpy as np

from invariants.graphs import reachable_from
from invariants.protocol import FUNCTIONS
from invariants.registry import COMPONENTS, all_invariants

SIGNATURES = Path(__file__).with_name("signatures.json")


def _holders():
    """{protocol function: the components whose laws it is held to, in COMPONENTS order}."""
    holders = {}
    for component, functions in COMPONENTS.items():
        for name in functions:
            holders.setdefault(name, []).append(component)
    return holders


def _depends():
    """{component: the components it builds on, directly}, from the entries' builds_on (invariants.protocol.FUNCTIONS):
    the components holding the laws of the functions its own are built from, less those already below another of them."""
    holders = _holders()
    direct = {component: {holder for name in functions for part in FUNCTIONS[name].builds_on for holder in holders.get(part, ())} - {component}
              for component, functions in COMPONENTS.items()}
    below = {component: _closure(direct, component) for component in COMPONENTS}
    return {component: tuple(c for c in COMPONENTS if c in parts and not any(c in below[other] for other in parts))
            for component, parts in direct.items()}


def _closure(graph, start):
    """Every node reachable from `start` in graph {node: its successors} by at least one edge."""
    return reachable_from(graph.get(start, ()), lambda node: graph.get(node, ()))


DEPENDS = _depends()  # component -> the components whose functions it calls, e.g. block: (norms, attention, feed_forward)
SMOOTHING = 0.1  # pseudo-count of each co-failure frequency, drawn towards that failure's rate in the whole zoo
RAREST = 1e-3  # the rate assumed for a failure no mutant of the zoo shows
SPECIFICITY = 3.0  # weight of -log(share of the zoo that fails the candidate)
GENERIC = 2.0  # what a comparison with the reference gives up to a failing law of its own component: it fails for most bugs and names none
NON_FINITE = ", but should be finite"  # the assertion grammar's phrase for NaN and inf (invariants.asserts.assert_finite)
REFUSED = "refused chunks="  # invariants.laws.decoding's phrase for a decode split the implementation would not take
RAISED = " raised "  # "<function> raised <Type>: ...": the implementation's own exception (invariants.boundary)
FLOAT32_NOTE = "float32 rounding size"  # what a reference comparison adds when a float64 answer misses by that much
FLOAT32_ROUNDING = 8 * float(np.finfo(np.float32).eps)  # 9.5e-7: a law with a larger tolerance that fails misses by more than float32 rounds
TOLERANCE = re.compile(r"atol=([0-9.e+-]+) \+ rtol=([0-9.e+-]+)")  # measured_from_words only
WINDOW = re.compile(r"\bwindow=(\w+)")  # measured_from_words only
SHOWS = {  # evidence -> a hint that names it (matches this) keeps its place in the likely-bug line
    "refused": re.compile(r"refus|declare", re.I), "raised": re.compile(r"raise|error", re.I),
    "shape": re.compile(r"shape|reshape|transpose|view", re.I), "non-finite": re.compile(r"NaN|inf\b|finite|overflow", re.I),
    "window": re.compile(r"window", re.I),
}


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
    return _closure(DEPENDS, component)


OVER_THE_TABLE = tuple(component for component, functions in COMPONENTS.items() if not functions)  # dtypes, shapes, finite
SYMPTOMS = ("shapes", "finite")  # laws over the table that fail with most bugs of their function, naming none of them


@cache
def _function_components():
    """{a law over the table: the component holding the laws of the function it calls}: its failure is that function's."""
    holders = _holders()
    return {inv.name: holders[inv.requires[0]][0] for inv in all_invariants() if inv.component in OVER_THE_TABLE and inv.requires[0] in holders}


def _component(name):
    """The component a failing invariant speaks for: its own, or for a law over the table, its function's."""
    return _function_components().get(name, name.split(".")[0])


def root_failures(failed):
    """The failing invariants whose component depends on no other failing component (root causes first)."""
    components = {_component(name) for name in failed}
    roots = {c for c in components if not _below(c) & components}
    return {name for name in failed if _component(name) in roots}


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
    # a symptom (an answer of the wrong shape, NaN) after every failing law of a component, which can name the bug that caused it;
    # equal scores in name order: the same ranking in every process
    ranked.sort(key=lambda d: (d.invariant.split(".")[0] in SYMPTOMS, -d.score, d.invariant))
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


def _number(text):
    """A float, or None for what does not read as one."""
    try:
        return float(text)
    except ValueError:
        return None


def measured_from_words(status, reason):
    """The figures of a record that carries none (the suite's own, written from the user's code), from the suite's phrases; never raises.

    The gate never calls it: its records carry their figures, and a submission's words are never read.
    """
    tolerance = TOLERANCE.search(reason)
    bounds = [_number(found) for found in tolerance.groups()] if tolerance else []
    check = ("shape" if reason.startswith("shape of ") else "finite" if NON_FINITE in reason else "exact" if "exactly equal" in reason
             else "close" if bounds and None not in bounds else None)
    return {"check": check, **(dict(zip(("atol", "rtol"), bounds, strict=True)) if check == "close" else {}),
            "float32_sized": FLOAT32_NOTE in reason, "refused": REFUSED in reason, "raised": status == "error" and RAISED in reason,
            "windows": [None if found == "None" else found for found in WINDOW.findall(reason)]}


def non_finite_first(failures):
    """Of (invariant, reason, figures) in registry order, the ones whose answer held NaN or inf: named once, first one first."""
    return [(name, reason) for name, reason, measured in failures if measured.get("check") == "finite"]


FAILING = ("failed", "error")  # the statuses that are evidence of a bug: a wrong answer, or none


def shows(status, measured):
    """What one failure shows besides its invariant, from its figures: "refused", "raised", "shape", "non-finite", or None (a wrong value)."""
    if measured.get("refused"):
        return "refused"
    if status == "error" and measured.get("raised"):
        return "raised"
    return {"shape": "shape", "finite": "non-finite"}.get(measured.get("check"))


def _within_float32_rounding(measured):
    """Whether a failure could be float32 rounding: it measured so, it asked for bitwise equality, or its tolerance is below float32's."""
    bounds = [measured.get("atol"), measured.get("rtol")]
    return (bool(measured.get("float32_sized")) or measured.get("check") == "exact"
            or measured.get("check") == "close" and None not in bounds and max(bounds) <= FLOAT32_ROUNDING)


def float32_sized(failures):
    """Whether a float64 run's failures are float32 rounding: one measured its error of that size, and none is too large for it."""
    return any(measured.get("float32_sized") for _, _, _, measured in failures) and all(
        status == "failed" and _within_float32_rounding(measured) for _, status, _, measured in failures)


def windows_needed(failures):
    """The windows of the failing examples' calls when every call that takes a window has one (at least two of them), else ()."""
    windows = [window for _, _, _, measured in failures for window in measured.get("windows", ())]
    return tuple(dict.fromkeys(map(str, windows))) if len(windows) >= 2 and None not in windows else ()


def said(ranked, failures, hints):
    """(invariant, what the likely-bug line says of it): the top diagnosis's hint, unless the failures show something it does not name.

    In order: the top's own failure a refusal or an exception its hint is not about (the first refusal is the news;
    an exception comes before the hint); every error float32-sized; a window in every failing example (a failing law whose hint is
    about windows, else that observation); the top's own answer of the wrong shape or non-finite where its hint is about
    neither (a candidate with that evidence whose hint names it, else the evidence).
    """
    hint = {name: "" if _compares_with_reference(name) else hints.get(name, "") for name, _, _, _ in failures}  # a list of conventions names none
    evidence = {name: shows(status, measured) for name, status, _, measured in failures}
    reasons = {name: reason for name, _, reason, _ in failures}
    top = ranked[0].invariant
    if evidence[top] in ("refused", "raised") and not SHOWS[evidence[top]].search(hint[top]):
        refused = next((name for name, _, _, _ in failures if evidence[name] == "refused"), None)
        if refused:
            return refused, f"it refused an input instead of answering: {reasons[refused]}"
        return top, f"it raised instead of answering ({reasons[top]}); {hints.get(top, '')}"
    if float32_sized(failures):
        first = next(name for name, _, _, measured in failures if measured.get("float32_sized"))
        return first, ("every error is of float32 rounding size in a float64 run: the code computes in float32, which code that "
                       "does so by design declares (COMPUTE_DTYPE = 'float32'); no law is broken by more")
    candidates = [d.invariant for d in ranked]
    windows = windows_needed(failures)
    if windows:
        named = next((name for name in candidates if SHOWS["window"].search(hint[name])), None)
        return (named, hint[named]) if named else (top, (
            f"every failing example has a sliding window (window={', '.join(windows)}) and none fails without one: the window "
            "keeps the wrong keys somewhere (a query at p sees min(p + 1, w)), in the prefill or in the decode"))
    kind = evidence[top]
    if kind in ("shape", "non-finite") and not SHOWS[kind].search(hint[top]):
        named = next((name for name in candidates if evidence[name] == kind and SHOWS[kind].search(hint[name])), None)
        return (named, hint[named]) if named else (
            top, f"its answer {'has the wrong shape' if kind == 'shape' else 'holds NaN or inf'}, which its hint is not about: {reasons[top]}")
    return top, hints.get(top, "")


def sound_parts(component, failed, held):
    """The components `component` calls directly when each passed a law of its own and failed none, else ()."""
    parts = DEPENDS.get(component, ())
    sound = {name.split(".")[0] for name in held} - {name.split(".")[0] for name in failed}
    return parts if parts and set(parts) <= sound else ()


def likely_bugs(outcomes):
    """The likely bug, as lines to show (evidence indented below it), from (invariant, status, reason[, figures]); [] when nothing failed.

    The figures (a dict: invariants.runner.measured_of) are what the clues are read from; the reason is only quoted. Without
    them (a triple, or None) the suite's own phrases are read instead (measured_from_words). NaN or inf in the answers is named
    once, first; what the line says follows what the failures show (`said`). Only the invariants given are read: leave out what
    a reader must not see.
    """
    outcomes = [(name, status, reason, measured_from_words(status, reason) if measured is None else measured)
                for name, status, reason, measured in (tuple(o) + (None,) * (4 - len(o)) for o in outcomes)]  # a generator (the gate's) too
    hints = {inv.name: inv.hint for inv in all_invariants()}  # in registry order: root components first
    order = {name: i for i, name in enumerate(hints)}
    failures = sorted((o for o in outcomes if o[1] in FAILING), key=lambda f: order.get(f[0], len(order)))
    if not failures:
        return []
    failed = {name for name, _, _, _ in failures}
    held = {name for name, status, _, _ in outcomes if status == "passed"}
    lines = []
    non_finite = non_finite_first([(name, reason, measured) for name, _, reason, measured in failures])
    if non_finite:
        first, reason = non_finite[0]
        lines.append(f"non-finite answers (NaN or inf) in {len(non_finite)} failure(s), first in {first}: {reason}")
    ranked = diagnose(failed, held)
    if ranked:
        named, saying = said(ranked, failures, hints)
        lines.append(f"likely bug: {named}: {saying}")
        top = next((d for d in ranked if d.invariant == named), None)
        downstream = len(failed) - len(root_failures(failed))
        if top and len(failed) > 1:
            lines.append(f"  evidence: {len(top.explained)} of the other {len(failed) - 1} failures go with it in the zoo's signatures"
                         + (f"; {downstream} failure(s) are in components built on a failing one" if downstream else ""))
        parts = sound_parts(named.split(".")[0], failed, held)
        if parts:
            lines.append(f"  its parts hold ({', '.join(parts)}: every law of theirs that ran passed), so the bug is in how "
                         f"{named.split('.')[0]} combines them")
        if ranked[0].resembles:
            lines.append("  resembles: " + "; ".join(f"{name} ({bug})" for name, bug in ranked[0].resembles))
        others = [d.invariant for d in ranked if d.invariant != named]
        if others:
            lines.append("  next most likely: " + ", ".join(others[:2]))
    return lines
