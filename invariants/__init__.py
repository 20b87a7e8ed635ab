"""Invariants of transformer components: reusable checks, one module per component.

    from invariants import Implementation, run_invariant, all_invariants
    from invariants.attention import causal_non_leakage   # an Invariant: call inv(impl, case)

See README.md for the list and invariants/registry.py for how one is declared.
"""

from invariants.asserts import InvariantViolation, assert_close, assert_equal, assert_finite, assert_shape, assert_where
from invariants.protocol import FUNCTIONS, PROTOCOL_VERSION, Implementation, load_implementation
from invariants.registry import REGISTRY, Invariant, all_invariants, invariant
from invariants.runner import Case, InvariantFailure, InvariantSkipped, run_invariant
from invariants.tolerance import TOLERANCES, Tolerance, tolerance_for

__all__ = [
    "FUNCTIONS", "PROTOCOL_VERSION", "REGISTRY", "TOLERANCES",
    "Case", "Implementation", "Invariant", "InvariantFailure", "InvariantSkipped", "InvariantViolation", "Tolerance",
    "all_invariants", "assert_close", "assert_equal", "assert_finite", "assert_shape", "assert_where",
    "invariant", "load_implementation", "run_invariant", "tolerance_for",
]
