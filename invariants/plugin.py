"""pytest plugin: choose the implementation under test and the hypothesis profile.

Options (each also an environment variable; the command line wins):
    --impl TARGET          TI_IMPL          module, path/to/file.py, or either + ':object' (default reference.numpy)
    --impl-backend NAME    TI_BACKEND       numpy | torch (default: the target's BACKEND)
    --impl-device NAME     TI_DEVICE        cpu | cuda | cuda:N (default cpu)
    --impl-dtype NAME      TI_DTYPE         float64 | float32 | float16 | bfloat16 (default float64)
    --hypothesis-profile   TI_PROFILE       dev | ci | thorough (default dev)

Registered through the `pytest11` entry point and by the project's conftest.py.
"""

from __future__ import annotations

import os

import pytest
from hypothesis import HealthCheck, Phase, settings

from invariants.protocol import BACKENDS, DTYPES, ImplementationLoadError, load_implementation

# Hypothesis's explain phase annotates a failure with which parts of the example matter; the
# runner words its own report, and the phase costs seconds per failure, so it is left out.
PHASES = tuple(phase for phase in Phase if phase != Phase.explain)
PROFILES = {
    # Fast feedback while writing code: few examples, the example database on.
    "dev": dict(max_examples=20),
    # CI and the gate: the same examples every run, nothing written to disk.
    "ci": dict(max_examples=60, derandomize=True, database=None, print_blob=True),
    # The soak: at least 10,000 examples per invariant, fresh randomness.
    "thorough": dict(max_examples=10_000, database=None, print_blob=True),
}
for _name, _options in PROFILES.items():
    settings.register_profile(
        _name,
        deadline=None,  # timing is a benchmark's business, not a test's
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
        phases=PHASES,
        **_options,
    )

OPTIONS = (  # (flag, environment variable, default, help)
    ("--impl", "TI_IMPL", "reference.numpy", "implementation under test: a module, a .py file or folder, or either + ':object'"),
    ("--impl-backend", "TI_BACKEND", None, f"array library the implementation takes ({' | '.join(BACKENDS)}); default: its BACKEND"),
    ("--impl-device", "TI_DEVICE", "cpu", "device for a torch implementation: cpu, cuda or cuda:N"),
    ("--impl-dtype", "TI_DTYPE", "float64", f"floating dtype of the inputs ({' | '.join(DTYPES)})"),
)


def pytest_addoption(parser):
    group = parser.getgroup("transformer-invariants")
    for flag, env, default, help_text in OPTIONS:
        group.addoption(flag, dest=flag[2:].replace("-", "_"), default=None, help=f"{help_text} [env {env}; default {default}]")


def _option(config, flag):
    for name, env, default, _ in OPTIONS:
        if name == flag:
            value = config.getoption(flag[2:].replace("-", "_"))
            return value if value is not None else os.environ.get(env, default)
    raise KeyError(flag)


@pytest.hookimpl(tryfirst=True)
def pytest_configure(config):
    # Runs before hypothesis's own plugin, which loads --hypothesis-profile when given.
    profile = os.environ.get("TI_PROFILE", "dev")
    if profile not in PROFILES:
        raise pytest.UsageError(f"TI_PROFILE={profile!r} is not one of {', '.join(PROFILES)}")
    settings.load_profile(profile)


def _cuda_missing(device):
    if not device.startswith("cuda"):
        return None
    try:
        import torch
    except ImportError:
        return f"--impl-device {device} needs torch, which is not installed"
    if not torch.cuda.is_available():
        return f"--impl-device {device} requested, but torch.cuda.is_available() is False on this machine: CUDA invariants NOT run"
    return None


class _Selection:
    """The implementation chosen on the command line, loaded once; or the reason it could not be."""

    def __init__(self, config):
        self.target = _option(config, "--impl")
        self.backend = _option(config, "--impl-backend")
        self.device = _option(config, "--impl-device")
        self.dtype = _option(config, "--impl-dtype")
        self.skip_reason = _cuda_missing(self.device)
        self.error = None
        self.impl = None
        if self.skip_reason is None:
            try:
                self.impl = load_implementation(self.target, backend=self.backend, device=self.device, dtype=self.dtype)
            except ImplementationLoadError as exc:
                self.error = f"cannot use --impl {self.target}: {exc}"

    def describe(self):
        if self.impl is not None:
            return repr(self.impl)
        return f"{self.target} (NOT LOADED: {self.skip_reason or self.error})"


_SELECTION_KEY = pytest.StashKey[_Selection]()


def selection(config):
    if _SELECTION_KEY not in config.stash:
        config.stash[_SELECTION_KEY] = _Selection(config)
    return config.stash[_SELECTION_KEY]


def pytest_report_header(config):
    from invariants.protocol import PROTOCOL_VERSION

    chosen = selection(config)
    lines = [f"transformer-invariants: protocol v{PROTOCOL_VERSION}, implementation {chosen.describe()}, "
             f"hypothesis profile {settings.get_current_profile_name()}"]
    if chosen.skip_reason:
        lines.append(f"WARNING: {chosen.skip_reason}; every invariant will be SKIPPED")
    return lines


def pytest_terminal_summary(terminalreporter):
    """One line: how many invariants passed and how many examples hypothesis ran through them (rejected draws included)."""
    counts = [dict(report.user_properties)["examples"] for report in terminalreporter.stats.get("passed", [])
              if report.when == "call" and "examples" in dict(report.user_properties)]
    if counts:
        invariants, examples = len(counts), sum(counts)
        terminalreporter.write_line(
            f"transformer-invariants: {invariants} invariant{'s' * (invariants != 1)} passed, "
            f"{examples:,} example{'s' * (examples != 1)} run (fewest {min(counts):,}, most {max(counts):,} per invariant)")


@pytest.fixture(scope="session")
def impl(request):
    """The implementation under test (an invariants.protocol.Implementation)."""
    chosen = selection(request.config)
    if chosen.skip_reason:
        pytest.skip(chosen.skip_reason)
    if chosen.error:
        pytest.fail(chosen.error, pytrace=False)
    return chosen.impl
