"""Invariants of transformer components: reusable checks, one module per component.

    from invariants import Implementation, run_invariant, all_invariants
    from invariants.laws.attention import causal_non_leakage   # an Invariant: call inv(impl, case)

See docs/catalogue.md for the list and invariants/registry.py for how one is declared. The names
below are imported on first use, so that the pytest plugin in this package costs a project
that does not run the invariants nothing.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"  # the distribution's version (pyproject.toml reads it); CHANGELOG.md says what changed

_EXPORTS = {
    "invariants.asserts": ("InvariantViolation", "assert_close", "assert_equal", "assert_finite", "assert_shape", "assert_where"),
    "invariants.protocol": ("FUNCTIONS", "PROTOCOL_VERSION", "Implementation", "load_implementation"),
    "invariants.registry": ("REGISTRY", "Invariant", "all_invariants", "invariant"),
    "invariants.runner": ("Case", "InvariantSkipped", "Outcome", "run_invariant"),
    "invariants.tolerance": ("TOLERANCES", "Tolerance", "tolerance_for"),
    "invariants.profiles": ("PROFILES", "profile_settings"),
}
_MODULE_OF = {name: module for module, names in _EXPORTS.items() for name in names}
__all__ = sorted(_MODULE_OF)


if TYPE_CHECKING:  # what a type checker sees of the lazy names above (tests/test_packaging.py keeps the two lists equal)
    from invariants.asserts import InvariantViolation, assert_close, assert_equal, assert_finite, assert_shape, assert_where  # noqa: F401
    from invariants.profiles import PROFILES, profile_settings  # noqa: F401
    from invariants.protocol import FUNCTIONS, PROTOCOL_VERSION, Implementation, load_implementation  # noqa: F401
    from invariants.registry import REGISTRY, Invariant, all_invariants, invariant  # noqa: F401
    from invariants.runner import Case, InvariantSkipped, Outcome, run_invariant  # noqa: F401
    from invariants.tolerance import TOLERANCES, Tolerance, tolerance_for  # noqa: F401


def __getattr__(name: str) -> Any:
    if name not in _MODULE_OF:
        raise AttributeError(f"module 'invariants' has no attribute {name!r}")
    value = getattr(importlib.import_module(_MODULE_OF[name]), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return __all__
