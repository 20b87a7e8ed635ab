"""Invariants of dtypes: every floating answer comes back in the dtype its floating inputs went in.

One invariant per protocol function with floating answers, so that a partial implementation
skips exactly what it lacks and a failure names the function. Integer and count answers
(tokens_per_expert, gpt_param_count, moe_n_params, encode, get_batch, ...) are not floating
and are left to their own invariants; the scalar answers (cross_entropy, load_balancing_loss)
are 0-d arrays and keep the dtype like any other.

Why it needs checking: under numpy 2's promotion rules (NEP 50) a numpy float64 scalar or
0-d array is as strong as a float64 array, so `x32 / np.sqrt(d)` or `x32 + np.float64(eps)` is
float64, while a Python float (`math.sqrt(d)`, `1e-5`) adopts x's dtype. A float32 run of such
code agrees with the reference better than it should and passes every value check; only its
dtype tells. In torch the usual slip goes the other way: a buffer made with torch's default
dtype (`torch.zeros(N, d)`) is float32 whatever x is, so a float64 or bfloat16 run answers
float32.

The expected dtype is `answer_dtype(impl)`: the run's dtype, except that a bfloat16 answer
arrives as float32 (numpy has no bfloat16; the suite and the gate's worker widen it exactly).
In a bfloat16 run a float32 answer must therefore also hold bfloat16 numbers only: a value off
the bfloat16 grid was computed, or kept, in float32.
"""

from __future__ import annotations

import numpy as np

from invariants.asserts import assert_dtype, assert_where
from invariants.laws.table_laws import parts_named, per_entry
from invariants.protocol import FUNCTIONS

LESSON = 180  # where a lesson meets this component: the registry's order (test ids, the kill matrix's first failure)
HOLDS = ()  # every entry's dtype law (invariants.protocol.FUNCTIONS)

# Protocol functions whose answers are not floating, with what they return: no dtype to keep (their entries' `floating` is empty).
NOT_FLOATING = {name: entry.returns for name, entry in FUNCTIONS.items() if not entry.floating}

COMMON_CAUSES = "docs/dtypes.md#where-a-dtype-leaks"  # the leaks every function shares (float64 scalars, default-dtype buffers, ...)


def _hint(specific):
    return f"{specific}; the leaks every function shares: {COMMON_CAUSES}"


def answer_dtype(impl):
    """The numpy dtype in which every floating answer of `impl` must arrive: its run dtype, bfloat16 carried as float32.

    The suite hands every floating input over in impl.dtype and brings every answer back as
    numpy (invariants.boundary; the gate's worker does the same). numpy has no bfloat16, so a
    bfloat16 tensor comes back widened to float32, exactly; every other dtype (float64, float32,
    float16, in either backend) comes back as itself, and a Python float as float64. This is the
    one place that decides the expected dtype.
    """
    return np.dtype(np.float32) if impl.dtype == "bfloat16" else np.dtype(impl.dtype)


def _why(impl):
    if impl.dtype == "bfloat16":
        return "the input dtype bfloat16, which numpy carries as float32"
    return "the input dtype"


def _on_bfloat16_grid(answer):
    """(...) True where a float32 value is a bfloat16 number: its low 16 mantissa bits are 0 (bfloat16 is float32's top half)."""
    bits = np.array(answer, dtype=np.float32, order="C").view(np.uint32)  # a copy keeps 0-d answers 0-d
    return (bits & np.uint32(0xFFFF)) == 0


def assert_keeps_dtype(impl, name, args):
    """Call impl.<name>(*args) and check that each floating answer of its entry (FUNCTIONS[name].floating) has answer_dtype(impl)."""
    __tracebackhide__ = True
    entry = FUNCTIONS[name]
    call, parts = entry.answered(impl, args)
    expected = answer_dtype(impl)
    for label, part, value, _ in parts:
        if part not in entry.floating:
            continue
        value = assert_dtype(value, expected, label, call, why=_why(impl))
        if impl.dtype == "bfloat16":
            assert_where(_on_bfloat16_grid(value), value, label, "a bfloat16 number (the answer was computed or kept in float32, "
                         "wider than the input dtype bfloat16)", call)


KEEPS_DTYPE = per_entry(
    __name__, "keeps_dtype", assert_keeps_dtype,
    statement=lambda entry: f"{entry.signature} returns {parts_named(entry, entry.floating)} in the dtype its floating inputs came in.",
    hint=lambda entry: _hint(entry.leaks or f"{entry.name}'s answer is not in its inputs' dtype"))  # the entry's typical leak first
