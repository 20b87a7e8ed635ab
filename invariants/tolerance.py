"""One table of comparison tolerances per dtype, anchored on torch.testing.assert_close's defaults.

A check passes when |actual - expected| <= atol + rtol·|expected| elementwise; for the 16-bit
dtypes rtol is taken relative to max|expected| over the array instead (a norm-wise bound):
with 10 or 7 mantissa bits, rounding the inputs moves a value near 0 by about rtol times the
array's scale, and an elementwise bound would demand more than the inputs carry. Checks that
compose many operations (a block, a stacked model) scale the table by a stated factor; the
factor is written next to the check, never tuned until a failure goes away; a function's own budget
of roundings is in its protocol entry (invariants.protocol.ROUNDINGS).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

# dtype: (rtol, atol), as torch.testing.assert_close uses them
TOLERANCES = {
    "float64": (1e-7, 1e-7),
    "float32": (1.3e-6, 1e-5),
    "float16": (1e-3, 1e-5),
    "bfloat16": (1.6e-2, 1e-5),
}

# The layer_norm_condition the table allows for: a row of d >= 2 unit-size values is mostly 1.5 to 4.
# Beyond it a check's tolerance grows with the condition (Tolerance.conditioned). Measured on reference.torch
# float32, 50,000 random blocks compared with their token-permuted selves: the error stays below 0.043·condition
# times twice the table at every condition, so up to 0.34 of the conditioned tolerance; without it, blocks past
# condition 64 reach 1.3 times the table.
LAYER_NORM_TYPICAL_CONDITION = 8.0

# The longest sum over keys the checks' factors were measured at: the default sequences of at most 8 tokens.
# The rounding error of a sum of n terms grows with n (at worst as γ_n ≈ n·u, Higham 2002, §4.2), so a check on
# longer sequences scales its tolerance in proportion (Tolerance.summed_over).
MEASURED_SUM_LENGTH = 8

# Agreement between two float64 implementations of the same maths (the P01 course's figure).
FLOAT64_AGREEMENT = 1e-10


@dataclass(frozen=True)
class Tolerance:
    """|actual - expected| <= atol + rtol·|expected|, elementwise."""

    rtol: float
    atol: float
    dtype: str

    def scaled(self, factor):
        """This tolerance multiplied by `factor` (for checks that compose `factor`-ish roundings)."""
        return Tolerance(self.rtol * factor, self.atol * factor, self.dtype)

    def at_scale(self, scale):
        """For a quantity derived from values of size `scale` (a row mean of unit-size outputs): atol + rtol·scale."""
        return Tolerance(self.rtol, self.atol + self.rtol * scale, self.dtype)

    def conditioned(self, condition, *, typical=LAYER_NORM_TYPICAL_CONDITION):
        """For a result computed through a LayerNorm of this `condition` (layer_norm_condition): unchanged up to
        `typical`, in proportion beyond it, since the norm magnifies the rounding errors of its input that much."""
        return self.scaled(max(1.0, condition / typical))

    def summed_over(self, n):
        """For a result behind sums of up to n terms (a softmax and weights @ v over n keys): unchanged up to
        MEASURED_SUM_LENGTH, in proportion beyond it, as a sum's worst-case rounding grows."""
        return self.scaled(max(1.0, n / MEASURED_SUM_LENGTH))

    @property
    def normwise(self):
        return self.dtype in ("float16", "bfloat16")

    def allows(self, actual, expected):
        """Elementwise: is each actual within tolerance of expected? NaN never is."""
        scale = np.abs(expected)
        if self.normwise and scale.size:
            scale = np.full_like(scale, np.nanmax(scale))
        return np.abs(actual - expected) <= self.atol + self.rtol * scale

    def __str__(self):
        relative_to = "max|expected|" if self.normwise else "|expected|"
        return f"atol={self.atol:g} + rtol={self.rtol:g}·{relative_to} ({self.dtype})"


def layer_norm_condition(x, eps):
    """How many times a LayerNorm over the last axis magnifies a rounding error in its input x (..., d).

    An error of u·max|row| in a row's values (what rounding the row leaves) moves the normalised row by
    about u·max|row| / √(var(row) + eps): the condition is the worst of max|row| / √(var(row) + eps) over
    rows. A row of nearly equal values is ill-conditioned: centring it cancels most of its digits. Rows of
    one feature count as 1 (their centred value is exactly 0, whatever the rounding).
    """
    return float(layer_norm_row_conditions(x, eps).max(initial=1.0))


def layer_norm_row_conditions(x, eps):
    """layer_norm_condition of each row of x (..., d) alone, as an array (...): at least 1, and 1 for rows of one feature."""
    x = np.asarray(x, dtype=np.float64)
    if x.shape[-1] <= 1:
        return np.ones(x.shape[:-1])
    return np.maximum(1.0, np.abs(x).max(-1) / np.sqrt(x.var(-1) + eps))


DTYPES = tuple(TOLERANCES)  # the floating dtypes an implementation runs in: those the table has a row for

# Each dtype's machine epsilon, the gap between 1 and the next number: numpy's finfo, and 2^-7 for bfloat16 (8 significant bits),
# which numpy lacks.
EPSILON = {dtype: 2.0**-7 if dtype == "bfloat16" else float(np.finfo(dtype).eps) for dtype in DTYPES}

# How close a function's answer must come to the reference's, relative to max(1, |answer|), for the gate to take it as computing
# its component (invariants.gate.degenerate): agreement to about half the dtype's digits in float64 and float32, a few of its
# roundings in 16 bits, where a function that does not compute it (a hard max, a block without attention) misses by O(1).
COMPUTES = {"float64": 1e-8, "float32": 1e-4, "float16": 1e-2, "bfloat16": 5e-2}


def tolerance_for(dtype):
    """The Tolerance of TOLERANCES for a dtype name."""
    rtol, atol = TOLERANCES[str(dtype)]
    return Tolerance(rtol, atol, str(dtype))


def agreement_tolerance(dtype):
    """How close an implementation must be to the float64 reference: 1e-10 in float64, the table otherwise."""
    if str(dtype) == "float64":
        return Tolerance(FLOAT64_AGREEMENT, FLOAT64_AGREEMENT, "float64")
    return tolerance_for(dtype)
