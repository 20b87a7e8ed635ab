"""The suite's hypothesis settings profiles, pytest-free: the plugin, the gate and the mutation matrix read them here.

They are settings objects, not registered hypothesis profiles: loading one would change every
other hypothesis test in the same run. run_invariant applies them to the invariants alone.
"""

from __future__ import annotations

from hypothesis import HealthCheck, Phase, settings

# Hypothesis's explain phase annotates a failure with which parts of the example matter; the
# runner words its own report, and the phase costs seconds per failure, so it is left out.
PHASES = tuple(phase for phase in Phase if phase != Phase.explain)
_OPTIONS = {
    # Fast feedback while writing code: few examples, the example database on.
    "dev": dict(max_examples=20),
    # CI: the same examples every run, nothing written to disk (the gate seeds each submission from the course secret).
    "ci": dict(max_examples=60, derandomize=True, database=None, print_blob=True),
    # The soak: at least 10,000 examples per invariant, fresh randomness.
    "thorough": dict(max_examples=10_000, database=None, print_blob=True),
}
DEFAULT_PROFILE = "dev"
PROFILE_NAMES = tuple(_OPTIONS)
# Built on hypothesis's own defaults, never on whatever profile the host project has loaded.
PROFILES = {
    name: settings(
        settings.get_profile("default"),
        deadline=None,  # timing is a benchmark's business, not a test's
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
        phases=PHASES,
        report_multiple_bugs=False,  # one counterexample per invariant, the one the report words
        **options,
    )
    for name, options in _OPTIONS.items()
}


def profile_settings(name):
    """The hypothesis settings of profile `name` (dev, ci or thorough); ValueError naming the choices otherwise."""
    try:
        return PROFILES[name]
    except KeyError:
        raise ValueError(f"profile {name!r} is not one of {', '.join(PROFILE_NAMES)}") from None


def sharing(name, database):
    """Profile `name`'s settings with the shared example `database`: dev and thorough read and write it, ci only replays it.

    ci replays the database's failures before its own examples and writes nothing (invariants.runner), so
    its examples stay the same every run; thorough soaks on many machines write what they find there
    (docs/power.md, "The soak beyond one machine").
    """
    from hypothesis.database import ReadOnlyDatabase

    chosen = profile_settings(name)
    return settings(chosen, database=ReadOnlyDatabase(database) if chosen.derandomize else database)
