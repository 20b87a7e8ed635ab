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

What the likely-bug line says then depends on what the counterexamples measured, not only on which
invariants failed (`said`): a refusal or an exception; errors no larger than float32 rounding in a float64
run, or no larger than float16's; how many keys a query saw against its window, and whether any after its own
position; which side of the diagonal
the weights are zero on, and the axis they sum to one over; an answer that is the reference's hidden state
without its final norm; the first position at which a decode disagrees with the full forward; a norm's error that
grows as a row's mean square nears eps (an eps bug, never float32 rounding); a sliding window in every failing
example; a wrong shape or NaN where the hint names neither. Where a figure names the cause, the line names that
one cause and no other. The rules were written before measuring them on bugs they never saw (tests/heldout_bugs.py,
tests/heldout_bugs_2.py, tests/heldout_bugs_3.py: the figures are in docs).

Every clue is read from a failure's figures as data (invariants.runner.measured_of: the violation's fields
and what its law measured, a refusal, the windows of its calls), never from its words, which may quote what
a submission wrote: a record without figures gets no clue.
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
from invariants.runner import FAILING

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
FLOAT32_ROUNDING = 8 * float(np.finfo(np.float32).eps)  # 9.5e-7: a law with a larger tolerance that fails misses by more than float32 rounds
FLOAT32_UNITS = 100  # an error of at most this many float32 roundings (of the expected values' scale) is float32 arithmetic's
FLOAT16_UNITS = 8 * float(np.finfo(np.float16).eps / np.finfo(np.float32).eps)  # 8 float16 roundings, in float32 roundings
EPS_GROWTH = 8  # an error of eps's making grows 2^5- to 2^10-fold from the eps probe's far mean square to its near one; rounding's, ~1
SHOWS = {  # evidence -> a hint that names it (matches this) keeps its place in the likely-bug line; the suite's own hints, never a failure
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


def non_finite_first(failures):
    """Of (invariant, reason, figures) in registry order, the ones whose answer held NaN or inf: named once, first one first."""
    return [(name, reason) for name, reason, measured in failures if measured.get("check") == "finite"]


def shows(status, measured):
    """What one failure shows besides its invariant, from its figures: "refused", "raised", "shape", "non-finite", or None (a wrong value)."""
    if measured.get("refused"):
        return "refused"
    if status == "error" and measured.get("raised"):
        return "raised"
    return {"shape": "shape", "finite": "non-finite"}.get(measured.get("check"))


def _number(measured, key):
    """A figure that is a finite number, else None (absent, or "nan", "inf": invariants.runner.measured_of)."""
    value = measured.get(key)
    return value if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def _float32_units(measured):
    """The failure's largest error in float32 roundings when it is a value comparison of a float64 run, else None."""
    return _number(measured, "float32_units") if measured.get("check") == "close" and measured.get("dtype") == "float64" else None


def _is_float32_sized(measured):
    """Whether a failure measured its error as float32 rounding: its law said so, or its error is a few float32 roundings."""
    units = _float32_units(measured)
    return bool(measured.get("float32_sized")) or units is not None and units <= FLOAT32_UNITS


def _within_float32_rounding(measured):
    """Whether a failure could be float32 rounding: it measured so, it asked for bitwise equality, or its tolerance is below float32's."""
    bounds, units = [measured.get("atol"), measured.get("rtol")], _float32_units(measured)
    if units is not None:  # the assertion measured its error: that decides
        return _is_float32_sized(measured)
    return (_is_float32_sized(measured) or measured.get("check") == "exact"
            or measured.get("check") == "close" and None not in bounds and max(bounds) <= FLOAT32_ROUNDING)


def float32_sized(failures):
    """Whether a float64 run's failures are float32 rounding: one measured its error of that size, and none is too large for it
    or grows as a norm's mean square nears eps, which rounding does not."""
    return any(_is_float32_sized(measured) for _, _, _, measured in failures) and all(
        status == "failed" and _within_float32_rounding(measured) and not _eps_growth(measured) for _, status, _, measured in failures)


def float16_sized(failures):
    """Whether every failure of a float64 run is a value comparison missing by a few float16 roundings, and by more than float32's."""
    units = [_float32_units(measured) for _, status, _, measured in failures if status == "failed"]
    return len(units) == len(failures) and None not in units and max(units) <= FLOAT16_UNITS and min(units) > FLOAT32_UNITS


def windows_needed(failures):
    """The windows of the failing examples' calls when every call that takes a window has one (at least two of them), else ()."""
    windows = [window for _, _, _, measured in failures for window in measured.get("windows", ())]
    return tuple(dict.fromkeys(map(str, windows))) if len(windows) >= 2 and None not in windows else ()


def _future_keys(m):
    """A query that saw keys after its own position (invariants.laws.masking's keys_after): the causal mask, not the window."""
    after, hidden = _number(m, "keys_after"), _number(m, "window_keys_hidden")
    if not after:
        return None
    if hidden:
        return (f"the causal mask is on the wrong side of the diagonal (transposed, tril for triu): the query at {m.get('query')} saw "
                f"{after} key(s) after its own position and none of {hidden} key(s) before it that it should see")
    return (f"the causal mask does not hide the future: the query at {m.get('query')} saw {after} key(s) after its own position "
            "(among a decode chunk's own queries too, where the keys are the cache and the chunk)")


def _window_keys(m):
    """A query that saw more or fewer keys than its window gives it (invariants.laws.masking's keys_seen), none of them after it."""
    seen, expected, window = _number(m, "keys_seen"), _number(m, "keys_expected"), m.get("window")
    if seen is None or expected is None or seen == expected or _number(m, "keys_after"):
        return None
    wrong = ("one key too wide (j >= p - w keeps w + 1 keys)" if seen == expected + 1 else
             "one key too narrow (j > p - w + 1 keeps w - 1 keys)" if seen == expected - 1 else f"{seen - expected:+d} keys off")
    return f"the sliding window is {wrong}: the query at {m.get('query')} saw {seen} keys where window={window} gives it {expected}"


def _mask_side(m):
    """Weights zero below the diagonal and not above it: the causal mask hides the past, not the future (invariants.laws.attention)."""
    above, below = _number(m, "zero_share_above"), _number(m, "zero_share_below")
    if above is None or below is None or not (below >= 0.99 and above < 0.99):
        return None
    return (f"the causal mask is on the wrong side of the diagonal (transposed, tril for triu): {below:.0%} of the weights on past keys "
            f"are zero and only {above:.0%} of those on future keys: each query sees itself and the future")


def _softmax_axis(m):
    """Weights that sum to one over the queries, not the keys (invariants.laws.attention's columns_sum_to_one)."""
    if not m.get("columns_sum_to_one"):
        return None
    return "the softmax normalises over the query axis (axis=-2): the weights' columns sum to 1, not their rows over the keys"


def _final_norm(m):
    """An answer that is the reference's last hidden state without the final norm, times the head (invariants.laws.llama)."""
    if not m.get("agrees_pre_norm"):
        return None
    return "the final RMSNorm is missing: the logits agree with the reference's last hidden state taken to the head without it"


def _first_decode_position(m):
    """A decode that agrees with the full forward over the prefill and first disagrees where a decode step starts."""
    first, starts, window = _number(m, "first_position"), m.get("chunk_starts") or [], _number(m, "window")
    if first is None or len(starts) < 2 or first < starts[1]:
        return None
    if window is not None and first >= window:
        return (f"the decode agrees with the full forward up to position {first - 1} and first disagrees at {first}, once the window "
                f"({window}) is full: the decode's window keeps the wrong cached keys")
    return (f"the decode agrees with the full forward over the prefill (positions 0 to {starts[1] - 1}) and first disagrees at position "
            f"{first}, in a decode step: a decode step's tokens are not at past_length + i")


def _eps_growth(m):
    """How many times a norm's relative error grows from a mean square far from eps to one near it (invariants.laws.norms'
    errors_far_from_and_near_eps: the far error counted as at least float32 rounding), when it grows EPS_GROWTH-fold or more."""
    far, near = _number(m, "norm_error_far"), m.get("norm_error_near")
    near = float(near) if near in ("nan", "inf") else _number(m, "norm_error_near")  # NaN near eps and not far from it: grown
    if far is None or near is None:
        return None
    growth = math.inf if math.isnan(near) else near / max(far, FLOAT32_ROUNDING)
    return growth if growth >= EPS_GROWTH else None


def _eps_misplaced(m):
    """A norm whose error grows as a row's mean square nears eps: eps is not where it belongs, which no rounding would show."""
    growth = _eps_growth(m)
    if growth is None:
        return None
    grown = "turns to NaN" if math.isinf(growth) else f"grows {growth:,.0f}-fold"
    far, near = _number(m, "norm_error_far_at"), _number(m, "norm_error_near_at")  # the mean squares, in eps's, the law looked at
    at = f" when a row's mean square is brought from {far:,g}·eps to {near:,g}·eps" if far and near else " as a row's mean square nears eps"
    return f"eps is not inside the root as given (added outside it, squared, or dropped): the norm's error {grown}{at}, where rounding errs alike"


# a figure that names one cause, in order; those of ROOT_RULES read only where no component below has failed (a block's norm
# that errs like an eps bug above a failing rms_norm is that rms_norm's)
MEASURED_RULES = (_future_keys, _window_keys, _mask_side, _softmax_axis, _final_norm, _first_decode_position, _eps_misplaced)
ROOT_RULES = (_eps_misplaced,)


def measured_cause(failures):
    """(invariant, cause) from the first failure (root components first) whose figures name one cause (MEASURED_RULES), else None."""
    roots = root_failures({name for name, _, _, _ in failures})
    for rule in MEASURED_RULES:
        for name, _, _, measured in failures:
            if rule in ROOT_RULES and name not in roots:
                continue
            cause = rule(measured)
            if cause:
                return name, cause
    return None


@dataclass(frozen=True)
class LikelyBug:
    """What the likely-bug line says: the failing invariant it names, the cause, and whether a figure of a counterexample named it."""

    invariant: str
    cause: str
    measured: bool  # one cause, read from the figures; else the invariant's hint (which may list several)


def said(ranked, failures, hints):
    """The LikelyBug: the top diagnosis's hint, unless the failures show something it does not name.

    In order: the top's own failure a refusal or an exception its hint is not about (the first refusal is the news;
    an exception comes before the hint); every error float32-sized; a figure that names one cause (measured_cause); every
    error float16-sized; a window in every failing example (a failing law whose hint is about windows, else that observation);
    the top's own answer of the wrong shape or non-finite where its hint is about neither (a candidate with that evidence
    whose hint names it, else the evidence).
    """
    hint = {name: "" if _compares_with_reference(name) else hints.get(name, "") for name, _, _, _ in failures}  # a list of conventions names none
    evidence = {name: shows(status, measured) for name, status, _, measured in failures}
    reasons = {name: reason for name, _, reason, _ in failures}
    top = ranked[0].invariant
    if evidence[top] in ("refused", "raised") and not SHOWS[evidence[top]].search(hint[top]):
        refused = next((name for name, _, _, _ in failures if evidence[name] == "refused"), None)
        if refused:
            return LikelyBug(refused, f"it refused an input instead of answering: {reasons[refused]}", True)
        return LikelyBug(top, f"it raised instead of answering ({reasons[top]}); {hints.get(top, '')}", False)
    if float32_sized(failures):
        first = next(name for name, _, _, measured in failures if _is_float32_sized(measured))
        return LikelyBug(first, "every error is of float32 rounding size in a float64 run: the code computes in float32, which code that "
                                "does so by design declares (COMPUTE_DTYPE = 'float32'); no law is broken by more", True)
    measured = measured_cause(failures)
    if measured:
        return LikelyBug(*measured, True)
    if float16_sized(failures):
        return LikelyBug(top, "every error is a few float16 roundings in a float64 run, larger than float32's: part of the code "
                              "computes in float16 or bfloat16 (a stray .half(), autocast)", True)
    candidates = [d.invariant for d in ranked]
    windows = windows_needed(failures)
    if windows:
        named = next((name for name in candidates if SHOWS["window"].search(hint[name])), None)
        return LikelyBug(named, hint[named], False) if named else LikelyBug(top, (
            f"every failing example has a sliding window (window={', '.join(windows)}) and none fails without one: the window "
            "keeps the wrong keys somewhere (a query at p sees min(p + 1, w)), in the prefill or in the decode"), True)
    kind = evidence[top]
    if kind in ("shape", "non-finite") and not SHOWS[kind].search(hint[top]):
        named = next((name for name in candidates if evidence[name] == kind and SHOWS[kind].search(hint[name])), None)
        return LikelyBug(named, hint[named], False) if named else LikelyBug(
            top, f"its answer {'has the wrong shape' if kind == 'shape' else 'holds NaN or inf'}, which its hint is not about: {reasons[top]}", True)
    return LikelyBug(top, hints.get(top, ""), False)


def sound_parts(component, failed, held):
    """The components `component` calls directly when each passed a law of its own and failed none, else ()."""
    parts = DEPENDS.get(component, ())
    sound = {name.split(".")[0] for name in held} - {name.split(".")[0] for name in failed}
    return parts if parts and set(parts) <= sound else ()


def likely_bug(outcomes):
    """(LikelyBug or None, non-finite failures, ranked diagnoses, failed, held) from (invariant, status, reason[, figures]) in any order.

    The figures (a dict: invariants.runner.measured_of) are what the clues are read from; the reason is only quoted. Only the
    invariants given are read: leave out what a reader must not see.
    """
    outcomes = [(name, status, reason, (figures or [{}])[0] or {}) for name, status, reason, *figures in outcomes]  # a generator too
    hints = {inv.name: inv.hint for inv in all_invariants()}  # in registry order: root components first
    order = {name: i for i, name in enumerate(hints)}
    failures = sorted((o for o in outcomes if o[1] in FAILING), key=lambda f: order.get(f[0], len(order)))
    failed = {name for name, _, _, _ in failures}
    held = {name for name, status, _, _ in outcomes if status == "passed"}
    non_finite = non_finite_first([(name, reason, measured) for name, _, reason, measured in failures])
    ranked = diagnose(failed, held) if failures else []
    return (said(ranked, failures, hints) if ranked else None), non_finite, ranked, failed, held


def likely_bugs(outcomes):
    """The likely bug, as lines to show (evidence indented below it), from (invariant, status, reason, figures); [] when nothing failed.

    NaN or inf in the answers is named once, first; what the line says follows what the failures show (`said`); where a figure
    named the cause, no other candidate is listed.
    """
    bug, non_finite, ranked, failed, held = likely_bug(outcomes)
    lines = []
    if non_finite:
        first, reason = non_finite[0]
        lines.append(f"non-finite answers (NaN or inf) in {len(non_finite)} failure(s), first in {first}: {reason}")
    if bug is None:
        return lines
    lines.append(f"likely bug: {bug.invariant}: {bug.cause}")
    top = next((d for d in ranked if d.invariant == bug.invariant), None)
    downstream = len(failed) - len(root_failures(failed))
    if top and len(failed) > 1:
        lines.append(f"  evidence: {len(top.explained)} of the other {len(failed) - 1} failures go with it in the zoo's signatures"
                     + (f"; {downstream} failure(s) are in components built on a failing one" if downstream else ""))
    component = bug.invariant.split(".")[0]
    parts = sound_parts(component, failed, held)
    if parts:
        lines.append(f"  its parts hold ({', '.join(parts)}: every law of theirs that ran passed), so the bug is in how {component} combines them")
    if ranked[0].resembles:
        lines.append("  resembles: " + "; ".join(f"{name} ({zoo_bug})" for name, zoo_bug in ranked[0].resembles))
    others = [d.invariant for d in ranked if d.invariant != bug.invariant]
    if others and not bug.measured:
        lines.append("  next most likely: " + ", ".join(others[:2]))
    return lines
