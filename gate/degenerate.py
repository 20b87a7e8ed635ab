"""Vacuous passes: an invariant that held only because the function it tests is degenerate earns no points.

Relational invariants hold for functions that do nothing: zeros never leak the future,
a constant is permutation-equivariant, the identity returns its input when the sublayers are
zeroed. So the gate asks, of every function a passed invariant calls, whether it behaved like a
function of its input on the inputs the invariants themselves gave it (which a submission
cannot tell apart from any other), by comparing its answers with the reference's on the same
inputs:

- constant: of a few recorded calls asked again with their first array moved (noise of its own
  scale, or ids redrawn), where the reference's answer moves, its answer stays identical in more
  than half ("the output does not depend on the input");
- identity: over the calls where the reference's answer is not the input, it answered with the
  input unchanged in more than half ("the output is the input, unchanged");
- not finite: over the calls where the reference's answer is finite, it never answered a finite
  one ("the output is not finite"; a function that is NaN only on some inputs is a bug the
  invariants report, not a vacuous pass);
- random: asked the same recorded calls again, it answers differently (beyond ten times the
  dtype's rounding) in more than half ("the same input gave another output").

A degenerate function's invariants get the status "vacuous" and 0 points, with the reason.
The calls judged are those of the invariants that passed (a failing invariant's shrunk example
is the simplest input, a single token or d = 1, and says nothing about the rest). Functions
outside CHECKED (the tokenizer, get_batch) are held to exact values or to the data they are
given, which a degenerate function cannot satisfy (EXEMPT).
"""

from __future__ import annotations

import random

import numpy as np

from invariants.protocol import FUNCTIONS, ImplementationError, OutputError

EXEMPT = ("build_vocab", "encode", "decode", "get_batch")  # held to exact values, or to the data they are given
CHECKED = tuple(name for name in FUNCTIONS if name not in EXEMPT)  # every other protocol function, new ones included
PER_INVARIANT = 6  # calls recorded per function and invariant
PROBES = 3  # recorded calls asked again, as they were and with their first array moved
PER_FUNCTION = 48
MAX_BYTES = 4 << 20  # calls with larger arguments are not recorded
MIN_EVIDENCE = 2  # informative pairs (or calls) before a function is called degenerate
WHY = {
    "constant": "held only because the output does not depend on the input",
    "identity": "held only because the output is the input, unchanged",
    "not_finite": "held only because the output is not finite (NaN or inf)",
    "random": "held only by chance: the output is random (the same input gave another output)",
}
_EPS = {"float64": 2.2e-16, "float32": 1.2e-7, "float16": 9.8e-4, "bfloat16": 7.8e-3}


def _arrays(value):
    """The float64 arrays in an answer, in order (tuples, lists and dicts flattened); None for text."""
    out = []

    def walk(v):
        if isinstance(v, dict):
            for key in sorted(v):
                walk(v[key])
        elif isinstance(v, (list, tuple)):
            for item in v:
                walk(item)
        elif isinstance(v, np.ndarray):
            out.append(v.astype(np.float64) if v.dtype.kind in "fiub" else v)
        elif isinstance(v, (int, float, bool, np.generic)):
            out.append(np.asarray(v, dtype=np.float64))
    walk(value)
    return out


def _size(value):
    return sum(a.nbytes for a in _arrays(value))


def _identical(a, b):
    return len(a) == len(b) and all(x.shape == y.shape and np.array_equal(x, y, equal_nan=True) for x, y in zip(a, b, strict=True))


def _differ(a, b, rel):
    """Do two answers differ by more than `rel` of their scale (or in shape)?"""
    if len(a) != len(b) or any(x.shape != y.shape for x, y in zip(a, b, strict=True)):
        return True
    for x, y in zip(a, b, strict=True):
        if not (np.isfinite(x).all() and np.isfinite(y).all()):
            if not np.array_equal(np.isfinite(x), np.isfinite(y)):
                return True
            x, y = np.where(np.isfinite(x), x, 0.0), np.where(np.isfinite(y), y, 0.0)
        scale = max(float(np.abs(x).max(initial=0.0)), float(np.abs(y).max(initial=0.0)), 1e-30)
        if x.size and float(np.abs(x - y).max()) > rel * scale:
            return True
    return False


def _finite(arrays):
    return all(np.isfinite(a).all() for a in arrays)


class CallLog:
    """The calls each checked function answered, with its answers: a sample of PER_INVARIANT per invariant (WorkerTransport records them).

    A reservoir sample over all of an invariant's calls, with a fixed seed: hypothesis starts with
    the simplest inputs (a single token, V = 1), which say little, so the first calls alone would not do.
    """

    def __init__(self):
        self.samples = {}  # (name, invariant) -> [calls seen, [(args, answer arrays, invariant)]]
        self.current = None  # the invariant now running
        self._random = random.Random(0)

    def record(self, name, args, answer):
        if name not in CHECKED or _size(args) > MAX_BYTES:
            return
        seen, kept = self.samples.setdefault((name, self.current), [0, []])
        self.samples[(name, self.current)][0] = seen + 1
        item = (args, _arrays(answer), self.current)
        if len(kept) < PER_INVARIANT:
            kept.append(item)
        elif (slot := self._random.randrange(seen + 1)) < PER_INVARIANT:
            kept[slot] = item

    def calls(self, name, invariants):
        """[(args, answer arrays, invariant)] of `name` during the given invariants, at most PER_FUNCTION, in the order they ran."""
        out = [call for (fn, inv), (_, kept) in self.samples.items() if fn == name and inv in invariants for call in kept]
        return out[:PER_FUNCTION]


def _reference_answer(reference, name, args):
    try:
        as64 = [a.astype(np.float64) if isinstance(a, np.ndarray) and a.dtype.kind == "f" else a for a in args]
        return _arrays(getattr(reference, name)(*as64))
    except Exception:  # noqa: BLE001 - an input the reference refuses says nothing either way
        return None


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


def diagnose(name, calls, reference, dtype, ask, rng):
    """'identity', 'constant', 'random', 'not_finite' or None for one function, from its recorded calls and a few more.

    ask(name, args) calls the submission again (gate.grade); rng draws the perturbations. Of the
    recorded calls, up to PROBES whose reference answer moves when their first array is moved
    (the largest first) are asked again as they were (random?) and moved (constant?); the
    identity and not-finite checks read the recorded answers alone.
    """
    rel = max(1e-9, 10 * _EPS.get(dtype, 1e-7))
    seen = [(args, got, ref) for args, got, _ in calls if (ref := _reference_answer(reference, name, args)) is not None]
    informative = same = 0
    for args, got, ref in seen:
        first = _arrays(args[0]) if args else []
        if not (first and got and ref) or got[0].shape != first[0].shape:
            continue
        if _differ([ref[0]], [first[0]], rel):
            informative += 1
            same += np.array_equal(got[0], first[0], equal_nan=True)
    if informative >= MIN_EVIDENCE and same * 2 > informative:
        return "identity"
    finite_ref = [(got, ref) for _, got, ref in seen if _finite(ref)]
    if len(finite_ref) >= MIN_EVIDENCE and not any(_finite(got) for got, _ in finite_ref):
        return "not_finite"
    moved_pairs = unmoved = repeats = changed = 0
    for args, got, ref in sorted(seen, key=lambda c: -_size(c[0])):  # the largest inputs first: they say the most
        if moved_pairs >= PROBES:
            break
        other = perturbed(args, rng)
        other_ref = None if other is None else _reference_answer(reference, name, other)
        if other_ref is None or not _differ(ref, other_ref, rel) or not _finite(got):
            continue  # an input whose reference answer does not move (V = 1, a single token) says nothing
        try:
            again = _arrays(ask(name, args))
        except (ImplementationError, OutputError):
            again = None  # the same call, and this time no answer
        repeats += 1
        changed += again is None or _differ(got, again, 10 * rel)
        try:
            moved = _arrays(ask(name, other))
        except (ImplementationError, OutputError):
            continue  # an input it refuses says nothing about constancy
        moved_pairs += 1
        unmoved += _identical(got, moved)
    if repeats and changed * 2 > repeats:
        return "random"
    if moved_pairs and unmoved * 2 > moved_pairs:
        return "constant"
    return None


def explain(name, kind):
    return f"{WHY[kind]}: {name} is degenerate on the invariants' own inputs, so this property says nothing about it (0 points; docs/gate.md)"
