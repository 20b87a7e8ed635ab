"""pytest plugin: choose the implementation under test and the hypothesis profile of the invariants.

Options (each also an environment variable; the command line wins):
    --impl TARGET           TI_IMPL      module, path/to/file.py, or either + ':object' (default reference.numpy)
    --impl-backend NAME     TI_BACKEND   numpy | torch (default: the target's BACKEND)
    --impl-device NAME      TI_DEVICE    cpu | cuda | cuda:N (default cpu)
    --impl-dtype NAME       TI_DTYPE     float64 | float32 | float16 | bfloat16 (default float64)
    --invariants-profile    TI_PROFILE   dev | ci | thorough (default dev; invariants.profiles)
    --repro-dir DIR         TI_REPRO_DIR a runnable repro_<invariant>.py per failure (default: none)
    --invariants-json PATH  TI_JSON      one JSON record of the run, for `python -m invariants.htmlreport suite` (default: none)
    --examples-db ADDRESS   TI_EXAMPLES_DB  a shared example database, redis://host:port/db or a folder (default: none;
                                         invariants.examples_db): dev and thorough read and write it, ci replays its failures first

A guest in other projects' runs (registered through the `pytest11` entry point): it imports
nothing heavy, loads no hypothesis profile and prints nothing unless the invariants run. Its
profiles apply to the invariants alone, so a project's own hypothesis profile is left alone
even in the same run. It speaks up when asked: an --impl* option on the command line, or a
run whose arguments point into this package (`pytest --pyargs invariants`, `pytest invariants/`).
"""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent
OPTIONS = (  # (flag, environment variable, default, help)
    ("--impl", "TI_IMPL", "reference.numpy", "implementation under test: a module, a .py file or folder, or either + ':object'"),
    ("--impl-backend", "TI_BACKEND", None, "array library the implementation takes (numpy | torch); default: its BACKEND"),
    ("--impl-device", "TI_DEVICE", "cpu", "device for a torch implementation: cpu, cuda or cuda:N"),
    ("--impl-dtype", "TI_DTYPE", "float64", "floating dtype of the inputs (float64 | float32 | float16 | bfloat16)"),
    ("--invariants-profile", "TI_PROFILE", "dev", "hypothesis settings for the invariants: dev | ci | thorough"),
    ("--repro-dir", "TI_REPRO_DIR", None, "write a runnable repro_<invariant>.py (plain python, no hypothesis) for each failure into this folder"),
    ("--invariants-json", "TI_JSON", None, "write the run's record (one entry per invariant) to this JSON file at the end; "
     "{impl}, {backend}, {device} and {dtype} in the path are filled in"),
    ("--examples-db", "TI_EXAMPLES_DB", None, "a shared example database: redis://host:port/db or a folder; dev and thorough read and "
     "write it, ci replays its failures before its own examples, the fuzz targets (invariants/fuzz.py) write theirs there"),
)


def _dest(flag):
    return flag[2:].replace("-", "_")


def pytest_addoption(parser):
    group = parser.getgroup("transformer-invariants")
    for flag, env, default, help_text in OPTIONS:
        group.addoption(flag, dest=_dest(flag), default=None, help=f"{help_text} [env {env}; default {default}]")


def _option(config, flag):
    for name, env, default, _ in OPTIONS:
        if name == flag:
            value = config.getoption(_dest(flag))
            return value if value is not None else os.environ.get(env, default)
    raise KeyError(flag)


def asked(config):
    """Whether this run asked for the invariants: one of our options given, or an argument inside this package."""
    if any(config.getoption(_dest(flag)) is not None for flag, *_ in OPTIONS):
        return True
    for arg in config.args:
        target = str(arg).split("::")[0]
        if config.getoption("pyargs") and (target == PACKAGE.name or target.startswith(PACKAGE.name + ".")):
            return True
        path = (config.invocation_params.dir / target).resolve()
        if path == PACKAGE or PACKAGE in path.parents:
            return True
    return False


def pytest_configure(config):
    """When the invariants are asked for, refuse a bad option before anything runs, in one line; otherwise (or for --help) do nothing."""
    if not asked(config) or config.option.help:
        return
    if selection(config).backend == "torch" and hasattr(config, "workerinput"):
        _share_the_cores(config.workerinput)
    if fuzzing(config):
        _load_fuzz_profile(config)
    path = _option(config, "--invariants-json")
    if path and not hasattr(config, "workerinput"):  # under xdist the controller alone writes, from the workers' reports
        config.pluginmanager.register(_JsonRecord(config, path), "invariants-json")


def _share_the_cores(workerinput):
    """Give this xdist worker's torch its share of the cores: n workers of a thread per core each thrash (74 s against 14 s at -n 2).

    Torch's intra-op pool takes every core in every process; a run that sets OMP_NUM_THREADS (tox does) keeps its own choice.
    """
    if "OMP_NUM_THREADS" in os.environ:
        return
    import torch

    torch.set_num_threads(max(1, (os.cpu_count() or 1) // int(workerinput.get("workercount", 1))))


def fuzzing(config):
    """Whether this run collects the fuzz targets, invariants/fuzz.py (HypoFuzz's collection, or pytest given that module)."""
    for arg in config.args:
        target = str(arg).split("::")[0]
        if config.getoption("pyargs") and target == f"{PACKAGE.name}.fuzz":
            return True
        if (config.invocation_params.dir / target).resolve() == PACKAGE / "fuzz.py":
            return True
    return False


_FUZZ_KEYS = pytest.StashKey()


def _load_fuzz_profile(config):
    """Make hypothesis's default database the shared one seen through FuzzTargetKeys: HypoFuzz fuzzes only tests on the default database.

    A profile loaded for the whole process, which is why the fuzz targets live in a module only a fuzz run collects.
    """
    from hypothesis import settings

    from invariants.examples_db import FuzzTargetKeys
    from invariants.profiles import profile_settings

    keys = config.stash[_FUZZ_KEYS] = FuzzTargetKeys(selection(config).database or settings.get_profile("default").database)
    settings.register_profile("transformer-invariants-fuzz", settings(profile_settings("dev"), database=keys))
    settings.load_profile("transformer-invariants-fuzz")


def pytest_collection_modifyitems(config, items):
    """Each suite test names its invariant as data (a user property: the record reads it, never the test's id); in a fuzz run, skip each
    fuzz target that does not apply to the implementation, and file the others' examples under their invariant's key."""
    for item in items:
        inv = getattr(item, "callspec", None) and item.callspec.params.get("inv")
        if inv is not None and getattr(item, "function", None) is not None and item.function.__module__ == _SUITE_MODULE:
            item.user_properties.append(("invariant", inv.name))
    if _FUZZ_KEYS not in config.stash:
        return
    from invariants.examples_db import example_key
    from invariants.hypothesis_internals import pytest_item_key

    impl = selection(config).impl
    for item in items:
        inv = getattr(item, "callspec", None) and item.callspec.params.get("inv")
        if item.module.__name__ != f"{PACKAGE.name}.fuzz" or inv is None:
            continue
        reason = inv.skip_reason(impl)
        if reason:
            item.add_marker(pytest.mark.skip(reason=str(reason)))
        else:
            config.stash[_FUZZ_KEYS].alias(pytest_item_key(item), example_key(inv.name, impl))


DEVICES = re.compile(r"cpu|cuda(:\d+)?")  # what --impl-device takes


def _source(config, flag):
    """How the run set an option, for a message: the flag when given on the command line, else its environment variable."""
    env = next(env for name, env, *_ in OPTIONS if name == flag)
    return flag if config.getoption(_dest(flag)) is not None or env not in os.environ else env


def _refuse(config, flag, value, problem):
    raise pytest.UsageError(f"{_source(config, flag)}={value!r} {problem}")


def _cuda_missing(device):
    """Why a torch run cannot have `device` on this machine (no torch, no CUDA, or no such GPU), or None."""
    if not device.startswith("cuda"):
        return None
    try:
        import torch
    except ImportError:
        return "needs torch, which is not installed"
    if not torch.cuda.is_available():
        return "cannot run here: torch.cuda.is_available() is False on this machine; use cpu, or run where a GPU is"
    index = int(device.partition(":")[2] or 0)
    if index >= torch.cuda.device_count():
        return f"cannot run here: this machine has {torch.cuda.device_count()} CUDA device(s), numbered from 0"
    return None


class _Selection:
    """The implementation and profile chosen for this run, loaded once; pytest.UsageError for an option it cannot take
    (CUDA on a machine without it included: a run that skipped every invariant would look like one that passed)."""

    def __init__(self, config):
        from invariants.examples_db import ExamplesDatabaseError, open_database
        from invariants.profiles import PROFILE_NAMES, profile_settings, sharing
        from invariants.protocol import BACKENDS, DTYPES, Implementation, ImplementationLoadError, load_target

        self.target = _option(config, "--impl")
        self.device = _option(config, "--impl-device")
        self.dtype = _option(config, "--impl-dtype")
        self.profile = _option(config, "--invariants-profile")
        backend = _option(config, "--impl-backend")
        if self.profile not in PROFILE_NAMES:
            _refuse(config, "--invariants-profile", self.profile, f"is not one of {', '.join(PROFILE_NAMES)}")
        if self.dtype not in DTYPES:
            _refuse(config, "--impl-dtype", self.dtype, f"is not one of {', '.join(DTYPES)}")
        if backend is not None and backend not in BACKENDS:
            _refuse(config, "--impl-backend", backend, f"is not one of {', '.join(BACKENDS)} (leave it out to use the target's BACKEND)")
        if not DEVICES.fullmatch(self.device):
            _refuse(config, "--impl-device", self.device, "is not one of cpu, cuda, cuda:N (cuda for a torch implementation)")
        try:
            namespace, self.backend = load_target(self.target, backend=backend)
            if self.backend == "numpy" and self.device != "cpu":
                _refuse(config, "--impl-device", self.device, f"cannot run {self.target}, a numpy implementation: numpy runs on the cpu "
                        "only; use cpu, or choose a torch implementation")
            if self.backend == "numpy" and self.dtype == "bfloat16":
                _refuse(config, "--impl-dtype", self.dtype, f"cannot run {self.target}, a numpy implementation: numpy has no bfloat16; "
                        "choose float64, float32 or float16, or a torch implementation")
            unreachable = _cuda_missing(self.device)
            if unreachable:
                _refuse(config, "--impl-device", self.device, unreachable)
            self.impl = Implementation(namespace, label=self.target, backend=self.backend, device=self.device, dtype=self.dtype)
        except ImplementationLoadError as exc:
            _refuse(config, "--impl", self.target, f"cannot be loaded: {exc}")
        address = _option(config, "--examples-db")
        try:
            self.database = open_database(address) if address else None  # the shared example database, if any
        except ExamplesDatabaseError as exc:
            _refuse(config, "--examples-db", address, f"cannot be opened: {exc}")
        self.settings = sharing(self.profile, self.database) if self.database is not None else profile_settings(self.profile)

    def misspelt(self):
        """[] or the one warning line for functions whose names nearly spell protocol functions (invariants.protocol.near_misses)."""
        note = self.impl.misspelt()
        return [f"WARNING: in {self.target}, {note} (the invariants that need it are skipped)"] if note else []

    def describe(self):
        declared = ", ".join(f"{k} = {v!r}" for k, v in self.impl.declarations.items())
        # the toolkit's decode says how its cache keeps keys ("grow", "whole", "ring"): invariants.adapters.toolkit.llama_decode
        decodes = "llama_decode" in self.impl.functions and self.impl.in_process
        slots = getattr(self.impl.raw("llama_decode"), "cache_slots", None) if decodes else None
        return repr(self.impl) + (f", declaring {declared}" if declared else "") + (f", its cache's slots {slots!r}" if slots else "")


_SELECTION_KEY = pytest.StashKey[_Selection]()


def selection(config):
    if _SELECTION_KEY not in config.stash:
        config.stash[_SELECTION_KEY] = _Selection(config)
    return config.stash[_SELECTION_KEY]


def pytest_report_header(config):
    if not asked(config):
        return None
    from invariants.protocol import PROTOCOL_VERSION

    chosen = selection(config)
    lines = [f"transformer-invariants: protocol v{PROTOCOL_VERSION}, implementation {chosen.describe()}, "
             f"invariants profile {chosen.profile}"]
    if chosen.database is not None:
        lines.append(f"transformer-invariants: shared example database {chosen.database!r}")
    return lines + chosen.misspelt() + shared_package_names()


def shared_package_names():
    """One line per other installed distribution that also provides the top-level package `invariants` (none: [])."""
    import importlib.metadata

    others = sorted(set(importlib.metadata.packages_distributions().get("invariants", ())) - {"transformer-invariants"})
    return [f"transformer-invariants: the distribution {name!r} also provides the package 'invariants'; the two share its "
            f"files, so uninstall one (pip uninstall {name})" for name in others]


def _plural(count, noun):
    return f"{count:,} {noun}{'s' * (count != 1)}"


def pytest_terminal_summary(terminalreporter):
    """One line: how the invariants came out and how many examples hypothesis ran through them (rejected draws included)."""
    runs = [dict(report.user_properties) for reports in terminalreporter.stats.values() for report in reports
            if getattr(report, "when", None) == "call" and "invariant_status" in dict(getattr(report, "user_properties", ()))]
    if not runs:
        return
    for line in selection(terminalreporter.config).misspelt() + shared_package_names():  # again at the end, where -q has no header
        terminalreporter.write_line(line)
    from invariants.runner import STATUSES  # here: the plugin loads in every pytest run, the runner only in ours
    by_status = {status: [r for r in runs if r["invariant_status"] == status] for status in STATUSES}
    parts = [f"{_plural(len(by_status['passed']), 'invariant')} passed"]
    parts += [f"{len(by_status[s])} {s if s != 'error' else 'could not be evaluated'}" for s in ("failed", "error") if by_status[s]]
    if by_status["skipped"]:
        declared = sum(1 for r in by_status["skipped"] if r.get("declared"))
        parts.append(f"{len(by_status['skipped'])} skipped" + (f" ({declared} by declared conventions)" if declared else ""))
    counts = [r["examples"] for r in runs if r["invariant_status"] != "skipped"]
    if counts:
        parts.append(f"{_plural(sum(counts), 'example')} run (fewest {min(counts):,}, most {max(counts):,} per invariant)")
    terminalreporter.write_line("transformer-invariants: " + ", ".join(parts))
    from invariants.diagnosis import likely_bugs

    for line in likely_bugs(_outcomes(runs)):
        terminalreporter.write_line("  " + line)


def _outcomes(runs):
    """(invariant, status, reason, figures) of each run; an error in the check's own code (no failure recorded) is no evidence of a bug."""
    return [(r["invariant"], "check_crashed" if r["invariant_status"] == "error" and "failure" not in r else r["invariant_status"],
             r.get("failure", ""), r.get("measured", {})) for r in runs]


JSON_FORMAT = "transformer-invariants/suite-run"  # the record's "format"; "version" counts its incompatible changes
JSON_VERSION = 1
_SUITE_MODULE = f"{PACKAGE.name}.test_invariants"  # the module whose tests are the suite's invariants
FAILURE_FIELDS = ("example", "problem", "notes", "measured")  # a failure's parts as data, in the record as the runner's Outcome has them


class _JsonRecord:
    """--invariants-json: collects every invariant's report (with its user properties) and writes one JSON file at the end.

    Registered only when asked, and only on the controller: pytest_runtest_logreport there sees the
    workers' reports too, user properties included, so the record is the same with or without xdist.
    """

    def __init__(self, config, path):
        self.config = config
        self.path = path
        self.reports = {}  # invariant -> {phase: (outcome, properties, longrepr text)}

    def pytest_runtest_logreport(self, report):
        name = dict(report.user_properties).get("invariant")  # set at collection (pytest_collection_modifyitems)
        if name is None:
            return
        text = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr or "")
        self.reports.setdefault(name, {})[report.when] = (report.outcome, dict(report.user_properties), text)

    def entry(self, name, phases, registry):
        """One invariant's record: its status and counts from the user properties, or from pytest's outcome when it never ran."""
        from invariants.runner import FAILING, headline

        inv = registry.get(name)
        entry = {"invariant": name, "component": inv.component if inv else name.split(".")[0],
                 "statement": inv.statement if inv else "", "hint": inv.hint if inv else ""}
        properties = {}
        for when in ("setup", "call", "teardown"):
            properties.update(phases.get(when, (None, {}, ""))[1])
        if "invariant_status" in properties:
            entry["status"] = properties["invariant_status"]
            entry["examples"] = properties.get("examples", 0)
        else:  # the implementation fixture skipped or failed it: no outcome was recorded
            outcome = next((phases[w][0] for w in ("setup", "call") if w in phases and phases[w][0] != "passed"), "passed")
            entry["status"] = {"passed": "passed", "skipped": "skipped"}.get(outcome, "error")
            entry["examples"] = 0
        for key in ("examples_to_failure", "declared", "failure", "report", "repro", *FAILURE_FIELDS):
            if key in properties:
                entry[key] = properties[key]
        skipped = next((text for w in ("setup", "call") if w in phases and phases[w][0] == "skipped" for text in [phases[w][2]]), "")
        failed = next((text for w in ("setup", "call") if w in phases and phases[w][0] == "failed" for text in [phases[w][2]]), "")
        reason = properties.get("failure") or skipped.removeprefix("Skipped: ") or headline(failed)
        entry["reason"] = reason or (f"held on {entry['examples']} examples" if entry["status"] == "passed" else "")
        if entry["status"] in FAILING and "report" not in entry and failed:
            entry["report"] = failed
        if entry.get("repro"):
            script = Path(entry["repro"])
            if script.is_file() and script.stat().st_size <= 64 * 1024:
                entry["repro_source"] = script.read_text(encoding="utf-8")
        return entry

    def record(self):
        from invariants.registry import all_invariants
        from invariants.runner import STATUSES

        chosen = selection(self.config)
        registry = {inv.name: inv for inv in all_invariants()}  # in the suite's order, component by component
        order = {name: i for i, name in enumerate(registry)}
        invariants = [self.entry(name, phases, registry) for name, phases in sorted(self.reports.items(), key=lambda t: order.get(t[0], len(order)))]
        return {
            "format": JSON_FORMAT, "version": JSON_VERSION,
            "implementation": repr(chosen.impl), "target": chosen.target, "backend": chosen.backend,
            "device": chosen.device, "dtype": chosen.dtype, "profile": chosen.profile,
            "declared": dict(chosen.impl.declarations),
            "summary": {status: sum(e["status"] == status for e in invariants) for status in STATUSES},
            "invariants": invariants,
        }

    def pytest_sessionfinish(self, session):
        import json
        import re

        record = self.record()
        slug = {"impl": re.sub(r"[^A-Za-z0-9_.-]+", "_", Path(record["target"].split(":")[0]).stem or record["target"]),
                "backend": record["backend"] or "unknown", "device": record["device"].replace(":", "_"), "dtype": record["dtype"]}
        path = Path(self.config.invocation_params.dir) / self.path.format(**slug)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(record, indent=1, ensure_ascii=False, default=str) + "\n", encoding="utf-8")
        self.written = path

    def pytest_terminal_summary(self, terminalreporter):
        written = getattr(self, "written", None)
        if written is not None:
            terminalreporter.write_line(f"transformer-invariants: the run's record is in {written} (python -m invariants.htmlreport suite {written})")


@pytest.fixture(scope="session")
def impl(request):
    """The implementation under test (an invariants.protocol.Implementation)."""
    return selection(request.config).impl


@pytest.fixture(scope="session")
def invariant_settings(request):
    """The hypothesis settings the invariants run under (--invariants-profile), never loaded as the global profile."""
    return selection(request.config).settings


@pytest.fixture(scope="session")
def repro_dir(request):
    """The folder for repro scripts (--repro-dir), or None."""
    return _option(request.config, "--repro-dir")


def outcome_properties(outcome):
    """[(name, value)]: an Outcome as user properties, its status and counts (the summary line and JUnit XML read them) and a failure's
    text and parts as data (FAILURE_FIELDS: --invariants-json carries them unchanged)."""
    from invariants.runner import FAILING

    properties = [("invariant", outcome.invariant), ("invariant_status", outcome.status), ("examples", outcome.examples)]
    if outcome.examples_to_failure is not None:
        properties.append(("examples_to_failure", outcome.examples_to_failure))
    if outcome.declared:
        properties.append(("declared", True))
    if outcome.status in FAILING and not outcome.check_crashed:
        properties.append(("failure", outcome.reason))
    if outcome.report:
        properties += [("report", outcome.report), ("example", [list(pair) for pair in outcome.example]), ("problem", outcome.problem),
                       ("notes", list(outcome.notes)), ("measured", outcome.measured)]
    return properties


@pytest.fixture
def record_outcome(request):
    """record_outcome(outcome): the Outcome as the test's user properties (outcome_properties)."""
    return lambda outcome: request.node.user_properties.extend(outcome_properties(outcome))
