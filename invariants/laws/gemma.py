"""Invariants of Gemma's details: GeGLU with the tanh GELU, the embedding scaled by √d_model in the model's dtype, and RMSNorm's
gain 1 + w applied in float32 before the one rounding back to the input's dtype.

Sources: the Gemma report (Gemma Team 2024, §2), transformers' modeling_gemma3.py (Gemma3MLP with gelu_pytorch_tanh,
Gemma3TextScaledWordEmbedding, Gemma3RMSNorm; Gemma 2's are the same), and the fixes that brought ports to Google's numerics:
huggingface/transformers#29402 (the tanh GELU, the norm's order, √d in bfloat16) and google/gemma_pytorch#67. The laws of the
dtype are exact: a scaled embedding's every value is table[id]·round(√d) rounded once, and a 16-bit gemma_rms_norm's every value
is the exact one rounded once (a norm cast to the dtype before its gain, as Llama's, rounds twice).
"""

from __future__ import annotations

import math

import numpy as np

import invariants.reference.numpy as ref
from invariants.asserts import assert_close, assert_equal, assert_shape
from invariants.boundary import rounded
from invariants.conventions import rounding_dtype
from invariants.inputs import valid_inputs
from invariants.laws.reference_check import reference_answer, reference_tolerance
from invariants.protocol import FUNCTIONS, ROUNDINGS
from invariants.registry import invariant
from invariants.strategies.decoder import swiglu_inputs
from invariants.strategies.gemma import gemma_norm_inputs, scaled_embedding_inputs
from invariants.strategies.norms import loud_rows

LESSON = 93  # where a lesson meets this component: the registry's order (test ids, the kill matrix's first failure)
HOLDS = ("geglu", "scaled_embedding", "gemma_rms_norm")  # the protocol functions whose laws it holds

GEGLU, EMBEDDING, NORM = FUNCTIONS["geglu"], FUNCTIONS["scaled_embedding"], FUNCTIONS["gemma_rms_norm"]
# x where the tanh and the exact GELU differ most (4.7e-4 at ±2.70): GELU(-2.75)·(-2.75) is 0.0417 in the tanh form, 0.0430 exactly
TANH_POINTS = np.array([[-2.75, -1.5, 1.5, 2.75]])  # exact in every dtype
SIXTEEN_BITS = ("float16", "bfloat16")
# how far float32's computation of a norm of up to 16 features may move a value, relative: a few of its roundings (2^-24 each)
FLOAT32_SLACK = 2.0**-16


def _not_in_sixteen_bits(why):
    """An applies= function: the reason, in a 16-bit run."""
    return lambda impl: f"in {impl.dtype}, {why}" if impl.dtype in SIXTEEN_BITS else None


@valid_inputs("geglu")
def geglu_arguments(impl, case):
    """Rows x (N, d) with W_gate, W_up (d, F) and W_down (F, d)."""
    return GEGLU.arguments_of(case.draw(swiglu_inputs(max_rows=2), "inputs"))


@valid_inputs("scaled_embedding")
def scaled_embedding_arguments(impl, case):
    """ids (B, T) in [0, V) and a table (V, d) of grid values, d small or a published Gemma's."""
    return EMBEDDING.arguments_of(case.draw(scaled_embedding_inputs(), "embedding call"))


@valid_inputs("gemma_rms_norm")
def gemma_rms_norm_arguments(impl, case):
    """Rows x (N, d) of spread bounded away from 0, norm weights w (d,) and Gemma's eps."""
    return NORM.arguments_of(case.draw(gemma_norm_inputs(), "norm call"))


# ---------------------------------------------------------------------------
# GeGLU
# ---------------------------------------------------------------------------


@invariant(
    requires=("geglu",),
    applies=_not_in_sixteen_bits("a correct GELU computed in the dtype misses by more than the two forms differ"),
    hint=(
        "the GELU is the exact x·Φ(x) (F.gelu without approximate='tanh', nn.GELU()), not the tanh form Gemma was trained with "
        "(huggingface/transformers#29402, mlc-ai/mlc-llm#2106, NVIDIA-NeMo/Megatron-Bridge#4661)"
    ),
)
def geglu_tanh_form(impl, case):
    """With W_gate = W_up = W_down = I, geglu(x) = GELU_tanh(x)·x, at x = ±1.5 and ±2.75, where the exact GELU is 3% away."""
    eye = np.eye(TANH_POINTS.shape[-1])
    call = f"geglu(x={TANH_POINTS.tolist()}, W_gate=I, W_up=I, W_down=I)"
    got = assert_shape(impl.geglu(TANH_POINTS, eye, eye, eye), TANH_POINTS.shape, "geglu output", call)
    expected = ref.gelu(TANH_POINTS) * TANH_POINTS
    assert_close(got, expected, "geglu with identity weights: GELU_tanh(x)·x", reference_tolerance(impl, factor=ROUNDINGS["geglu"]), call)


@invariant(
    requires=("geglu",),
    hint="the network differs from (GELU_tanh(x·W_gate) ⊙ x·W_up)·W_down: the GELU on the up branch, SiLU in place of GELU (a "
    "Llama MLP), the exact GELU, weights used transposed, or W_down applied before the product",
)
def geglu_agrees_with_reference(impl, case):
    """geglu agrees with the float64 reference (1e-10 in float64, the dtype tolerance otherwise, at the size of its terms)."""
    inputs = case.draw(swiglu_inputs(), "inputs")
    args = GEGLU.arguments_of(inputs)
    call = GEGLU.describe(inputs)
    got = assert_shape(impl.geglu(*args), inputs["x"].shape[:-1] + (inputs["W_down"].shape[1],), "geglu output", call)
    x, W_gate, W_up, W_down = impl.as_seen(args)
    size = float((np.abs(ref.gelu(x @ W_gate) * (x @ W_up)) @ np.abs(W_down)).max(initial=0.0))  # the largest Σ|terms|
    tol = reference_tolerance(impl, factor=ROUNDINGS["geglu"]).at_scale(size)
    assert_close(got, reference_answer(impl, "geglu", *args), "geglu output", tol, call)


# ---------------------------------------------------------------------------
# The scaled embedding
# ---------------------------------------------------------------------------


@invariant(
    requires=("scaled_embedding",),
    hint=(
        "the rows are not multiplied by √d rounded to the dtype: √d kept in float32 (a Python float or a float32 tensor times a "
        "bfloat16 table: huggingface/transformers#29402, google/gemma_pytorch#67), no scaling at all, d for √d, or a division"
    ),
)
def scaled_embedding_exact(impl, case):
    """Each value is table[id]·round(√d) rounded to the dtype, bitwise (√d rounded to the dtype the answer carries first)."""
    inputs = case.draw(scaled_embedding_inputs(), "embedding call")
    ids, table = inputs["ids"], inputs["table"]
    call = EMBEDDING.describe(inputs)
    got = assert_shape(impl.scaled_embedding(ids, table), ids.shape + table.shape[-1:], "scaled_embedding output", call)
    d = table.shape[-1]
    normaliser = float(rounded(np.array(math.sqrt(d)), rounding_dtype(impl)))
    expected = rounded(impl.as_seen(table)[ids] * normaliser, impl.dtype).astype(np.float64)  # the exact product, rounded once
    assert_equal(got, expected, f"scaled_embedding output (table[ids] · {normaliser!r}, √{d} in {rounding_dtype(impl)})", call)


# ---------------------------------------------------------------------------
# Gemma's RMSNorm
# ---------------------------------------------------------------------------


@invariant(
    requires=("gemma_rms_norm",),
    hint="the gain is w, not 1 + w (a Llama RMSNorm on Gemma's weights: every output 0 at w = 0; linkedin/Liger-Kernel#74, "
    "pytorch/executorch#19901), or 1 is added twice (2 + w)",
)
def gemma_rms_norm_zero_weight(impl, case):
    """gemma_rms_norm(x, 0, eps) is the plain RMS normalisation x / √(mean(x²) + eps): w = 0 is the identity gain."""
    inputs = case.draw(gemma_norm_inputs(), "norm call")
    x, eps = inputs["x"], inputs["eps"]
    w = np.zeros(x.shape[-1])
    call = NORM.describe({**inputs, "w": w}, "with w = 0")
    got = assert_shape(impl.gemma_rms_norm(x, w, eps), x.shape, "gemma_rms_norm output", call)
    expected = reference_answer(impl, "rms_norm", x, np.ones(x.shape[-1]), eps)
    assert_close(got, expected, "gemma_rms_norm output with w = 0", reference_tolerance(impl, factor=ROUNDINGS["gemma_rms_norm"]), call)


@invariant(
    requires=("gemma_rms_norm",),
    hint="the norm differs from x / √(mean(x²) + eps) · (1 + w): eps outside the root or left out, the gain w or 2 + w, the "
    "variance centred (a LayerNorm), or x² taken in float16 (inf past |x| ≈ 256: the statistics belong in float32)",
)
def gemma_rms_norm_agrees_with_reference(impl, case):
    """gemma_rms_norm agrees with the float64 reference (1e-10 in float64, the dtype tolerance otherwise), on rows past 256 in
    float16 too (loud_rows), whose squares only a float32 norm holds."""
    inputs = case.draw(loud_rows(gemma_norm_inputs(), impl.dtype, part="x"), "norm call")
    args = NORM.arguments_of(inputs)
    call = NORM.describe(inputs)
    got = assert_shape(impl.gemma_rms_norm(*args), inputs["x"].shape, "gemma_rms_norm output", call)
    tol = reference_tolerance(impl, factor=ROUNDINGS["gemma_rms_norm"])
    assert_close(got, reference_answer(impl, "gemma_rms_norm", *args), "gemma_rms_norm output", tol, call)


@invariant(
    requires=("gemma_rms_norm",),
    applies=lambda impl: None if impl.dtype in SIXTEEN_BITS else f"in {impl.dtype} the computation itself rounds to it",
    hint=(
        "the norm is rounded to the 16-bit dtype before the gain (Llama's order: (1 + w) · x_normed.to(dtype), "
        "google/gemma_pytorch#67, huggingface/transformers#29402), or 1 + w is computed in the 16-bit dtype, which drops w's "
        "last bits (1 + 1/256 is 1 in bfloat16)"
    ),
)
def gemma_rms_norm_rounded_once(impl, case):
    """In a 16-bit run each output is the exact x / √(mean(x²) + eps) · (1 + w) rounded once to the dtype (either neighbour
    where it lies within float32's rounding of a tie), as float32's computation cast back gives."""
    inputs = case.draw(gemma_norm_inputs(), "norm call")
    args = NORM.arguments_of(inputs)
    call = NORM.describe(inputs)
    got = assert_shape(impl.gemma_rms_norm(*args), inputs["x"].shape, "gemma_rms_norm output", call)
    exact = reference_answer(impl, "gemma_rms_norm", *args)  # float64
    low, high = (rounded(exact * (1 + side * FLOAT32_SLACK), impl.dtype) for side in (-1, 1))
    expected = np.where(got == high, high, low).astype(np.float64)  # the rounding got chose where either is right, else the lower
    assert_equal(got, expected, f"gemma_rms_norm output (the exact value rounded once to {impl.dtype})", call)
