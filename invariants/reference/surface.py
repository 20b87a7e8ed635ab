"""A reference module's public surface, generated: `__all__` is read from what the module holds, never kept by hand.

    __getattr__ = surface(__name__)   # in invariants/reference/numpy.py: `from invariants.reference.numpy import *` gives its surface

The surface is every public function or class defined in (or brought into) the module from the reference package, and every
UPPER_CASE constant: a protocol function added anywhere in the file is exported as it is written, and numpy, torch and math
are not.
"""

from __future__ import annotations

import sys

PACKAGE = "invariants.reference"


def public(name, value):
    """Whether `name` = `value` in a reference module is part of its surface."""
    if name.startswith("_"):
        return False
    return name.isupper() or str(getattr(value, "__module__", "")).startswith(PACKAGE + ".")


def surface(module_name):
    """A module-level __getattr__ (PEP 562) answering `__all__` with the public names of module `module_name`, sorted."""

    def __getattr__(name):
        if name == "__all__":
            return sorted(n for n, value in vars(sys.modules[module_name]).items() if public(n, value))
        raise AttributeError(f"module {module_name!r} has no attribute {name!r}")

    return __getattr__
