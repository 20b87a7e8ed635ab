"""Invariants of cross-attention and the encoder-decoder's decoder block: every encoder position reached, none ordered, causality.

cross_attention(x (B, T, d), memory (B, S, d), W_q, W_k, W_v, W_o (d, d), n_heads) takes its queries
from the decoder stream and its keys and values from the encoder's output, with no mask: every
decoder position sees every encoder position, and the encoder's positions form a set (no order of
their own reaches the output). A cross-attention that inherits the decoder's causal mask shipped in
transformers' Mllama under SDPA (huggingface/transformers#48172). decoder_block(x, memory, params,
n_heads) is pre-norm: x + SelfAttn(LN1(x)) (causal), + CrossAttn(LN2(x), memory), + FFN(LN3(x)).
"""

from __future__ import annotations

import numpy as np

import invariants.reference.numpy as ref
from invariants.asserts import assert_close, assert_equal, assert_shape, assert_where
from invariants.conventions import biases_as_declared, d_ff_for, input_as_rounded, layer_norm_eps
from invariants.inputs import valid_inputs
from invariants.laws.reference_check import assert_agrees_with_reference, reference_answer, reference_answers, reference_tolerance
from invariants.protocol import FUNCTIONS, ROUNDINGS, describe_call
from invariants.registry import invariant
from invariants.strategies.core import float_arrays, integers, permutations
from invariants.strategies.decoder import cross_inputs, decoder_block_params
from invariants.strategies.norms import loud_rows
from invariants.tolerance import layer_norm_condition

LESSON = 150  # where a lesson meets this component: the registry's order (test ids, the kill matrix's first failure)
HOLDS = ("cross_attention", "decoder_block")  # the protocol functions whose laws it holds

PERTURBATION_SCALES = dict(min_scale=0.25, max_scale=4.0)
LOW_PRECISION = ("float16", "bfloat16")
CROSS = FUNCTIONS["cross_attention"]  # called(impl, inputs, call, **changes): out (B, T, d), weights (B, H, T, S) (None: ATTENTION_WEIGHTS = False)


@valid_inputs("cross_attention")
def cross_attention_arguments(impl, case):
    """x (B, T, d) and a memory (B, S, d) of up to 2 positions each, the four (d, d) projections and a head count dividing d."""
    return CROSS.arguments_of(case.draw(cross_inputs(max_seq=2, max_memory=2), "inputs"))


@valid_inputs("decoder_block")
def decoder_block_arguments(impl, case):
    """Cross-attention's inputs with a decoder block's weights, the width and biases as declared."""
    inputs = case.draw(cross_inputs(max_seq=2, max_memory=2), "inputs")
    d = inputs["x"].shape[-1]
    params = case.draw(biases_as_declared(impl, decoder_block_params(d, d_ff=d_ff_for(impl, d))), "params")
    return inputs["x"], inputs["memory"], params, inputs["n_heads"]


def _magnitude(impl, inputs):
    """The size of the terms behind an output element: max of (max|memory·W_v| over keys) @ |W_o|."""
    memory, W_v, W_o = (np.abs(impl.as_seen(inputs[name])) for name in ("memory", "W_v", "W_o"))
    return float(((memory @ W_v).max(axis=1, initial=0.0) @ W_o).max(initial=0.0))


def _shift(case, shape):
    """A change of memory[:, j] by at least 1 in every feature (so that even a 16-bit output sees it): ±[1, 4]."""
    size = case.draw(float_arrays(shape), "direction of the shift")
    return np.sign(size + (size == 0)) * (1.0 + np.minimum(np.abs(size), 3.0))


def _changed_somewhere(after, before):
    """(B, T) True where a position's output differs from before in at least one feature."""
    return (after != before).any(axis=-1)


def _output_tolerance(impl, inputs):
    """How far a correct cross_attention's output may be from the float64 reference's (cross_agrees_with_reference's bound)."""
    return reference_tolerance(impl, factor=ROUNDINGS["cross_attention"]).at_scale(_magnitude(impl, inputs))


def _must_change(impl, inputs, memory):
    """(B, T) True where the float64 reference's output moves by more than twice _output_tolerance when memory replaces
    inputs["memory"]: there a correct output, within that tolerance on both sides, must move too. Elsewhere the change
    can round away (a weight of e^-20 times a shift of 1 is below float32's resolution of an output of size 1)."""
    tol = _output_tolerance(impl, inputs)
    before = reference_answer(impl, "cross_attention", *CROSS.arguments_of(inputs))[0]
    after = reference_answer(impl, "cross_attention", *CROSS.arguments_of({**inputs, "memory": memory}))[0]
    return _moves_beyond(before, after, tol)


def _wider_than_16_bits(impl):
    """Why an encoder position's effect is not checked in float16 and bfloat16 (their 8 or 11 bits can round its share of a
    change away), or None in float32 and float64."""
    if impl.dtype in LOW_PRECISION:
        return (f"{impl.label} runs in {impl.dtype}, whose 8 or 11 bits can round away one encoder position's share of the output; "
                "this invariant runs in float32 and float64")
    return None


def _moves_beyond(before, after, tol):
    """(B, T) True where some feature moves from before to after by more than twice tol (at the larger of the two sizes)."""
    return (np.abs(after - before) > 2 * (tol.atol + tol.rtol * np.maximum(np.abs(before), np.abs(after)))).any(axis=-1)


@invariant(
    requires=("cross_attention",),
    hint="the cross-attention is masked: it inherits the decoder's causal mask (decoder position i sees encoder positions <= i, "
    "as in huggingface/transformers#48172), or a padding mask meant for the decoder; or its keys come from the decoder stream",
    applies=_wider_than_16_bits,
)
def sees_every_memory_position(impl, case):
    """Every cross-attention weight is > 0, and shifting the encoder output at any one position j changes the output at every decoder
    position (float32 and float64, wherever the reference's output moves by more than rounding)."""
    inputs = case.draw(cross_inputs(min_memory=2), "inputs")
    B, S, d = inputs["memory"].shape
    j = case.draw(integers(0, S - 1), "j (changed encoder position)")
    memory = inputs["memory"].copy()
    memory[:, j] += _shift(case, (B, d))
    call = describe_call("cross_attention", inputs, f"with memory[:, {j}] shifted")
    out, weights = CROSS.called(impl, inputs, call)
    new_out, _ = CROSS.called(impl, inputs, call, memory=memory)
    if weights is not None:
        assert_where(weights > 0, weights, "cross-attention weights", "> 0 at every encoder position (no mask)", call)
    assert_where(_changed_somewhere(new_out, out) | ~_must_change(impl, inputs, memory), new_out[..., 0],
                 f"output at each decoder position (feature 0 shown) after memory[:, {j}] changed",
                 "changed at every decoder position where the reference's output moves by more than rounding", call)


@invariant(
    requires=("cross_attention",),
    hint="the encoder positions carry an order into the cross-attention: RoPE or a relative-position bias applied to the "
    "memory's keys (position information belongs to the encoder, not to cross-attention), or a mask over the encoder positions",
)
def memory_permutation_invariance(impl, case):
    """Permuting the encoder positions leaves the cross-attention output unchanged and permutes its weights' columns the same way
    (to rounding)."""
    inputs = case.draw(cross_inputs(min_memory=2), "inputs")
    S = inputs["memory"].shape[1]
    p = np.array(case.draw(permutations(range(S)), "permutation p of the encoder positions"))
    call = describe_call("cross_attention", inputs, "vs the same on memory[:, p]")
    out, weights = CROSS.called(impl, inputs, call)
    moved_out, moved_weights = CROSS.called(impl, inputs, call, memory=inputs["memory"][:, p])
    tol = impl.tolerance.scaled(2)  # the same terms summed in another order
    if weights is not None:
        assert_close(moved_weights, weights[..., p], "weights on memory[:, p]", tol, call)
    assert_close(moved_out, out, "output on memory[:, p]", tol.at_scale(_magnitude(impl, inputs)), call)


@invariant(
    requires=("cross_attention",),
    hint="the roles are swapped (queries from the memory, keys and values from x) or the scale differs from 1/√D of the head, "
    "or the heads are split differently from the protocol's attention (contiguous column blocks)",
)
def cross_agrees_with_reference(impl, case):
    """cross_attention's output and weights agree with the float64 reference (1e-10 in float64, the dtype tolerance otherwise)."""
    inputs = case.draw(cross_inputs(), "inputs")
    call = describe_call("cross_attention", inputs)
    CROSS.assert_parts(CROSS.called(impl, inputs, call), reference_answer(impl, "cross_attention", *CROSS.arguments_of(inputs)), "", call,
                       {"weights": reference_tolerance(impl, factor=ROUNDINGS["cross_attention"]), "out": _output_tolerance(impl, inputs)})


# -- the decoder block --------------------------------------------------------------------------------------------

_OUTPUTS = ("W_o", "Wc_o", "W2", "b2")  # what the three sublayers' outputs are made of


def _block_case(impl, case, *, min_seq=1, min_memory=1):
    # x's rows past 256 in float16 runs (loud_rows); the label is the draw's, the same in every dtype (fixtures replay by it)
    inputs = case.draw(loud_rows(cross_inputs(min_seq=min_seq, min_memory=min_memory), impl.dtype, part="x"),
                       "x, memory and n_heads (the W's unused)")
    d = inputs["x"].shape[-1]
    params = case.draw(biases_as_declared(impl, decoder_block_params(d, d_ff=d_ff_for(impl, d))), "params")
    return inputs["x"], inputs["memory"], params, inputs["n_heads"]


def _block(impl, x, memory, params, n_heads, call):
    __tracebackhide__ = True
    return assert_shape(impl.decoder_block(x, memory, params, n_heads), x.shape, "decoder_block output", call)


@invariant(
    requires=("decoder_block",),
    hint="a sublayer's output replaces the stream instead of being added to it, or a norm is applied after an add (post-norm): "
    "with W_o, Wc_o, W2 and b2 zeroed a pre-norm decoder block is the identity",
)
def block_residual_identity(impl, case):
    """With W_o, Wc_o, W2 and b2 zeroed, the decoder block returns its input exactly (x rounded to float32 under COMPUTE_DTYPE),
    whatever the memory."""
    x, memory, params, n_heads = _block_case(impl, case)
    quiet = {name: np.zeros_like(value) if name in _OUTPUTS else value for name, value in params.items()}
    call = describe_call("decoder_block", dict(x=x, memory=memory, n_heads=n_heads), "with W_o = Wc_o = W2 = b2 = 0")
    got = _block(impl, x, memory, quiet, n_heads, call)
    assert_equal(got, input_as_rounded(impl, got, x), "decoder_block output", call)


@invariant(
    requires=("decoder_block",),
    hint="the decoder's self-attention is not causal (the mask dropped or given to the cross-attention instead), or the "
    "cross-attention's queries mix decoder positions",
)
def block_causal_non_leakage(impl, case):
    """Changing the decoder input at positions >= j leaves the decoder block's outputs at positions < j exactly equal, whatever the memory."""
    x, memory, params, n_heads = _block_case(impl, case, min_seq=2)
    B, T, d = x.shape
    j = case.draw(integers(1, T - 1), "j (first changed position)")
    changed = x.copy()
    changed[:, j:] = case.draw(float_arrays((B, T - j, d), **PERTURBATION_SCALES), "new x[:, j:]")
    call = describe_call("decoder_block", dict(x=x, memory=memory, n_heads=n_heads), f"with x[:, {j}:] changed")
    before, after = _block(impl, x, memory, params, n_heads, call), _block(impl, changed, memory, params, n_heads, call)
    assert_equal(after[:, :j], before[:, :j], f"decoder_block output at positions < {j}", call)


@invariant(
    requires=("decoder_block",),
    hint="the block's cross-attention does not read the memory (keys and values from the decoder stream: self-attention twice), "
    "or it is masked causally over the encoder positions",
    applies=_wider_than_16_bits,
)
def block_sees_every_memory_position(impl, case):
    """Shifting the encoder output at any one position j changes the decoder block's output at every decoder position (float32 and
    float64, wherever the reference block's output moves by more than rounding: a weight of e^-20 on j rounds the change away)."""
    x, memory, params, n_heads = _block_case(impl, case, min_memory=2)
    B, S, d = memory.shape
    j = case.draw(integers(0, S - 1), "j (changed encoder position)")
    changed = memory.copy()
    changed[:, j] += _shift(case, (B, d))
    call = describe_call("decoder_block", dict(x=x, memory=memory, n_heads=n_heads), f"with memory[:, {j}] shifted")
    before, after = _block(impl, x, memory, params, n_heads, call), _block(impl, x, changed, params, n_heads, call)
    assert_where(_changed_somewhere(after, before) | ~_block_must_change(impl, x, memory, changed, params, n_heads), after[..., 0],
                 f"output at each decoder position (feature 0 shown) after memory[:, {j}] changed",
                 "changed at every decoder position where the reference block's output moves by more than rounding", call)


def _block_must_change(impl, x, memory, changed, params, n_heads):
    """(B, T) True where the float64 reference block's output moves by more than twice block_agrees_with_reference's tolerance
    when memory becomes changed, in every GELU form impl may follow: there a correct block, within that tolerance of its form's
    answer on both sides, must move too (see _must_change)."""
    condition = max(_condition(impl, x, m, params, n_heads) for m in (memory, changed))
    tol = reference_tolerance(impl, factor=ROUNDINGS["cross_attention"], condition=condition)
    eps = {"eps": layer_norm_eps(impl)}
    before = reference_answers(impl, "decoder_block", x, memory, params, n_heads, **eps)
    after = reference_answers(impl, "decoder_block", x, changed, params, n_heads, **eps)
    return np.logical_and.reduce([_moves_beyond(before[form], after[form], tol) for form in before])


@invariant(
    requires=("decoder_block",),
    hint="the block differs from the pre-norm encoder-decoder block: the cross-attention reads the un-normalised stream or "
    "normalises the memory with ln2, the sublayers run in another order, or the GELU form differs from the declared GELU_FORM",
)
def block_agrees_with_reference(impl, case):
    """decoder_block agrees with the float64 reference (1e-10 in float64, the dtype tolerance otherwise)."""
    x, memory, params, n_heads = _block_case(impl, case)
    call = describe_call("decoder_block", dict(x=x, memory=memory, n_heads=n_heads))
    got = _block(impl, x, memory, params, n_heads, call)
    assert_agrees_with_reference(impl, "decoder_block", (x, memory, params, n_heads), got, "decoder_block output",
                                 factor=ROUNDINGS["cross_attention"], condition=_condition(impl, x, memory, params, n_heads), call=call,
                                 options={"eps": layer_norm_eps(impl)}, gelu=True)


def _condition(impl, x, memory, params, n_heads):
    """The worst layer_norm_condition of the block's three norm inputs, in float64 (see invariants/tolerance.py)."""
    x, memory, p = impl.as_seen((x, memory, params))
    eps = layer_norm_eps(impl)
    h1 = x + ref.attention(ref.layer_norm(x, p["ln1_g"], p["ln1_b"], eps), p["W_q"], p["W_k"], p["W_v"], p["W_o"], n_heads, True)[0]
    h2 = h1 + ref.cross_attention(ref.layer_norm(h1, p["ln2_g"], p["ln2_b"], eps), memory, p["Wc_q"], p["Wc_k"], p["Wc_v"], p["Wc_o"], n_heads)[0]
    return max(layer_norm_condition(h, eps) for h in (x, h1, h2))
