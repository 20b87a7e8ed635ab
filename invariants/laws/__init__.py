"""The catalogue: one module per component, each holding the laws (invariants) of the protocol functions it lists in HOLDS.

    from invariants.laws.attention import causal_non_leakage   # an Invariant: call inv(impl, case)

The framework that runs them (registry, runner, plugin, protocol, tolerance, ...) is the package above; it reaches
these modules only by name, through invariants.registry.COMPONENTS, never by a static import.
"""
