"""Assignment files: which invariants are required, their points and visibility, limits, forbidden APIs.

A TOML file (or the [tool.invariants-gate] table of a pyproject.toml); docs/gate.md has the
format and invariants/gate/assignments/p01.toml an example. Every name is checked against the registry, so a
typo is an error that names the key, the value and the fix, never an invariant silently lost.
"""

from __future__ import annotations

import difflib
import fnmatch
import hashlib
from dataclasses import dataclass, fields
from pathlib import Path

import tomllib

from invariants.conventions import CONVENTIONS
from invariants.gate.confine import TOOLS
from invariants.gate.sandbox import Limits
from invariants.gate.secret import POLICIES
from invariants.profiles import PROFILE_NAMES
from invariants.protocol import BACKENDS, DTYPES
from invariants.registry import COMPONENTS, all_invariants

VISIBILITIES = ("visible", "hidden", "after_due_date", "after_published")  # Gradescope's words
PROTECTIONS = ("filesystem", "tmp", "pid", "network", "cpu", "memory", "file_size", "core_dumps", "user", "capabilities", "processes",
               "new_privileges")
SECTIONS = {
    "assignment": {"name", "backend", "dtype", "rounding", "device", "entry"},
    "examples": {"profile", "max_examples"},
    "limits": {f.name for f in fields(Limits)},
    "forbidden": {"apis", "on_use"},
    "seed": {"secret_env", "secret_file", "secret"},
    "sandbox": {"drop_user", "network_namespace", "tool", "require"},
    "similarity": {"reference", "flag_above", "fail_above"},
    "invariants": None,  # a list of tables, checked entry by entry
    "declarations": None,  # convention = [values a submission may declare], checked key by key
}
ENTRY_KEYS = {"select", "points", "visibility", "exclude"}
SHIPPED_ASSIGNMENTS = Path(__file__).resolve().parent / "assignments"  # `-a p01` reads p01.toml here, in a clone or a wheel


class ConfigError(Exception):
    """The assignment file is wrong; the message names the key, the value and the fix."""


@dataclass(frozen=True)
class Selected:
    """One required invariant and what it is worth."""

    invariant: object  # invariants.registry.Invariant
    points: float
    visibility: str

    @property
    def name(self):
        return self.invariant.name


@dataclass(frozen=True)
class Assignment:
    name: str
    path: str
    sha256: str
    backend: str  # "numpy", "torch" or "any" (the submission's BACKEND)
    dtype: str
    device: str
    entry: str | None
    profile: str
    max_examples: int | None
    limits: Limits
    forbidden: tuple
    on_forbidden: str  # "report" or "fail"
    secret_env: str | None
    secret_file: str | None
    drop_user: bool
    network_namespace: bool
    secret_policy: str = "make"  # without a given secret: "make" (keep one made on first use), "required" (refuse), "random" (a preview)
    tool: str = "auto"  # how the worker is confined: auto | bubblewrap | unshare | landlock | none (invariants.gate.confine)
    require: tuple = ()  # protections without which the gate refuses to grade (names of the report's protections table)
    similarity_reference: bool = True  # compare the submission's code with the reference's
    flag_above: float = 0.5  # similarity shown as evidence from here
    fail_above: float | None = None  # similarity to the reference that fails the submission (None: never)
    selected: tuple = ()  # of Selected, in the file's order
    excluded: tuple = ()  # of (invariant name, why the gate leaves it out)
    declarations: dict | None = None  # {convention: values a submission may declare}; None: any value the suite allows
    rounding: str | None = None  # the coarsest rounding a correct answer may carry: "float32" in a float64 assignment; None: the dtype's

    def graded_under(self, declared):
        """The declarations a submission is graded under: its own (`declared`), and COMPUTE_DTYPE = "float32" where the assignment
        takes float32 rounding in a float64 run (rounding = "float32"), so correct code that computes in float32 loses nothing."""
        if self.rounding == "float32" and self.dtype == "float64":
            return {"COMPUTE_DTYPE": "float32", **declared}
        return declared

    def refused_declaration(self, declared):
        """Why the assignment refuses one of `declared` ({convention: value}, within the suite's bounds), or None.

        A convention's default changes nothing, so declaring it is always allowed.
        """
        if self.declarations is None:
            return None
        for name, value in declared.items():
            allowed = self.declarations.get(name, ())
            if any(_same(value, a) for a in (*allowed, CONVENTIONS[name].default)):
                continue
            allows = " or ".join(f"{name} = {a!r}" for a in allowed) if allowed else f"no {name} declaration"
            return (f"the submission declares {name} = {value!r}, which this assignment does not allow (it allows {allows}): "
                    "remove the declaration" + (" or declare an allowed value" if allowed else ""))
        return None

    def visible_only(self):
        """The same assignment restricted to its visible invariants: what a student previews locally.

        A preview runs the student's own code on the student's machine, so it does not insist on
        the sandbox protections the assignment requires of the course's CI, nor on the course's
        secret: without one given, each preview draws a fresh random seed (invariants.gate.secret).
        """
        from dataclasses import replace

        return replace(self, selected=tuple(s for s in self.selected if s.visibility == "visible"), require=(), secret_policy="random")


def _same(value, allowed):
    return value == allowed and type(value) is type(allowed)  # True is not 1, 4 is not 4.0


def _fail(where, key, value, fix):
    raise ConfigError(f"{where}: {key} = {value!r} {fix}")


def _table(data, section, where):
    value = data.get(section, {})
    if not isinstance(value, dict):
        _fail(where, section, value, "must be a table ([" + section + "])")
    unknown = sorted(set(value) - SECTIONS[section])
    if unknown:
        known = ", ".join(sorted(SECTIONS[section]))
        _fail(where, f"[{section}] {unknown[0]}", value[unknown[0]], f"is not a setting of [{section}]; known: {known}")
    return value


def _choice(table, key, choices, default, where):
    value = table.get(key, default)
    if value not in choices:
        _fail(where, key, value, f"must be one of {', '.join(map(str, choices))}")
    return value


def _limits(table, where):
    values = {}
    for f in fields(Limits):
        if f.name in table:
            value = table[f.name]
            if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
                _fail(where, f"[limits] {f.name}", value, "must be a positive number")
            values[f.name] = type(f.default)(value)
            if values[f.name] <= 0:  # 0.5 of a count is 0, and a tmpfs of size 0 has no limit at all
                _fail(where, f"[limits] {f.name}", value, "must be at least 1")
    return Limits(**values)


def _declarations(data, where):
    """{convention: tuple of allowed values} from [declarations], or None where the file has no such table."""
    if "declarations" not in data:
        return None
    table = data["declarations"]
    if not isinstance(table, dict):
        _fail(where, "declarations", table, "must be a table ([declarations]) of convention = [values a submission may declare]")
    allowed = {}
    for name, values in table.items():
        key = f"[declarations] {name}"
        if name not in CONVENTIONS:
            close = difflib.get_close_matches(name, list(CONVENTIONS), n=1)
            _fail(where, key, values, "is not a declarable convention; " +
                  (f"did you mean {close[0]}?" if close else f"known: {', '.join(CONVENTIONS)}"))
        if not isinstance(values, list) or not values:
            _fail(where, key, values, "must be a non-empty list of the values a submission may declare (leave the key out to allow none)")
        for value in values:
            problem = CONVENTIONS[name].problem(value)
            if problem:
                _fail(where, key, values, f"holds a value no submission may declare: {problem}")
        allowed[name] = tuple(values)
    return allowed


def _resolve(entries, registry, backend, where):
    """(tuple of Selected, tuple of (name, reason)) from the [[invariants]] entries."""
    if not isinstance(entries, list) or not entries:
        raise ConfigError(f"{where}: no [[invariants]] entries: list what the assignment requires, e.g. select = \"attention.*\"")
    chosen, excluded, seen = [], {}, set()
    for i, entry in enumerate(entries, 1):
        at = f"{where} [[invariants]] #{i}"
        if not isinstance(entry, dict):
            raise ConfigError(f"{at}: must be a table with select = ...")
        unknown = sorted(set(entry) - ENTRY_KEYS)
        if unknown:
            _fail(at, unknown[0], entry[unknown[0]], f"is not a key of [[invariants]]; known: {', '.join(sorted(ENTRY_KEYS))}")
        selectors = entry.get("select")
        selectors = [selectors] if isinstance(selectors, str) else selectors
        if not selectors or not all(isinstance(s, str) for s in selectors):
            _fail(at, "select", entry.get("select"), "must be an invariant name or a glob such as \"attention.*\", or a list of them")
        excludes = entry.get("exclude", [])
        if not isinstance(excludes, list) or not all(isinstance(s, str) for s in excludes):
            _fail(at, "exclude", excludes, "must be a list of invariant names or globs")
        points = entry.get("points", 1)
        if isinstance(points, bool) or not isinstance(points, (int, float)) or points < 0:
            _fail(at, "points", points, "must be a number >= 0")
        visibility = _choice(entry, "visibility", VISIBILITIES, "visible", at)
        for selector in selectors:
            glob = any(ch in selector for ch in "*?[")
            names = [n for n in registry if fnmatch.fnmatchcase(n, selector)] if glob else [selector] if selector in registry else []
            if not names:
                close = difflib.get_close_matches(selector, list(registry) + [f"{c}.*" for c in COMPONENTS], n=3)
                hint = f"did you mean {', '.join(close)}?" if close else "run `invariants-gate --list` for the registered names"
                _fail(at, "select", selector, f"matches no registered invariant; {hint}")
            for name in names:
                inv = registry[name]
                if name in seen or any(fnmatch.fnmatchcase(name, x) for x in excludes):
                    continue
                reason = None
                if inv.in_process:
                    reason = "needs the implementation's own callables (autograd), which never leave the worker"
                elif backend != "any" and backend not in inv.backends:
                    reason = f"applies only to the {' or '.join(inv.backends)} backend; the assignment is {backend}"
                if reason and not glob:
                    _fail(at, "select", selector, f"cannot be graded by the gate: it {reason}")
                if reason:
                    excluded[name] = reason
                    continue
                seen.add(name)
                chosen.append(Selected(inv, float(points), visibility))
    return tuple(chosen), tuple((n, r) for n, r in excluded.items() if n not in seen)


def shipped_assignments():
    """The names of the assignments shipped with the gate (p01, lesson, llama), sorted."""
    return sorted(p.stem for p in SHIPPED_ASSIGNMENTS.glob("*.toml"))


def assignment_path(name_or_path):
    """The file an `-a` argument names: a bare name without a folder or suffix (p01) is a shipped assignment, anything else a path."""
    text = str(name_or_path)
    if "/" in text or "\\" in text or Path(text).suffix:
        return Path(text)
    if text not in shipped_assignments():
        raise ConfigError(f"no shipped assignment {text!r} (shipped: {', '.join(shipped_assignments())}); "
                          f"pass a path such as {text}.toml for a file of your own")
    return SHIPPED_ASSIGNMENTS / f"{text}.toml"


def load_assignment(path):
    """Read and validate an assignment file (TOML, or pyproject.toml's [tool.invariants-gate]), or a shipped one by name (p01)."""
    path = assignment_path(path)
    try:
        raw = path.read_bytes()
        data = tomllib.loads(raw.decode("utf-8"))
    except FileNotFoundError:
        raise ConfigError(f"no assignment file {str(path)!r}") from None
    except (UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
        raise ConfigError(f"{path}: not valid TOML ({exc})") from None
    where = str(path)
    if path.name == "pyproject.toml":
        data = data.get("tool", {}).get("invariants-gate")
        if not isinstance(data, dict):
            raise ConfigError(f"{path}: no [tool.invariants-gate] table")
        where = f"{path} [tool.invariants-gate]"
    unknown = sorted(set(data) - set(SECTIONS))
    if unknown:
        _fail(where, unknown[0], data[unknown[0]], f"is not a section of an assignment; known: {', '.join(sorted(SECTIONS))}")
    a = _table(data, "assignment", where)
    examples = _table(data, "examples", where)
    forbidden = _table(data, "forbidden", where)
    seed = _table(data, "seed", where)
    sandbox = _table(data, "sandbox", where)
    backend = _choice(a, "backend", (*BACKENDS, "any"), "any", where)
    dtype = _choice(a, "dtype", DTYPES, "float64", where)
    rounding = _choice(a, "rounding", (dtype, "float32") if dtype == "float64" else (dtype,), dtype, where)  # as COMPUTE_DTYPE allows
    device = a.get("device", "cpu")
    if not isinstance(device, str) or not (device == "cpu" or device.startswith("cuda")):
        _fail(where, "device", device, "must be cpu, cuda or cuda:N")
    profile = _choice(examples, "profile", PROFILE_NAMES, "ci", where)
    max_examples = examples.get("max_examples")
    if max_examples is not None and (isinstance(max_examples, bool) or not isinstance(max_examples, int) or max_examples < 1):
        _fail(where, "max_examples", max_examples, "must be a positive integer")
    apis = forbidden.get("apis", [])
    if not isinstance(apis, list) or not all(isinstance(x, str) and x.count(".") >= 1 and " " not in x for x in apis):
        _fail(where, "[forbidden] apis", apis, "must be a list of dotted names such as \"torch.nn.MultiheadAttention\" (a * glob in the last part)")
    for key in ("secret_env", "secret_file"):
        if key in seed and not isinstance(seed[key], str):
            _fail(where, f"[seed] {key}", seed[key], "must be a string")
    secret_policy = _choice(seed, "secret", POLICIES, "make", where)
    for key in ("drop_user", "network_namespace"):
        if not isinstance(sandbox.get(key, True), bool):
            _fail(where, f"[sandbox] {key}", sandbox[key], "must be true or false")
    tool = _choice(sandbox, "tool", ("auto", *TOOLS), "auto", where)
    require = sandbox.get("require", [])
    if not isinstance(require, list) or not all(isinstance(r, str) for r in require):
        _fail(where, "[sandbox] require", require, f"must be a list of protections, e.g. [\"filesystem\", \"pid\"]; known: {', '.join(PROTECTIONS)}")
    for name in require:
        if name not in PROTECTIONS:
            close = difflib.get_close_matches(name, PROTECTIONS, n=1)
            _fail(where, "[sandbox] require", name, f"is not a protection; known: {', '.join(PROTECTIONS)}" +
                  (f" (did you mean {close[0]}?)" if close else ""))
    similarity = _table(data, "similarity", where)
    if not isinstance(similarity.get("reference", True), bool):
        _fail(where, "[similarity] reference", similarity["reference"], "must be true or false")
    thresholds = {}
    for key, default in (("flag_above", 0.5), ("fail_above", None)):
        value = similarity.get(key, default)
        if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value <= 1):
            _fail(where, f"[similarity] {key}", value, "must be a share between 0 and 1, e.g. 0.6 for 60%")
        thresholds[key] = None if value is None else float(value)
    entry = a.get("entry") or None
    if entry is not None and not isinstance(entry, str):
        _fail(where, "entry", entry, "must be a path such as \"submission.py\" inside the submission")
    name = a.get("name", path.stem)
    registry = {inv.name: inv for inv in all_invariants()}
    selected, excluded = _resolve(data.get("invariants"), registry, backend, where)
    return Assignment(
        name=str(name), path=str(path), sha256=hashlib.sha256(raw).hexdigest(), backend=backend, dtype=dtype, device=device,
        entry=entry, profile=profile, max_examples=max_examples, limits=_limits(_table(data, "limits", where), where),
        forbidden=tuple(apis), on_forbidden=_choice(forbidden, "on_use", ("report", "fail"), "report", where),
        secret_env=seed.get("secret_env") or None, secret_file=seed.get("secret_file") or None, secret_policy=secret_policy,
        drop_user=sandbox.get("drop_user", True), network_namespace=sandbox.get("network_namespace", True),
        tool=tool, require=tuple(require), similarity_reference=similarity.get("reference", True),
        flag_above=thresholds["flag_above"], fail_above=thresholds["fail_above"],
        selected=selected, excluded=excluded, declarations=_declarations(data, where), rounding=rounding,
    )
