"""Scores that mean something: a law's points are earned only by functions shown to compute their component, in its mode.

Relational invariants hold for functions that do nothing (zeros never leak the future, a
constant is permutation-equivariant) and for garbage that happens to obey the law (a hard max
sums to one, attention that sees only its own token never leaks). So the gate asks, of every
function a passed invariant calls, whether it computes what it is named for, on the calls the
invariants themselves made in this run:

- computes, in each mode the law called it in: a recorded call of that mode (of any invariant,
  passed or failed) agrees with the reference, in the parts of the answer its protocol entry's
  answer_form fixes (_judged: llama_decode's cache, positions in its own slots or sizes, is the
  cache law's to judge), to `agreement(dtype)` of max(1, |answer|), under one
  of the conventions the reference documents (GELU form, RoPE pairing, fully masked rows, the
  declared eps), and is informative: moving any one float input by STEP of its own size moves the
  reference's answer by more than that, and the answer is not within twice that of the call's first
  float input (a call with W_o = 0, a single token or saturated logits is not: a hard max agrees
  with softmax there, a block with no attention agrees with a real one, the identity agrees with a
  block whose sublayers are tiny; the moves are drawn at random, so a call is judged informative
  once per version of the reference, and every reading reads that verdict). Then the function is
  asked at a nearby point (every float input moved by STEP: the same mode), and agrees there too,
  where the reference's answer has moved by more than twice the tolerance, so no answer within it
  of the first (a constant, a replay) is within it of the second (a point where it has not moved
  that far says nothing: the call is asked again). Two informative agreeing calls of the mode whose
  reference answers differ (same shapes) show it as well, since no constant can, and so does
  agreeing on every recorded call of the mode (on this run's inputs it is the reference);
- and none of the kinds (constant, identity, not finite, random) holds on the passed
  invariants' calls and the probes (a recorded call asked again, and with its first array moved).

The mode of a call is read from its arguments as data (mode_of): each optional argument (one with a
default in the reference's signature: attention's and the block's causal, gqa_attention's
key_mask and window, the Llama functions' window and chunks, ...) as True or False, None,
given, or for a boolean array whether it is all True, all False or partly False. An attention
that computes with causal=False and returns each token's own value with causal=True is not
shown to compute in the mode of the causal laws, so they earn nothing, while its other laws keep
their points.

The agreement tolerance is float32's (COMPUTES, 1e-4) in a float64 run too, since correct code that
computes in float32 (most torch code) answers with float32 rounding, not float64's. In numbers:
float32's eps is 1.2e-7, and a deep composition (the model's logits) rounds to a few 1e-6 at most,
so 1e-4 leaves a margin of 10 or more; STEP (1e-3) moves every input ten times the tolerance, so
where an input matters the reference's answer moves by more than the tolerance (informative) and
the nearby probe asks for a move of more than twice it, which neither a constant nor an answer
within the tolerance of the first can follow; and an informative call's answer is more than twice
the tolerance from its input, so the identity, or code within the tolerance of the identity (one ulp
away), agrees on no informative call. What the looser tolerance admits is code within 1e-4 of the
reference at two nearby points where every input matters: that computes the component.

A function that fails either earns nothing for the laws that call it in the modes it failed in
(invariants.gate.grade makes them "vacuous"), and the reason says why. Closeness is relative, never bitwise, so an answer one ulp
from its input is still the identity. Every probe is asked while the invariants run, among
their calls (CallLog.probe_due), so no phase of the run is the check, and judging asks nothing
more, so no clock can skip it: a function the run stopped before showing to compute earns
nothing. Functions outside CHECKED (the tokenizer, get_batch) are held to exact values or to
the data they are given (EXEMPT).
"""

from __future__ import annotations

import inspect
import itertools
import random

import numpy as np

from invariants.answers import Array
from invariants.gate import frames
from invariants.protocol import FUNCTIONS
from invariants.tolerance import COMPUTES, EPSILON

EXEMPT = ("build_vocab", "encode", "decode", "get_batch")  # held to exact values, or to the data they are given
CHECKED = tuple(name for name in FUNCTIONS if name not in EXEMPT)  # every other protocol function, new ones included
PER_INVARIANT = 6  # calls kept per function, invariant and mode (a rare mode keeps its calls)
PER_FUNCTION = 48  # calls judged per function
PROBES = 4  # recorded calls asked again (as they were, and moved) per function, while the invariants run
PROBE_RATE = 1 / 32  # the chance that a call of a checked function is preceded by a repeat probe: spread over the run
ITEM_BYTES = 1 << 20  # a call whose arguments and answer are larger is not kept
FUNCTION_BYTES = 16 << 20  # what the log keeps of one function's calls and probes, at most
TOTAL_BYTES = 64 << 20  # and of every function's
MIN_EVIDENCE = 2  # informative calls (or probes) before a function is called constant, the identity or not finite
NEAR_PROBES = 8  # nearby probes per function, at most, before it is taken not to compute
STEP = 1e-3  # how far an input is moved, relative to its size, to ask whether the reference's answer depends on it
_EPS_DECLARED = {"layer_norm": "LAYER_NORM_EPS", "rms_norm": "RMS_NORM_EPS"}  # functions whose eps is an argument
WHY = {
    "disagrees": "held for a function that does not compute {name}",
    "unchecked": "held for a function not shown to compute {name}",
    "constant": "held only because the output does not depend on the input",
    "identity": "held only because the output is the input (to rounding)",
    "not_finite": "held only because the output is not finite (NaN or inf)",
    "random": "held only by chance: the output is random (the same input gave another output)",
}


# -- answers as float64 arrays ----------------------------------------------------------------


def _arrays(value):
    """The float64 arrays in an answer, in order (tuples, lists and dicts flattened); None and text dropped."""
    out = []

    def walk(v):
        if isinstance(v, dict):
            for key in sorted(v):
                walk(v[key])
        elif isinstance(v, (list, tuple)):
            for item in v:
                walk(item)
        elif isinstance(v, np.ndarray) and v.dtype.kind in "fiub":
            out.append(v.astype(np.float64))
        elif isinstance(v, (int, float, bool, np.generic)):
            out.append(np.asarray(v, dtype=np.float64))
    walk(value)
    return out


def _nbytes(value):
    """The bytes of the arrays in a value, without converting any."""
    if isinstance(value, dict):
        return sum(_nbytes(v) for v in value.values())
    if isinstance(value, (list, tuple)):
        return sum(_nbytes(v) for v in value)
    return value.nbytes if isinstance(value, np.ndarray) else 8


def _kept(value):
    """A copy of an answer in its own dtype, so that the invariant that received it cannot change what the log keeps."""
    if isinstance(value, dict):
        return {k: _kept(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(_kept(v) for v in value) if isinstance(value, tuple) else [_kept(v) for v in value]
    return value.copy() if isinstance(value, np.ndarray) else value


def _judged(name, args, answer):
    """The answer with each part its form leaves open (invariants.gate.frames.expected: the protocol entry's answer_form, read from the
    call's arguments) set to None: a part that may take several forms or has an axis of any length, such as llama_decode's cache
    (positions in the cache's own slots, or its sizes), is the implementation's to lay out, for its own laws to judge; the reference
    fixes the rest."""
    form = frames.expected(name, args)
    if not (isinstance(form, tuple) and isinstance(answer, tuple) and len(form) == len(answer)):
        return answer  # one part, or out alone (ATTENTION_WEIGHTS = False), or a tuple the reference does not answer
    return tuple(part if isinstance(f, Array) and (f.shape is None or None not in f.shape) else None for part, f in zip(answer, form, strict=True))


def _close(got, expected, rel):
    """Is every array of got within rel·max(1, |expected|) of expected's, with the same shapes and the same non-finite entries?

    expected may hold more arrays than got (attention that declares no weights returns its output alone).
    """
    if not got or len(got) > len(expected):
        return False
    for x, y in zip(got, expected[: len(got)], strict=True):
        if x.shape != y.shape:
            return False
        fx, fy = np.isfinite(x), np.isfinite(y)
        if not (np.array_equal(fx, fy) and np.array_equal(x[~fx], y[~fy], equal_nan=True)):
            return False
        scale = max(1.0, float(np.abs(y[fy]).max(initial=0.0)))
        if x.size and float(np.abs(x[fx] - y[fy]).max(initial=0.0)) > rel * scale:
            return False
    return True


def _finite(arrays):
    return all(np.isfinite(a).all() for a in arrays)


def agreement(dtype):
    """How close an answer must come to the reference's, relative to max(1, |answer|): the dtype's COMPUTES, never tighter than float32's."""
    return max(COMPUTES.get(dtype, COMPUTES["float32"]), COMPUTES["float32"])


# -- the mode of a call ---------------------------------------------------------------------------


def optional_params(reference, name):
    """The protocol params of `name` that the reference gives a default (causal, key_mask, window, chunks, eps, ...): the mode's."""
    fn = getattr(reference, name, None) if reference is not None else None
    if fn is None:
        return ()
    spec = inspect.signature(fn).parameters
    return tuple(p for p in FUNCTIONS[name].params if p in spec and spec[p].default is not spec[p].empty)


def _setting(value):
    """An optional argument as its mode reads it: True or False, None, "given", or for a boolean array "all", "none" or "some" (True)."""
    if value is None or isinstance(value, (bool, np.bool_)):
        return None if value is None else bool(value)
    if isinstance(value, np.ndarray) and value.dtype == np.bool_:
        return "all" if value.all() else "some" if value.any() else "none"
    return "given"


def mode_of(name, args, optional):
    """The mode of a call of `name`: ((param, setting), ...) for its optional params (optional_params), read from the arguments as data."""
    return tuple((param, _setting(value)) for param, value in zip(FUNCTIONS[name].params, args, strict=False) if param in optional)


_SHOWN = {True: "=True", False: "=False", None: "=None", "given": " given", "all": " all True", "none": " all False", "some": " partly False"}


def describe_mode(mode, modes):
    """The settings that set `mode` apart from the other `modes` of the same function ("causal=True"), or "" where nothing does."""
    shared = set.intersection(*(set(m) for m in modes)) if modes else set()
    return ", ".join(f"{param}{_SHOWN[setting]}" for param, setting in mode if (param, setting) not in shared)


# -- the log of the run's own calls -------------------------------------------------------------


class CallLog:
    """The calls each checked function answered, with its answers and the probes asked among them, within a byte budget.

    A reservoir sample of PER_INVARIANT calls per function, invariant and mode, so that hypothesis's
    first, simplest inputs (a single token, V = 1) do not crowd out the rest; nothing larger than
    ITEM_BYTES is kept, nor more than FUNCTION_BYTES per function or TOTAL_BYTES in all; the modes
    (mode_of) each invariant called each function in, every call counted. With a reference, the
    first kept call of each mode that agrees with it informatively is asked again at a nearby point
    (every float input moved by STEP): agreeing there too shows that it computes in that mode.
    """

    def __init__(self, seed=None, *, reference=None, dtype="float64", declarations=None):
        self.samples = {}  # (name, invariant, mode) -> [calls seen, [call]], a call being {"args", "answer", "mode", "evidence"}
        self.modes = {}  # (name, invariant) -> {mode of each of its calls}
        self.probes = {}  # name -> [(args, answer, asked again, moved args, answer to them)]
        self.near = {}  # (name, mode) -> [nearby probes asked, of which agreed]
        self.current = None  # the invariant now running
        self.bytes = {}  # name -> bytes kept
        self.reference, self.dtype, self.declarations = reference, dtype, declarations
        self._versions, self._optional = {}, {}
        self._random = random.Random(seed or 0)
        self.rng = np.random.default_rng(seed or 0)  # the probes' perturbations: as unpredictable as the examples

    @property
    def total_bytes(self):
        return sum(self.bytes.values())

    def computes(self, name, mode):
        """Has a nearby probe shown that `name` agrees with the reference in `mode`, where every input matters?"""
        return self.near.get((name, mode), [0, 0])[1] > 0

    def agrees_apart(self, name, mode):
        """Do two kept calls of `mode` agree informatively, where the reference's answers have the same shapes and differ (no constant can)?"""
        rel, seen = agreement(self.dtype), []
        for call in self._kept_calls(name, mode):
            if evidence := self._evidence(name, call):
                expected = evidence[1]
                if any(len(e) == len(expected) and all(a.shape == b.shape for a, b in zip(e, expected, strict=True))
                       and not _close(expected, e, rel) for e in seen):
                    return True
                seen.append(expected)
        return False

    def informative_in(self, name, mode):
        """Is any kept call of `mode` informative under some version of the reference, whatever the function answered there?"""
        return any(self._informative(name, call, version) for call in self._kept_calls(name, mode) for version in self.versions(name))

    def _informative(self, name, call, version):
        """Is the kept call informative under `version` of the reference? Judged once per call and version (its moves are drawn at
        random), so that the evidence and a mode's having no informative call read the same verdict."""
        verdicts = call.setdefault("informative", {})
        index = self.versions(name).index(version)
        if index not in verdicts:
            expected = _answer(version, call["args"])
            verdicts[index] = expected is not None and informative(version, call["args"], expected, agreement(self.dtype), self.rng)
        return verdicts[index]

    def versions(self, name):
        if name not in self._versions:
            self._versions[name] = references(self.reference, name, self.declarations) if self.reference else []
        return self._versions[name]

    def mode_of(self, name, args):
        if name not in self._optional:
            self._optional[name] = optional_params(self.reference, name)
        return mode_of(name, args, self._optional[name])

    def modes_used(self, name, invariants):
        """The modes the given invariants called `name` in."""
        return set().union(*(self.modes.get((name, inv), ()) for inv in invariants))

    def _fits(self, name, size, freed=0):
        return (size <= ITEM_BYTES and self.bytes.get(name, 0) + size - freed <= FUNCTION_BYTES
                and self.total_bytes + size - freed <= TOTAL_BYTES)

    def record(self, name, args, answer):
        if name not in CHECKED or self.current is None:
            return
        mode = self.mode_of(name, args)
        self.modes.setdefault((name, self.current), set()).add(mode)
        entry = self.samples.setdefault((name, self.current, mode), [0, []])
        seen, kept = entry
        entry[0] = seen + 1
        size = _nbytes(args) + _nbytes(answer)
        slot = len(kept) if len(kept) < PER_INVARIANT else self._random.randrange(seen + 1)
        if slot >= PER_INVARIANT:
            return
        freed = _nbytes((kept[slot]["args"], kept[slot]["answer"])) if slot < len(kept) else 0
        if not self._fits(name, size, freed):
            return
        call = {"args": args, "answer": _kept(_judged(name, args, answer)), "mode": mode, "evidence": None}
        self.bytes[name] = self.bytes.get(name, 0) + size - freed
        if slot < len(kept):
            kept[slot] = call
        else:
            kept.append(call)

    def _kept_calls(self, name, mode=None):
        return [call for (fn, _, m), (_, kept) in self.samples.items() if fn == name and mode in (None, m) for call in kept]

    def _evidence(self, name, call):
        """(version, its answer) for a kept call on which `name` agrees informatively with the reference, else False (cached)."""
        if call["evidence"] is None:
            call["evidence"] = False
            got, rel = _arrays(call["answer"]), agreement(self.dtype)
            for version in self.versions(name):
                expected = _answer(version, call["args"])
                if expected is not None and _close(got, expected, rel) and self._informative(name, call, version):
                    call["evidence"] = (version, expected)
                    break
        return call["evidence"]

    def probe_due(self, name):
        """("near", call) or ("again", call): a kept call of `name` to ask about now, among the invariant's own calls, or None.

        A nearby probe as soon as a call agrees informatively, until one of its mode agrees nearby too (NEAR_PROBES
        at most per mode); the repeat and the moved call at random (PROBE_RATE), PROBES of them per function.
        """
        if name not in CHECKED or self.current is None:
            return None
        kept = self._kept_calls(name)
        for call in kept:
            asked = self.near.setdefault((name, call["mode"]), [0, 0])
            if (not asked[1] and asked[0] < NEAR_PROBES and not call.get("near") and next(_float_leaves(call["args"]), None) is not None
                    and self._evidence(name, call)):
                call["near"] = True
                return "near", call
        if kept and len(self.probes.get(name, ())) < PROBES and self._random.random() < PROBE_RATE:
            return "again", self._random.choice(kept)
        return None

    def answered_near(self, name, call, nearby, answer):
        """Count a nearby probe's answer: does it agree with the reference there, where the reference has moved by more than twice
        the tolerance (so that no answer within it of the first is within it of the second)? A point where the reference has not
        moved that far says nothing, and the call may be asked again at another (NEAR_PROBES per mode in all)."""
        version, expected = call["evidence"]
        rel = agreement(self.dtype)
        there = _answer(version, nearby)
        asked = self.near[(name, call["mode"])]
        asked[0] += 1
        if there is None or _close(there, expected, 2 * rel):
            call["near"] = False
        elif answer is not None and _close(_arrays(_judged(name, nearby, answer)), there, rel):
            asked[1] += 1

    def probed(self, name, args, answer, again, moved, moved_answer):
        size = _nbytes(args) + _nbytes(answer) + _nbytes(again) + _nbytes(moved) + _nbytes(moved_answer)
        if self._fits(name, size):
            self.bytes[name] = self.bytes.get(name, 0) + size
            self.probes.setdefault(name, []).append((args, answer, _kept(_judged(name, args, again)), moved,
                                                     _kept(_judged(name, moved, moved_answer))))

    def calls(self, name, invariants=None, mode=None):
        """[(args, answer)] of `name` during the given invariants (all, for None), in `mode` (any, for None), at most PER_FUNCTION,
        in the order they ran."""
        out = [(call["args"], call["answer"]) for (fn, inv, m), (_, kept) in self.samples.items()
               if fn == name and (invariants is None or inv in invariants) and mode in (None, m) for call in kept]
        return out[:PER_FUNCTION]


# -- the reference, under each documented convention ---------------------------------------------


def _as64(value):
    if isinstance(value, dict):
        return {k: _as64(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(_as64(v) for v in value)
    return value.astype(np.float64) if isinstance(value, np.ndarray) and value.dtype.kind == "f" else value


def _positional(fn):
    return lambda args: fn(*args)


def references(reference, name, declarations=None):
    """The reference's versions of `name`, one per combination of the conventions it documents: [callable(args) -> answer]."""
    declarations = declarations or {}
    if name == "gelu":
        return [_positional(reference.gelu_of(form)) for form in reference.GELU_FORMS]
    fn = getattr(reference, name, None)
    if fn is None:
        return []
    eps = sorted({reference.EPS, *(v for k, v in declarations.items() if k.endswith("_EPS") and v is not None)})
    choices = {"gelu_form": reference.GELU_FORMS, "pairing": reference.ROPE_PAIRINGS, "fully_masked": reference.FULLY_MASKED,
               "eps": eps}
    keywords = [p for p, spec in inspect.signature(fn).parameters.items() if spec.kind is spec.KEYWORD_ONLY and p in choices]
    positional_eps = FUNCTIONS[name].params.index("eps") if name in _EPS_DECLARED else None
    declared_eps = declarations.get(_EPS_DECLARED.get(name))

    def version(options):
        def call(args):
            args = list(args)
            if positional_eps is not None and declared_eps is not None and len(args) > positional_eps:
                args[positional_eps] = declared_eps  # it always uses the eps it declares, whatever it is passed
            return _judged(name, args, fn(*args, **options))
        return call
    return [version(dict(zip(keywords, combo, strict=True))) for combo in itertools.product(*(choices[k] for k in keywords))]


def _answer(version, args):
    try:
        return _arrays(version(_as64(args)))
    except Exception:  # noqa: BLE001 - an input the reference refuses says nothing either way
        return None


def _float_leaves(value, path=()):
    if isinstance(value, dict):
        for key in sorted(value):
            yield from _float_leaves(value[key], (*path, key))
    elif isinstance(value, (list, tuple)):
        for i, item in enumerate(value):
            yield from _float_leaves(item, (*path, i))
    elif isinstance(value, np.ndarray) and value.dtype.kind == "f" and value.size:
        yield path, value


def _with(value, path, new):
    if not path:
        return new
    head, rest = path[0], path[1:]
    if isinstance(value, dict):
        return {**value, head: _with(value[head], rest, new)}
    items = list(value)
    items[head] = _with(items[head], rest, new)
    return tuple(items) if isinstance(value, tuple) else items


def informative(version, args, expected, rel, rng):
    """Does moving any one float input of the call by STEP of its size move the reference's answer by more than rel, where that answer
    is more than 2·rel from the call's first float input (so that neither the identity nor code within rel of it agrees)?"""
    args = _as64(args)
    first = next(_float_leaves(args), None)
    if first is not None and expected and first[1].shape == expected[0].shape and _close([first[1]], expected[:1], 2 * rel):
        return False
    for path, a in _float_leaves(args):
        finite = np.isfinite(a)
        size = float(np.abs(a[finite]).mean()) if finite.any() else 0.0
        moved = np.where(finite, a + STEP * (size or 1.0) * rng.standard_normal(a.shape), a)
        answer = _answer(version, _with(args, path, moved))
        if answer is None or _close(answer, expected, rel):
            return False
    return True


def disagreements(calls, versions, rel):
    """(disagreed, judged): of the recorded calls the reference answers, those where the function agrees with no version of it."""
    disagreed = judged = 0
    for args, answer in calls:
        got = _arrays(answer)
        expected = [e for v in versions if (e := _answer(v, args)) is not None]
        if expected:
            judged += 1
            disagreed += not any(_close(got, e, rel) for e in expected)
    return disagreed, judged


def nearby(args, rng):
    """The arguments with every float array moved by STEP of its own size (infinities kept): a point near a recorded call."""
    out = args
    for path, a in _float_leaves(args):
        finite = np.isfinite(a)
        size = float(np.abs(a[finite]).mean()) if finite.any() else 0.0
        moved = np.where(finite, a + STEP * (size or 1.0) * rng.standard_normal(a.shape), a).astype(a.dtype)
        out = _with(out, path, moved)
    return out


# -- what a function that does not compute is instead ------------------------------------------


def perturbed(args, rng):
    """The arguments with the first array moved: floats by noise of their own scale (infinities kept), integer ids redrawn
    (from 0 to one past the largest; an id the reference refuses drops the probe); with no array, the first integer plus one."""
    args = list(args)
    for i, a in enumerate(args):
        if isinstance(a, np.ndarray) and a.dtype.kind == "f" and a.size:
            finite = np.isfinite(a)
            scale = float(np.abs(a[finite]).mean()) if finite.any() else 1.0
            noise = rng.normal(0.0, 0.5 * scale + 0.5, a.shape).astype(a.dtype)
            args[i] = np.where(finite, a + noise, a).astype(a.dtype)
            return tuple(args)
    for i, a in enumerate(args):
        if isinstance(a, np.ndarray) and a.dtype.kind in "iu" and a.size:  # token ids: others from the range seen (+1)
            args[i] = rng.integers(0, max(int(a.max()) + 2, 2), a.shape).astype(a.dtype)
            return tuple(args)
    for i, a in enumerate(args):
        if isinstance(a, int) and not isinstance(a, bool):
            args[i] = a + 1
            return tuple(args)
    return None


def kind_of(calls, probes, version, dtype):
    """'identity', 'not_finite', 'random', 'constant' or None, from the passed invariants' calls and the probes asked among them."""
    rel = agreement(dtype)
    seen = [(args, _arrays(answer), ref) for args, answer in calls if (ref := _answer(version, args)) is not None]
    informative_calls = same = 0
    for args, got, ref in seen:
        first = _arrays(args[0]) if args else []
        if not (first and got and ref) or got[0].shape != first[0].shape:
            continue
        values = first[0][np.isfinite(first[0])]
        varies = values.size and float(values.max() - values.min()) > rel * max(1.0, float(np.abs(values).max()))
        if varies and not _close([first[0]], [ref[0]], rel):  # a constant input answered by itself says constant, not identity
            informative_calls += 1
            same += _close([got[0]], [first[0]], rel)
    if informative_calls >= MIN_EVIDENCE and same * 2 > informative_calls:
        return "identity"
    finite_ref = [got for _, got, ref in seen if _finite(ref)]
    if len(finite_ref) >= MIN_EVIDENCE and not any(_finite(got) for got in finite_ref):
        return "not_finite"
    repeats = changed = moved_pairs = unmoved = 0
    for args, answer, again, moved, moved_answer in probes:
        got, ref = _arrays(answer), _answer(version, args)
        other_ref = None if moved is None else _answer(version, moved)
        if ref is None or other_ref is None or _close(other_ref, ref, rel) or not _finite(got):
            continue  # an input whose reference answer does not move (V = 1, a single token) says nothing
        repeats += 1
        changed += again is None or not _close(_arrays(again), got, 10 * EPSILON.get(dtype, EPSILON["float32"]))
        if moved_answer is not None:
            moved_pairs += 1
            unmoved += _close(_arrays(moved_answer), got, rel)
    if repeats and changed * 2 > repeats:
        return "random"
    if moved_pairs >= MIN_EVIDENCE and unmoved * 2 > moved_pairs:
        return "constant"
    return None


def judge(name, log, held, dtype):
    """({"kind", "why", "modes"}, unshown) for a function not shown to compute `name` in every mode the passed invariants called it
    in, or None.

    held: the invariants that passed (the kinds are read from their calls). unshown: the modes it
    was not shown to compute in (a passed invariant that called it in one of them earns nothing),
    or None where a kind (constant, identity, not finite, random) holds, which costs every mode;
    "modes" says them in words ([]: every mode). The kind is "disagrees" (or "unchecked", with no
    call of the mode to judge) unless a kind says more. It asks the submission nothing.
    """
    versions = log.versions(name)
    rel = agreement(dtype)
    kind = kind_of(log.calls(name, held), log.probes.get(name, []), versions[0], dtype) if versions else None
    every_mode = log.modes_used(name, {inv for fn, inv in log.modes if fn == name})
    counts = {mode: disagreements(log.calls(name, mode=mode), versions, rel) for mode in every_mode}  # (disagreed, judged)
    shown = {mode: (judged >= MIN_EVIDENCE and disagreed == 0)  # on this run's inputs it is the reference, informative or not
             or log.computes(name, mode) or log.agrees_apart(name, mode) for mode, (disagreed, judged) in counts.items()}
    unshown = []  # (mode, disagreed, judged) of the modes the held invariants used and it was not shown to compute in
    for mode in sorted(log.modes_used(name, held), key=repr):
        disagreed, judged = counts[mode]
        # where no call of the mode is informative (every key hidden, one key), agreeing there is all any code can show
        moot = any(shown.values()) and judged and not disagreed and not log.informative_in(name, mode)
        if not (shown[mode] or moot):
            unshown.append((mode, disagreed, judged))
    if kind is None and not unshown:
        return None
    if unshown:
        mode, disagreed, judged = unshown[0]
        setting = describe_mode(mode, every_mode)
    else:
        setting, (disagreed, judged) = "", disagreements(log.calls(name), versions, rel)
    subject = f"{name} with {setting}" if setting else name
    if judged == 0:
        evidence = f"no call of {subject} in this run could be compared with the reference"
    else:
        evidence = f"{name} disagreed with the reference on {disagreed} of {judged} of the run's own inputs{' with ' + setting if setting else ''}"
        if unshown:
            asked = log.near.get((name, mode), [0, 0])[0]
            evidence += (f", and agreed near none of them where every input matters ({asked} asked)" if asked else
                         ", and agreed on none where every input matters")
    if others := [describe_mode(m, every_mode) for m, _, _ in unshown[1:]]:
        evidence += f" (nor was it shown to compute with {'; '.join(others)})"
    verdict = kind or ("unchecked" if judged == 0 else "disagrees")
    why = f"{WHY[verdict].format(name=subject)}: {evidence}, so this property says nothing about it (0 points; docs/gate.md)"
    if kind or not any(shown.values()):  # a function that computes in no mode earns nothing, for a law that gave it no call too
        return {"kind": verdict, "why": why, "modes": []}, None
    return ({"kind": verdict, "why": why, "modes": sorted(filter(None, (describe_mode(m, every_mode) for m, _, _ in unshown)))},
            frozenset(m for m, _, _ in unshown))
