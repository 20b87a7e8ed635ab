"""Valid inputs for each protocol function, drawn to honour what an implementation declares: the inputs part of its entry.

    args = VALID_INPUTS["layer_norm"](impl, case)   # (x, gain, bias, eps), in protocol order

A drawer takes the Implementation (its declarations: LAYER_NORM_EPS, ATTENTION_BIASES, SLIDING_WINDOW, ...) and the Case
to draw from, and returns the arguments of one call. Each lives in the component module whose HOLDS lists its function,
registered there with `@valid_inputs("<function>")` (invariants/laws/qk_norm.py: `qk_norm_attention_arguments`); this module
holds only the table. Looking up a function whose module is not imported yet imports it. The laws written once over the
table (invariants.laws.table_laws: dtypes, shapes, finite) call them; tests/test_inputs.py checks that every function of
invariants.protocol.FUNCTIONS that answers arrays has exactly one, in its module. Sizes are small: these inputs are for laws that hold at any size.
"""

from __future__ import annotations

import importlib

from invariants.registry import COMPONENTS


class _Drawers(dict):
    """protocol function -> drawer(impl, case) of its arguments, filled in as the component modules are imported."""

    def __missing__(self, function):
        for component, holds in COMPONENTS.items():
            if function in holds:
                importlib.import_module(f"invariants.laws.{component}")  # registers its drawers
        if function not in self:
            raise KeyError(f"no valid inputs for {function!r}: no component module registers them with @valid_inputs({function!r})")
        return dict.__getitem__(self, function)


VALID_INPUTS: dict = _Drawers()


def valid_inputs(function):
    """Register the decorated drawer(impl, case) as the valid inputs of the protocol function named `function`."""

    def register(drawer):
        if function in VALID_INPUTS:
            raise ValueError(f"the valid inputs of {function} are registered twice")
        VALID_INPUTS[function] = drawer
        return drawer

    return register
