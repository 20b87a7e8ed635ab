"""Invariants of the SwiGLU feed-forward network: the closed form on diagonal weights, linearity in the up branch, the reference.

swiglu(x (..., d), W_gate (d, F), W_up (d, F), W_down (F, d)) = (SiLU(x·W_gate) ⊙ x·W_up)·W_down,
SiLU(z) = z·σ(z). The branches are not interchangeable: SiLU belongs on the gate. Shipped slips:
SiLU on the other branch (ml-explore/mlx-lm#767: silu(x)·gate for silu(gate)·x), SiLU of the
product (Nijikadesu/breakdown-minimind#3), and SiLU alone with no gate (google-research/timesfm#493).
"""

from __future__ import annotations

import numpy as np

import invariants.reference.numpy as ref
from invariants.asserts import assert_close, assert_equal, assert_shape
from invariants.inputs import valid_inputs
from invariants.laws.reference_check import reference_answer, reference_tolerance
from invariants.protocol import ROUNDINGS, describe_call
from invariants.registry import invariant
from invariants.strategies.core import sampled_from
from invariants.strategies.decoder import swiglu_inputs

LESSON = 120  # where a lesson meets this component: the registry's order (test ids, the kill matrix's first failure)
HOLDS = ("swiglu",)  # the protocol functions whose laws it holds

DIAGONALS = (1.0, 2.0, 0.5, -1.0, -2.0, 3.0)  # gate and up scales a, b: signs and sizes where SiLU(a·x)·b·x and SiLU(b·x)·a·x differ
_OTHER_DIAGONALS = {a: sampled_from(tuple(b for b in DIAGONALS if b != a)) for a in DIAGONALS}
POWERS_OF_TWO = (2.0, 0.5, 4.0, -1.0, -2.0, 0.25, -0.5, 8.0)


@valid_inputs("swiglu")
def swiglu_arguments(impl, case):
    """Rows x (N, d) with W_gate, W_up (d, F) and W_down (F, d)."""
    inputs = case.draw(swiglu_inputs(max_rows=2), "inputs")
    return tuple(inputs[n] for n in ("x", "W_gate", "W_up", "W_down"))


def _swiglu(impl, x, W_gate, W_up, W_down, call):
    __tracebackhide__ = True
    return assert_shape(impl.swiglu(x, W_gate, W_up, W_down), x.shape[:-1] + (W_down.shape[1],), "swiglu output", call)


def _magnitude(impl, x, W_gate, W_up, W_down):
    """The largest Σ|terms| behind an output element: |SiLU(x·W_gate)|·|x·W_up| @ |W_down|, in float64 on the values impl sees."""
    x, W_gate, W_up, W_down = impl.as_seen((x, W_gate, W_up, W_down))
    return float((np.abs(ref.silu(x @ W_gate) * (x @ W_up)) @ np.abs(W_down)).max(initial=0.0))


@invariant(
    requires=("swiglu",),
    hint="the activation is not SiLU on the gate branch: SiLU on the up branch (silu(x·W_up)·x·W_gate), SiLU of the product "
    "(silu(x·W_gate ⊙ x·W_up)), GELU or sigmoid or ReLU instead of SiLU (z·σ(z)), or no gate at all (silu(x·W_gate) alone)",
)
def diagonal_closed_form(impl, case):
    """With W_gate = a·I, W_up = b·I and W_down = I, swiglu(x) = SiLU(a·x)·b·x, and with the scales swapped SiLU(b·x)·a·x:
    the two branches are not interchangeable (to rounding)."""
    x = case.draw(swiglu_inputs(), "inputs")["x"]  # (N, d)
    a = case.draw(sampled_from(DIAGONALS), "gate scale a")
    b = case.draw(_OTHER_DIAGONALS[a], "up scale b")  # another scale than a: no example is rejected
    d = x.shape[-1]
    eye = np.eye(d)
    seen = impl.as_seen(x)
    tol = impl.tolerance.scaled(ROUNDINGS["swiglu"])
    for gate, up in ((a, b), (b, a)):
        call = f"swiglu(x{list(x.shape)}, W_gate={gate!r}·I, W_up={up!r}·I, W_down=I)"
        got = _swiglu(impl, x, gate * eye, up * eye, eye, call)
        expected = ref.silu(gate * seen) * up * seen  # (N, d)
        assert_close(got, expected, f"swiglu with diagonal weights: SiLU({gate!r}·x)·{up!r}·x", tol.at_scale(float(np.abs(expected).max())), call)


@invariant(
    requires=("swiglu",),
    hint="the up branch passes through a nonlinearity: SiLU is applied to x·W_up (the branches swapped, as in ml-explore/mlx-lm#767) "
    "or to the product (silu(x·W_gate ⊙ x·W_up)), or W_up reaches the gate (the two projections fused and split the wrong way); "
    "or W_up is not used at all (SiLU of the gate alone), or something is added inside the network (a residual or a bias)",
)
def linear_in_up(impl, case):
    """swiglu is linear in W_up: swiglu(x; W_gate, c·W_up, W_down) = c·swiglu(x; W_gate, W_up, W_down), bitwise for c = ±2**k on the
    CPU in float32 and float64 (every rounding scales with c), to rounding elsewhere."""
    inputs = case.draw(swiglu_inputs(), "inputs")
    c = case.draw(sampled_from(POWERS_OF_TWO), "c (a power of two)")
    x, W_gate, W_up, W_down = (inputs[name] for name in ("x", "W_gate", "W_up", "W_down"))
    call = describe_call("swiglu", inputs, f"vs W_up scaled by {c!r}")
    got = _swiglu(impl, x, W_gate, c * impl.as_seen(W_up), W_down, call)
    expected = c * _swiglu(impl, x, W_gate, W_up, W_down, call).astype(np.float64)
    if impl.device == "cpu" and impl.dtype in ("float32", "float64"):
        assert_equal(got, expected, f"swiglu with W_up × {c!r}", call)
    else:
        tol = impl.tolerance.scaled(2).at_scale(abs(c) * _magnitude(impl, x, W_gate, W_up, W_down))
        assert_close(got, expected, f"swiglu with W_up × {c!r}", tol, call)


@invariant(
    requires=("swiglu",),
    hint="the network differs from (SiLU(x·W_gate) ⊙ x·W_up)·W_down: weights used transposed, a bias or a residual added, "
    "SiLU approximated, or W_down applied before the product",
)
def agrees_with_reference(impl, case):
    """swiglu agrees with the float64 reference (1e-10 in float64, the dtype tolerance otherwise, at the size of its terms)."""
    inputs = case.draw(swiglu_inputs(), "inputs")
    args = tuple(inputs[name] for name in ("x", "W_gate", "W_up", "W_down"))
    call = describe_call("swiglu", inputs)
    got = _swiglu(impl, *args, call)
    tol = reference_tolerance(impl, factor=ROUNDINGS["swiglu"])
    assert_close(got, reference_answer(impl, "swiglu", *args), "swiglu output", tol.at_scale(_magnitude(impl, *args)), call)
