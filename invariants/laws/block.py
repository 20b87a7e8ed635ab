"""Invariants of transformer_block (pre-norm): the residual identity, one sublayer at a time, causality, equivariance.

What is drawn follows the implementation's declarations (invariants/conventions.py): params with
the attention biases b_q..b_o only where it declares ATTENTION_BIASES = True (so a block without
bias support passes, and one that declares support but ignores them fails agrees_with_reference),
causal=True only under CAUSAL_ONLY (permutation_equivariant, encoder mode, is then skipped), causal=False
only under ENCODER_ONLY (causal_non_leakage, decoder mode, is then skipped), the
feed-forward width FEED_FORWARD_RATIO·d (else 4·d), and its LayerNorm eps (LAYER_NORM_EPS, else
1e-5) wherever the check computes a norm itself or asks the reference.

Long sequences are drawn on purpose (at d_model <= 8, where they cost little): causal_non_leakage
draws 65 or 129 tokens half the time and runs at every length either side of 16, 32, 64
and 128 up to it, so a mask that is right only up to a block size or a tile shows; the exact identities draw
lengths on either side of each tile; shape_preserved draws inputs of up to about ±700 too.
"""

from __future__ import annotations

import numpy as np
from hypothesis import strategies as st

import invariants.reference.numpy as ref
from invariants.asserts import assert_close, assert_equal, assert_finite, assert_shape
from invariants.conventions import (
    NO_DECODER_MODE,
    NO_ENCODER_MODE,
    attention_biases,
    biases_as_declared,
    causal_modes,
    d_ff_for,
    input_as_rounded,
    layer_norm_eps,
)
from invariants.inputs import valid_inputs
from invariants.laws.attention import attention_output
from invariants.laws.reference_check import (
    assert_agrees_with_reference,
    assert_close_to_a_gelu_form,
    at_quiet_rows,
    reference_answers,
    reference_tolerance,
)
from invariants.registry import invariant
from invariants.strategies.core import (
    LONG_LENGTHS,
    SWEPT_LENGTHS,
    attention_shapes,
    float_arrays,
    integers,
    just,
    permutations,
    sampled_from,
    swept_lengths,
)
from invariants.strategies.norms import loud_rows
from invariants.strategies.params import block_params
from invariants.tolerance import layer_norm_row_conditions

LESSON = 60  # where a lesson meets this component: the registry's order (test ids, the kill matrix's first failure)
HOLDS = ("transformer_block",)  # the protocol functions whose laws it holds

OUTPUTS = {"attention": ("W_o", "b_o"), "feed_forward": ("W2", "b2")}  # what a sublayer's output is made of


def silenced(params, *sublayers):
    """A copy of block params whose named sublayers ('attention', 'feed_forward') output exactly 0: W_o, b_o or W2, b2 zeroed."""
    quiet = dict(params)
    for sublayer in sublayers:
        for name in OUTPUTS[sublayer]:
            if name in quiet:
                quiet[name] = np.zeros_like(quiet[name])
    return quiet


def _shape_and_input(case, *, min_seq=1, wide=False, long_lengths=(), max_scale=1.0, dtype="float64"):
    """Draw a shape and an input x (B, T, d) of unit-size values (up to max_scale; loud_rows past 256 in a float16 run, `dtype`);
    wide=True keeps d_model >= 8 (see wide_in_16_bits); long_lengths adds long sequences at d_model <= 8 half the time."""
    widths = dict(min_heads=2, min_d_head=4) if wide else dict(min_heads=1, min_d_head=1)
    shapes = attention_shapes(max_batch=2, min_seq=min_seq, max_seq=6, max_heads=3, max_d_head=4, long_lengths=long_lengths, **widths)
    shape = case.draw(shapes, "shape")
    return shape, case.draw(loud_rows(float_arrays((shape.batch, shape.seq, shape.d_model), max_scale=max_scale), dtype), "x")  # (B, T, d)


def block_params_for(impl, d_model, *, attn_bias=None):
    """block_params of width d_model that impl can take: its feed-forward width, the attention biases only if it
    declares ATTENTION_BIASES = True (attn_bias=False leaves them out whatever it declares), and zero norm or
    feed-forward biases where it declares LAYER_NORM_BIAS or FEED_FORWARD_BIASES = False."""
    bias = False if attn_bias is False else attention_biases(impl)
    return biases_as_declared(impl, block_params(d_model, d_ff=d_ff_for(impl, d_model), attn_bias=bias))


@valid_inputs("transformer_block")
def transformer_block_arguments(impl, case):
    """A (B, T, d) batch, block weights with the biases as declared, a head count dividing d, and a declared causal flag."""
    shape = case.draw(attention_shapes(max_batch=2, max_seq=4, max_heads=2, max_d_head=3), "shape")
    x = case.draw(float_arrays((shape.batch, shape.seq, shape.d_model)), "x")  # (B, T, d)
    params = case.draw(block_params_for(impl, shape.d_model), "params")
    return x, params, shape.n_heads, case.draw(sampled_from(causal_modes(impl)), "causal")


def draw_causal(impl, case):
    """Draw the causal flag: either, or impl's one mode where it declares CAUSAL_ONLY or ENCODER_ONLY."""
    modes = causal_modes(impl)
    return case.draw(st.booleans() if len(modes) == 2 else just(modes[0]), "causal")


def _block_case(impl, case, *, min_seq=1, attn_bias=None, wide=False, **inputs):
    """Draw a shape, an input x (B, T, d) and one block's params (see block_params_for); inputs go to _shape_and_input."""
    shape, x = _shape_and_input(case, min_seq=min_seq, wide=wide, dtype=impl.dtype, **inputs)
    return shape, x, case.draw(block_params_for(impl, shape.d_model, attn_bias=attn_bias), "params")


def norms_condition(impl, x, params, n_heads, causal):
    """The worse layer_norm_condition of the block's two norm inputs, x and h = x + attn(LN1(x)), computed in float64."""
    return float(norms_row_conditions(impl, x, params, n_heads, causal).max(initial=1.0))


def norms_row_conditions(impl, x, params, n_heads, causal):
    """norms_condition of each position alone (B, T): the worse layer_norm_condition of its rows of x and of h = x + attn(LN1(x))."""
    x, p = impl.as_seen((x, params))
    eps = layer_norm_eps(impl)
    biases = {name: p[name] for name in ref.ATTENTION_BIAS_NAMES if name in p}
    attended, _ = ref.attention(ref.layer_norm(x, p["ln1_g"], p["ln1_b"], eps), p["W_q"], p["W_k"], p["W_v"], p["W_o"], n_heads, causal, **biases)
    return np.maximum(layer_norm_row_conditions(x, eps), layer_norm_row_conditions(x + attended, eps))  # h: (B, T, d)


def wide_in_16_bits(impl):
    """Whether to draw d_model >= 8 when comparing with the float64 reference: in float16 and bfloat16, yes.

    A LayerNorm multiplies the absolute error of its input row by about max|row| / std(row). With
    2 or 3 features a row's spread is often small next to its largest entry, and a correct 16-bit
    block then misses the float64 answer by 10-100× the table (measured on reference.torch: d = 2
    reaches 23× in bfloat16, 13× in float16; from d = 8 on, the worst of 3,000 float16 blocks is 1.9×).
    """
    return impl.dtype in ("float16", "bfloat16")


@invariant(
    requires=("transformer_block",),
    hint="the residual is replaced instead of added (x = attn(LN(x)) for x = x + attn(LN(x))), a sublayer has no skip, "
         "or a norm is applied after the add (post-norm LN(x + f(x))): a pre-norm block with silent sublayers is the identity",
)
def residual_identity(impl, case):
    """With W_o, W2, b2 (and b_o) zeroed, a block returns its input exactly (x rounded to float32 under COMPUTE_DTYPE), and so does
    a stack of up to 4 such blocks."""
    shape, x = _shape_and_input(case, long_lengths=LONG_LENGTHS)
    stack = case.draw(st.lists(block_params_for(impl, shape.d_model), min_size=1, max_size=4), "params of each block")
    causal = draw_causal(impl, case)
    y = x
    for i, params in enumerate(stack):
        call = f"transformer_block(x, silenced params, n_heads={shape.n_heads}, causal={causal}), block {i + 1} of {len(stack)}"
        quiet = silenced(params, "attention", "feed_forward")
        y = assert_shape(impl.transformer_block(y, quiet, shape.n_heads, causal), x.shape, "block output", call)
        # Exact: each sublayer adds exactly 0 (a zero matrix times finite values), and x + 0.0 == x for every x,
        # -0.0 included (-0.0 + 0.0 is +0.0, which == counts as equal to -0.0).
        assert_equal(y, input_as_rounded(impl, y, x), f"output of block {i + 1} of {len(stack)}", call)


@invariant(
    requires=("transformer_block", "feed_forward", "layer_norm"),
    hint="the feed-forward sublayer reads the wrong norm (ln1's gain and bias, or the stream without LN) "
         "or its output is not added to the stream: with attention silenced the block is x + FFN(LN2(x))",
)
def feed_forward_sublayer_alone(impl, case):
    """With the attention sublayer silenced (W_o = 0, b_o = 0), the block returns x + feed_forward(layer_norm(x; ln2_g, ln2_b))."""
    shape, x, p = _block_case(impl, case)
    causal = draw_causal(impl, case)
    call = f"transformer_block(x, params with W_o = 0, n_heads={shape.n_heads}, causal={causal})"
    got = impl.transformer_block(x, silenced(p, "attention"), shape.n_heads, causal)
    normed = impl.layer_norm(x, p["ln2_g"], p["ln2_b"], layer_norm_eps(impl))  # (B, T, d)
    expected = impl.as_seen(x) + impl.feed_forward(normed, p["W1"], p["b1"], p["W2"], p["b2"])  # (B, T, d)
    assert_close(got, expected, "block output", impl.tolerance, call)  # one rounding apart: the block's residual sum


@invariant(
    requires=("transformer_block", "attention", "layer_norm"),
    hint="the attention sublayer reads the un-normalised stream (x + attn(x)) or the wrong norm (ln2's params), "
         "or its output is not added to the stream, or it runs without the causal mask: with the feed-forward silenced the "
         "block is x + attn(LN1(x), causal)",
)
def attention_sublayer_alone(impl, case):
    """With the feed-forward silenced (W2 = 0, b2 = 0), the block returns x + attention(layer_norm(x; ln1_g, ln1_b))."""
    shape, x, p = _block_case(impl, case, attn_bias=False)  # the protocol's attention() takes no biases
    causal = draw_causal(impl, case)
    call = f"transformer_block(x, params with W2 = 0 and b2 = 0, n_heads={shape.n_heads}, causal={causal})"
    got = impl.transformer_block(x, silenced(p, "feed_forward"), shape.n_heads, causal)
    normed = impl.layer_norm(x, p["ln1_g"], p["ln1_b"], layer_norm_eps(impl))  # (B, T, d)
    attended = attention_output(impl, impl.attention(normed, p["W_q"], p["W_k"], p["W_v"], p["W_o"], shape.n_heads, causal))  # (B, T, d)
    expected = impl.as_seen(x) + attended
    assert_close(got, expected, "block output", impl.tolerance, call)  # one rounding apart: the block's residual sum


@invariant(
    requires=("transformer_block",),
    hint="the block changes the shape (heads not merged back to d, a sequence axis reduced) or overflows to inf/NaN",
)
def shape_preserved(impl, case):
    """transformer_block maps a (B, T, d) input to a finite (B, T, d) output, causal or not.

    Inputs of size up to about ±700 (grid values times up to 2**8) and lengths up to 129 are drawn:
    finite in every dtype, float16 included, where x² (in a norm) no longer is.
    """
    shape, x, params = _block_case(impl, case, long_lengths=LONG_LENGTHS, max_scale=2.0**8)
    causal = draw_causal(impl, case)
    call = f"transformer_block(x, params, n_heads={shape.n_heads}, causal={causal})"
    y = assert_shape(impl.transformer_block(x, params, shape.n_heads, causal), x.shape, "block output", call)
    assert_finite(y, "block output", call)


@invariant(
    requires=("transformer_block",),
    hint="the block does not pass causal=True to its attention, builds the mask for the wrong positions or only up "
         "to some length (a mask buffer for a fixed block size, a kernel masking only within its tiles: see the length "
         "in the call), or something mixes tokens outside attention (a norm over the sequence axis)",
    applies=NO_DECODER_MODE,
)
def causal_non_leakage(impl, case):
    """In decoder mode (causal=True), changing x at positions >= j leaves the block's outputs at positions < j exactly equal.

    Drawn at lengths up to 129: a long draw runs at every length either side of 16, 32, 64 and 128 up to it.
    """
    shape, x, params = _block_case(impl, case, min_seq=2, long_lengths=SWEPT_LENGTHS)
    drawn_j = case.draw(integers(1, shape.seq - 1), "j (first changed position; at most T - 1 at each length T)")
    new = case.draw(float_arrays((shape.batch, shape.seq - 1, shape.d_model)), "new x[:, 1:] (used from j on)")  # (B, T - 1, d)
    for T in swept_lengths(shape.seq):
        j = min(drawn_j, T - 1)
        changed = x.copy()
        changed[:, j:] = new[:, j - 1 :]  # every position from j on changes
        call = f"transformer_block(x[{shape.batch}, {T}, {shape.d_model}], params, n_heads={shape.n_heads}, causal=True) with x[:, {j}:] changed"
        before = impl.transformer_block(x[:, :T], params, shape.n_heads, True)
        after = impl.transformer_block(changed[:, :T], params, shape.n_heads, True)
        # Exact: a masked weight is exactly 0 and 0·v is 0 for any finite v, so no bit of the future reaches the past.
        assert_equal(after[:, :j], before[:, :j], f"block output at positions < {j}", call)


@invariant(
    requires=("transformer_block",),
    hint="the block masks even with causal=False (the flag is ignored or hard-coded), or adds position information of its own",
    applies=NO_ENCODER_MODE,
)
def permutation_equivariant(impl, case):
    """In encoder mode (causal=False), permuting the tokens of x permutes the block's output the same way."""
    shape, x, params = _block_case(impl, case)
    perm = np.array(case.draw(permutations(range(shape.seq)), "permutation"))
    call = f"transformer_block(x[:, perm], params, n_heads={shape.n_heads}, causal=False) vs transformer_block(x, ...)[:, perm]"
    permuted = impl.transformer_block(x[:, perm], params, shape.n_heads, False)
    expected = impl.transformer_block(x, params, shape.n_heads, False)[:, perm]
    # Both sides are rounded by the implementation, and the attention sums run in another order: twice the table,
    # grown with the norms' condition (LN2 magnifies the attention's rounding by it; see Tolerance.conditioned).
    tolerance = impl.tolerance.scaled(2).conditioned(norms_condition(impl, x, params, shape.n_heads, False))
    assert_close(permuted, expected, "block output on permuted tokens", tolerance, call)


@invariant(
    requires=("transformer_block",),
    hint="the block differs from GPT-2's: pre-norm, attention then feed-forward in sequence (the FFN reads x + attn, "
         "not x: no parallel sublayers), the attention biases used when given (where ATTENTION_BIASES = True is declared), "
         "LayerNorm eps 1e-5 (or the declared LAYER_NORM_EPS), one GELU form throughout (the declared GELU_FORM); or LayerNorm's "
         "variance in float16 (inf past 256)",
)
def agrees_with_reference(impl, case):
    """transformer_block agrees with the float64 reference (to 1e-10 in float64, the dtype tolerance otherwise).

    The reference uses the declared GELU_FORM, or either form for the whole block where none is
    declared (a block that mixes the forms matches neither), and the declared LAYER_NORM_EPS.
    In float16 and bfloat16 the block is drawn with d_model >= 8, where LayerNorm is well-conditioned (see wide_in_16_bits);
    below float64 the tolerance grows with the norms' condition (see norms_condition).
    """
    shape, x, params = _block_case(impl, case, wide=wide_in_16_bits(impl))
    causal = draw_causal(impl, case)
    got = impl.transformer_block(x, params, shape.n_heads, causal)
    call = f"transformer_block(x, params, n_heads={shape.n_heads}, causal={causal})"
    # Two sublayers of a few roundings each and two residual sums: 4 × the table (the worst measured is 1.9×, see
    # wide_in_16_bits), grown with the norms' condition, since LN2 magnifies the attention's rounding by it.
    condition = norms_condition(impl, x, params, shape.n_heads, causal)
    assert_agrees_with_reference(impl, "transformer_block", (x, params, shape.n_heads, causal), got, "block output",
                                 factor=4, condition=condition, call=call, options={"eps": layer_norm_eps(impl)}, gelu=True)
    quiet = at_quiet_rows(x, got, lambda: reference_answers(impl, "transformer_block", x, params, shape.n_heads, causal, eps=layer_norm_eps(impl)))
    if quiet is not None:
        assert_close_to_a_gelu_form(impl, *quiet, "block output at the rows below 256", reference_tolerance(impl, factor=4, condition=condition),
                                    call)
