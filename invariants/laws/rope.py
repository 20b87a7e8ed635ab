"""Invariants of rotary position embeddings: relative offsets, pair norms, position 0, the pairing anchor, the reference.

rope(x (..., T, D), positions (T,) int, base) rotates pair i of the vector at position p by the
angle p·θ_i, θ_i = base^(-2i/D). Two pairings exist and both are RoPE: half-split, pairs
(i, i + D/2) (HF's Llama, GPT-NeoX), and interleaved, pairs (2i, 2i + 1) (Meta's Llama, GPT-J).
Relative offsets, norms and position 0 hold for both, so the pairing anchor pins which one an
implementation uses: the one it declares (ROPE_PAIRING), or either where it declares none, one
pairing for the whole call. A checkpoint is only right for one of them (HF permutes q and k at
conversion: huggingface/transformers#25199), and code that mixes them (rotate_half with
frequencies laid out for interleaved pairs, karpathy/nanochat#264) is not a rotation at all.

Rounding of the angle: p·θ computed in float32 is off by about p·2^-24 radians, so checks that
compare rotations at different positions allow for it (angle_error); correct code computes the
angle in float32 at least, never in bfloat16 (whose 8 bits make positions past 256 wrong:
huggingface/transformers#29285).
"""

from __future__ import annotations

import numpy as np

import invariants.reference.numpy as ref
from invariants.asserts import as_array, assert_close, assert_equal, assert_shape
from invariants.conventions import declared, input_as_rounded, rounding_dtype
from invariants.inputs import valid_inputs
from invariants.protocol import ROUNDINGS, describe_call
from invariants.registry import invariant
from invariants.strategies.core import float_arrays, integers
from invariants.strategies.decoder import rope_inputs
from invariants.tolerance import Tolerance, agreement_tolerance, tolerance_for

LESSON = 90  # where a lesson meets this component: the registry's order (test ids, the kill matrix's first failure)
HOLDS = ("rope",)  # the protocol functions whose laws it holds

ANGLE_UNIT = {"float64": 2.0**-53}  # the unit roundoff an angle p·θ carries; float32 (2^-24) for float32 and below


def rope_pairings(impl):
    """The pairings impl's RoPE may follow: the one its ROPE_PAIRING declares, else both ("half_split", "interleaved")."""
    pairing = declared(impl, "ROPE_PAIRING")
    return ref.ROPE_PAIRINGS if pairing is None else (pairing,)


def draw_rope_inputs(impl, case, label, **options):
    """rope_inputs(**options) for impl: its ROPE_THETA as the only base where it declares one."""
    if declared(impl, "ROPE_THETA") is not None:
        options["bases"] = (declared(impl, "ROPE_THETA"),)
    return case.draw(rope_inputs(**options), label)


@valid_inputs("rope")
def rope_arguments(impl, case):
    """(B, H, T, D) heads of even width D, T distinct integer positions in any order, and the declared RoPE base."""
    inputs = draw_rope_inputs(impl, case, "inputs", max_seq=3)
    return inputs["x"], inputs["positions"], inputs["base"]


def angle_error(impl, max_position):
    """The relative error a correct rope may carry at positions up to max_position: the angle p·θ_0 = p rounded twice (θ and p·θ)."""
    return 2.0 * max_position * ANGLE_UNIT.get(rounding_dtype(impl), 2.0**-24)


def rope_tolerance(impl, max_position, *, base=None):
    """`base` (impl's tolerance by default) scaled by ROUNDINGS["rope"], its rtol grown by angle_error(max_position)."""
    tol = (base or impl.tolerance).scaled(ROUNDINGS["rope"])
    return Tolerance(tol.rtol + angle_error(impl, max_position), tol.atol, tol.dtype)


def assert_close_to_a_pairing(impl, got, answers, what, tol, call):
    """got is within tol of answers[pairing] for one pairing, over the whole array; else it fails against the closest one.

    answers: {pairing: expected}, one per pairing in rope_pairings(impl).
    """
    __tracebackhide__ = True
    got = as_array(got, what, call)
    values = got.astype(np.float64)
    if all(np.shape(e) == got.shape for e in answers.values()):
        if any(tol.allows(values, expected).all() for expected in answers.values()):
            return
        closest = min(answers, key=lambda p: np.nanmax(np.abs(values - answers[p]), initial=0.0))
    else:
        closest = next(iter(answers))
    if len(answers) > 1:
        note = f"held to the {closest} pairing, the closer one: either pairing passes, one pairing for the whole call"
    else:
        note = f"held to the {closest} pairing that {impl.label} declares (ROPE_PAIRING = {closest!r})"
    float32_sized = _float32_sized(impl, values, answers[closest])
    if float32_sized:
        note += "; its errors are of float32 rounding size, not a convention's: code that computes in float32 by design declares "
        note += "COMPUTE_DTYPE = 'float32'"
    assert_close(got, answers[closest], f"{what} ({note})", tol, call, float32_sized=float32_sized)


def _float32_sized(impl, values, expected):
    """Whether a float64 answer misses `expected` by no more than float32 rounding would (8 roundings at its scale)."""
    if rounding_dtype(impl) != "float64" or np.shape(values) != np.shape(expected) or not np.isfinite(values).all():
        return False
    scale = float(np.abs(expected).max(initial=0.0))
    return bool(tolerance_for("float32").scaled(8).at_scale(scale).allows(values, expected).all())


def partner(a, D, pairing):
    """The coordinate rotated together with coordinate a: a ± D/2 (half-split) or a ^ 1 (interleaved)."""
    return (a + D // 2) % D if pairing == "half_split" else a ^ 1


def _pair_pattern(D, pairing):
    """(D, D) True at (a, a) and (a, partner(a)): where rope(e_a) may be non-zero."""
    pattern = np.eye(D, dtype=bool)
    pattern[np.arange(D), [partner(a, D, pairing) for a in range(D)]] = True
    return pattern


def _rope(impl, x, positions, base, call):
    __tracebackhide__ = True
    return assert_shape(impl.rope(x, positions, base), x.shape, "rope output", call)


@invariant(
    requires=("rope",),
    hint="the angle is not linear in the position alone: q and k are rotated by different rules (one pairing for q, another "
    "for k), the frequencies are laid out for one pairing and rotated in the other (rotate_half with interleaved cos/sin), "
    "the position is squared or offset per call, or the angle is computed in bfloat16",
)
def relative_offsets(impl, case):
    """Shifting every position by s leaves each score rope(q, m)·rope(k, n) unchanged: scores depend on m - n only (to rounding)."""
    inputs = draw_rope_inputs(impl, case, "q and its positions")
    q, positions, base = inputs["x"], inputs["positions"], inputs["base"]
    k = case.draw(float_arrays(q.shape), "k (at the same positions)")
    shift = case.draw(integers(1, 64), "shift s")
    call = describe_call("rope", inputs, f"and on k, then again at positions + {shift}")
    scores = {}
    for s in (0, shift):
        rq, rk = _rope(impl, q, positions + s, base, call), _rope(impl, k, positions + s, base, call)
        scores[s] = rq.astype(np.float64) @ rk.astype(np.float64).swapaxes(-1, -2)  # (B, H, T, T): q_m·k_n
    magnitude = float((np.abs(impl.as_seen(q)) @ np.abs(impl.as_seen(k)).swapaxes(-1, -2)).max())  # Σ|q_i||k_i|: the terms' scale
    tol = rope_tolerance(impl, int(positions.max()) + shift).at_scale(magnitude)
    assert_close(scores[shift], scores[0], f"scores q_m·k_n with every position shifted by {shift}", tol, call)


@invariant(
    requires=("rope",),
    hint="it is not a rotation of pairs: cos without the partner's sin term (x·cos alone shrinks the vector), sin applied to "
    "the wrong partner (frequencies for one pairing, rotation in the other), a sign slip that turns the rotation into a "
    "reflection-and-scale, or pairs other than the declared pairing's (interleaved while ROPE_PAIRING says half-split, or neither)",
)
def preserves_pair_norms(impl, case):
    """Each rotated pair keeps its norm: |(x'_a, x'_b)| = |(x_a, x_b)| for every pair (a, b) of the pairing, to rounding."""
    inputs = draw_rope_inputs(impl, case, "inputs")
    x = inputs["x"]
    call = describe_call("rope", inputs)
    got = _rope(impl, x, inputs["positions"], inputs["base"], call).astype(np.float64)
    seen = impl.as_seen(x)
    answers = {}
    for pairing in rope_pairings(impl):
        first, second = ref.rope_pairs(seen, pairing)
        got_first, got_second = ref.rope_pairs(got, pairing)
        answers[pairing] = (np.hypot(first, second), np.hypot(got_first, got_second))  # (..., D/2) each: before, after
    tol = impl.tolerance.scaled(ROUNDINGS["rope"]).at_scale(float(np.abs(seen).max()) * np.sqrt(2))
    fits = {p: before for p, (before, after) in answers.items() if tol.allows(after, before).all()}
    if fits:
        return
    closest = min(answers, key=lambda p: np.abs(answers[p][1] - answers[p][0]).max())
    note = "either pairing passes" if len(answers) > 1 else f"the {closest} pairing {impl.label} declares"
    assert_close(answers[closest][1], answers[closest][0], f"norms of the rotated pairs ({closest} pairs; {note})", tol, call)


@invariant(
    requires=("rope",),
    hint="position 0 is not the identity: positions are counted from 1 (an off-by-one in arange(1, T + 1)), a constant "
    "phase is added to every angle, or the vector is scaled (cos and sin both applied without the rotation's structure)",
)
def position_zero_is_identity(impl, case):
    """At position 0 (angle 0) rope returns its input exactly (x rounded to float32 under COMPUTE_DTYPE): cos 0 = 1 and sin 0 = 0."""
    inputs = draw_rope_inputs(impl, case, "inputs")
    x = inputs["x"]
    zeros = np.zeros_like(inputs["positions"])
    call = describe_call("rope", {**inputs, "positions": zeros})
    got = _rope(impl, x, zeros, inputs["base"], call)
    assert_equal(got, input_as_rounded(impl, got, x), "rope output at position 0", call)


@invariant(
    requires=("rope",),
    hint="the pairing is not the declared one (half-split pairs (i, i + D/2), interleaved pairs (2i, 2i + 1): a checkpoint "
    "converted for one is wrong in the other), or the frequencies are wrong (θ_i = base^(-i/D), base^(-2i/(D - 2)), or the "
    "base ignored), or the rotation runs clockwise (x·cos + partner·sin for the first coordinate), or the angle p·θ is rounded "
    "to bfloat16 (cos and sin then miss by up to 1%)",
)
def pairing_anchor(impl, case):
    """Rotating the basis vector e_a at position p gives exactly 0 outside a's pair (a, b) and (cos pθ_i, ±sin pθ_i) on it.

    Pair i is (i, i + D/2) for half-split and (2i, 2i + 1) for interleaved, the declared ROPE_PAIRING
    or, undeclared, either one for the whole call; θ_i = base^(-2i/D), counter-clockwise:
    e_first -> cos·e_first + sin·e_second. Exact zeros outside the pair (each is 0·cos - 0·sin), the pair to rounding.
    """
    inputs = draw_rope_inputs(impl, case, "positions and base", max_position=1024)
    positions, base = inputs["positions"], inputs["base"]
    D, T = inputs["x"].shape[-1], len(positions)
    basis = np.broadcast_to(np.eye(D)[:, None, None, :], (D, 1, T, D)).copy()  # (D, 1, T, D): item a is e_a at every position
    call = f"rope(e_a for every a [(D, 1, T, D) = {basis.shape}], positions={positions.tolist()}, base={base!r})"
    got = _rope(impl, basis, positions, base, call).astype(np.float64)  # (D, 1, T, D): got[a, 0, t] = rope(e_a at positions[t])
    answers = {p: ref.rope(basis, positions, base, pairing=p) for p in rope_pairings(impl)}
    tol = rope_tolerance(impl, int(positions.max()))
    support = {p: np.broadcast_to(_pair_pattern(D, p)[:, None, None, :], got.shape) for p in answers}  # (D, 1, T, D): a's pair
    fits = [p for p in answers if (got[~support[p]] == 0).all() and tol.allows(got, answers[p]).all()]
    if fits:
        return
    closest = min(answers, key=lambda p: (int((got[~support[p]] != 0).sum()), np.abs(got - answers[p]).max()))
    outside = np.where(support[closest], 0.0, got)
    note = "either pairing passes, one for the whole call" if len(answers) > 1 else f"the pairing {impl.label} declares"
    assert_equal(outside, 0.0, f"rope(e_a) outside a's {closest} pair ({note})", call)
    assert_close(got, answers[closest], f"rope(e_a) on a's {closest} pair: (cos pθ_i, sin pθ_i), θ_i = base^(-2i/D) ({note})", tol, call)


@invariant(
    requires=("rope",),
    hint="the frequencies differ from θ_i = base^(-2i/D) (base^(-i/D), the base ignored or squared), the angle is computed in "
    "bfloat16 or float16 (positions past 256 become wrong; compute p·θ in float32 and round only cos and sin), or the pairing "
    "differs from the declared ROPE_PAIRING",
)
def agrees_with_reference(impl, case):
    """rope agrees with the float64 reference in its pairing (1e-10 in float64, the dtype tolerance otherwise, grown by the angle's rounding)."""
    inputs = draw_rope_inputs(impl, case, "inputs", max_position=1024)
    x, positions, base = inputs["x"], inputs["positions"], inputs["base"]
    call = describe_call("rope", inputs)
    got = _rope(impl, x, positions, base, call)
    answers = {p: ref.rope(impl.as_seen(x), positions, base, pairing=p) for p in rope_pairings(impl)}
    tol = agreement_tolerance(rounding_dtype(impl))
    if tol.dtype != "float64":
        tol = rope_tolerance(impl, int(positions.max()), base=tol)
    assert_close_to_a_pairing(impl, got, answers, "rope output", tol.at_scale(float(np.abs(impl.as_seen(x)).max())), call)
