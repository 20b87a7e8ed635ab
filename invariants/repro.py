"""A failing invariant as a script a student runs with plain python: the exact inputs, the calls, the property, what came back.

    path = write_repro(outcome, impl, "reports/")      # reports/repro_attention_causal_non_leakage.py
    $ python repro_attention_causal_non_leakage.py my_solution.py

The script needs numpy (and torch for a torch implementation), not hypothesis, pytest or this
suite. It loads the module it is given (by default the one the suite ran, where it was then),
repeats every call the failing example made, with the same inputs (inline, exact: Python's
float repr round-trips; beside it in an .npz when they are large), and prints each answer beside
the one the suite saw, what the suite expected, the violation and the hint. It exits 1 while the
failure reproduces (every answer is the one the suite judged failing, or a call now raises or
answers NaN or inf), 0 once the answers changed, 2 when it cannot find or load its module (one line). It compares
answers only: it does not re-check the property, and says so. An answer that would take the
arrays kept past MAX_ARRAY_BYTES, or that is not plain data, is described (dtype, shape, bytes) instead of kept, and not compared.

What the implementation controls (its answers, its error messages, the file name) reaches the
script only as data: Python literals written by repr() of plain values, or the .npz. The
docstring and comments carry the suite's own text only.
"""

from __future__ import annotations

import ast
import re
import sys
from pathlib import Path

import numpy as np

from invariants.asserts import render_worst
from invariants.runner import headline

INLINE_ELEMENTS = 4096  # larger examples keep their arrays in an .npz beside the script
MAX_ARRAY_BYTES = 4 << 20  # the arrays one repro keeps (inputs always; answers while they fit), inline or in its .npz
NUMERIC = "biufc"  # the array kinds an .npz holds without pickle
PLAIN = (str, bytes, bool, int, float, complex, type(None))  # exactly these types: their repr is a literal of the same value


def _literal(value, arrays):
    """Python source for value, a literal whatever the value's class says; arrays go inline, or into `arrays` when it is not None."""
    if isinstance(value, np.ndarray):
        if arrays is not None and value.dtype.kind in NUMERIC:
            name = f"a{len(arrays)}"
            arrays[name] = value
            return f"ARRAYS[{name!r}]"
        dtype = value.dtype.name if value.dtype.kind in NUMERIC else value.dtype.str  # np.dtype("str64") is not understood; "<U2" is
        return f"np.array({_literal(value.tolist(), None)}, dtype={dtype!r})"
    if isinstance(value, np.generic) and value.dtype.kind in NUMERIC:
        return f"np.{value.dtype.name}({_literal(value.item(), None)})"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{_literal(k, arrays)}: {_literal(v, arrays)}" for k, v in value.items()) + "}"
    if isinstance(value, (list, tuple)):
        items = ", ".join(_literal(v, arrays) for v in value)
        return f"[{items}]" if isinstance(value, list) else f"({items}{',' if len(value) == 1 else ''})"
    if type(value) in (str, bytes):
        return repr(value).replace("#", "\\x23")  # no CI log command (`##vso[`) in the source: '#' is never part of repr's escapes
    return repr(value) if type(value) in PLAIN else _literal(f"<a {type(value).__name__}>", None)


def _docstring(text):
    """text as the inside of a triple-quoted docstring that reads back as text: repr's escapes, every quote escaped."""
    return repr(text)[1:-1].replace('"', '\\"')


def _nbytes(value):
    if isinstance(value, np.ndarray):
        return value.nbytes
    if isinstance(value, dict):
        return sum(_nbytes(v) for v in value.values())
    if isinstance(value, (list, tuple)):
        return sum(_nbytes(v) for v in value)
    return 0


def _described(value):
    """What an answer was, without its values: 'float32 (512, 4096)', per part of a tuple."""
    if isinstance(value, (list, tuple)):
        return "(" + ", ".join(map(_described, value)) + ")"
    return f"{value.dtype} {value.shape}" if isinstance(value, np.ndarray) else type(value).__name__


def _size(value):
    if isinstance(value, np.ndarray):
        return value.size
    if isinstance(value, dict):
        return sum(_size(v) for v in value.values())
    if isinstance(value, (list, tuple)):
        return sum(_size(v) for v in value)
    return 0


def _seen(answer):
    """What the suite got back: ("answer", it), or ("error", the first line of its message)."""
    return ("error", headline(str(answer))[:1000]) if isinstance(answer, Exception) else ("answer", answer)


def _exact(value):
    """Whether _literal writes value as itself, not as a string naming its type."""
    if isinstance(value, np.ndarray):
        return value.dtype.kind in NUMERIC or all(map(_exact, value.ravel().tolist()))
    if isinstance(value, np.generic):
        return value.dtype.kind in NUMERIC
    if isinstance(value, dict):
        return all(map(_exact, value)) and all(map(_exact, value.values()))
    if isinstance(value, (list, tuple)):
        return all(map(_exact, value))
    return type(value) in PLAIN


def _kept(calls):
    """(name, args, seen) per call, an answer described ("dropped", text) where it is not plain data, or once the arrays kept
    would pass MAX_ARRAY_BYTES: the script shows it, and does not compare it."""
    used = sum(_nbytes(args) for _, args, _ in calls)
    kept = []
    for name, args, answer in calls:
        kind, seen = _seen(answer)
        if kind == "answer" and not _exact(seen):
            kind, seen = "dropped", f"{_described(seen)}: not plain data"
        elif kind == "answer" and used + _nbytes(seen) > MAX_ARRAY_BYTES:
            kind, seen = "dropped", f"{_described(seen)}, {_nbytes(seen):,} bytes: over the {MAX_ARRAY_BYTES >> 20} MiB this script keeps"
        used += _nbytes(seen)
        kept.append((name, list(args), (kind, seen)))
    return kept


def _located(label):
    """((module, object), search folder) of a target this process loaded: a file or folder made absolute, or a module name
    with the folder it was imported from (None where it was not), so the script finds it from anywhere."""
    where, _, attribute = label.partition(":")
    if len(where) == 1 and attribute.startswith("\\"):  # a Windows drive letter, not module:object
        where, attribute = label, ""
    if Path(where).exists():
        return (str(Path(where).resolve()), attribute), None
    module = sys.modules.get(where)
    file = getattr(module, "__file__", None)
    if file is None:
        return (where, attribute), None
    # the module's own name: reference.numpy is invariants.reference.numpy, in /r/invariants/reference/numpy.py: /r
    depth = module.__name__.count(".") + (Path(file).name == "__init__.py")
    return (where, attribute), str(Path(file).resolve().parents[depth])


def _expectation(measured):
    """What the suite expected, from the violation's fields (invariants.asserts): `<what> should be <expected>`, and the worst element."""
    if "what" not in measured:
        return ()
    return (f"{measured['what']} should be {measured.get('expected', '?')}", *filter(None, [render_worst(measured)]))


def repro_source(outcome, impl, *, target=None, npz_name=None):
    """(script source, arrays for an .npz or None) replaying `outcome`'s failing example on `impl`'s kind of implementation.

    The script's default module is `target` as given (the gate's submission name: looked up beside the script, then in
    the current folder), else the implementation's own, where this process loaded it.
    """
    calls = _kept(outcome.calls)
    large = sum(_size(args) + _size(seen) for _, args, seen in calls) > INLINE_ELEMENTS
    arrays = {} if large else None
    listed = ",\n    ".join(f"({name!r}, {_literal(args, arrays)}, {_literal(seen, arrays)})" for name, args, seen in calls)
    load = f"ARRAYS = np.load(Path(__file__).with_name({npz_name!r}))\n" if large else ""
    where, search = ((target, ""), None) if target else _located(getattr(impl, "label", ""))
    source = TEMPLATE.format(
        invariant=re.sub(r"[^\w.]", "_", outcome.invariant), statement=_docstring(f"{outcome.invariant}: {outcome.statement}"),
        name=_literal(outcome.invariant, None), target=_literal(where, None), search=_literal(search, None),
        backend=impl.backend, dtype=impl.dtype, load=load, calls=listed,
        expected=_literal(_expectation(outcome.measured), None), violation=_literal(outcome.problem, None), hint=_literal(outcome.hint, None),
    )
    return source, arrays


def portable(source):
    """A script this module wrote, naming no folder of this machine (for a report shared beyond it): TARGET by its name alone (found
    beside the script or in the current folder) and SEARCH None; '' for text that is not such a script."""
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return ""
    lines = source.splitlines(keepends=True)
    for node in tree.body:
        name = node.targets[0].id if isinstance(node, ast.Assign) and isinstance(node.targets[0], ast.Name) else None
        if name not in ("TARGET", "SEARCH") or node.value.lineno != node.value.end_lineno:
            continue
        if name == "TARGET":
            where, attribute = ast.literal_eval(node.value)
            value = repr((Path(where).name if Path(where).is_absolute() else where, attribute))
        else:
            value = "None"
        line = lines[node.lineno - 1]
        lines[node.lineno - 1] = line[:node.value.col_offset] + value + line[node.value.end_col_offset:]
    return "".join(lines)


def repro_stem(invariant):
    """The file name, without suffix, of an invariant's repro script: repro_attention_causal_non_leakage."""
    return "repro_" + re.sub(r"[^0-9A-Za-z]+", "_", invariant)


def write_repro(outcome, impl, folder, *, target=None):
    """Write repro_<invariant>.py (and its .npz when the inputs are large) into `folder`; the script's path, or None without calls."""
    if not outcome.calls:
        return None
    stem = repro_stem(outcome.invariant)
    return save_repro(folder, stem, *repro_source(outcome, impl, target=target, npz_name=f"{stem}.npz"))


def save_repro(folder, stem, source, arrays):
    """Write `source` as <stem>.py into `folder`, and `arrays` (when not None) as <stem>.npz beside it; the script's path."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    if arrays is not None:
        np.savez(folder / f"{stem}.npz", **arrays)
    path = folder / f"{stem}.py"
    path.write_text(source, encoding="utf-8")
    return path


TEMPLATE = '''"""Counterexample to {invariant}, replayed without hypothesis or the suite.

    python {{this file}} [path/to/your_module.py]     (default: TARGET below, the module the suite ran)

Exit status: 1 while the failure reproduces, 0 once the answers changed, 2 when the module is not found or cannot be loaded.

{statement}
"""

import importlib
import importlib.util
import sys
from pathlib import Path

import numpy as np

nan, inf = float("nan"), float("inf")  # how repr writes non-finite floats, in the values below
INVARIANT = {name}
BACKEND, DTYPE = {backend!r}, {dtype!r}
TARGET = {target}  # (module: a path or a name, object in it or "")
SEARCH = {search}  # the folder a module name was imported from; None for a path (a relative one: beside this script, else here)
{load}CALLS = [  # (function, arguments, what the suite got back)
    {calls},
]
EXPECTED = {expected}  # what the suite expected, in its own words
VIOLATION = {violation}
HINT = {hint}


def default_target():
    """TARGET where the suite ran it, as (module, object); None, having said why, when it is not there any more."""
    where, attribute = TARGET
    if SEARCH is None:
        places = [Path(where)] if Path(where).is_absolute() else [Path(__file__).resolve().parent / where, Path.cwd() / where]
        where = next((str(place) for place in places if place.exists()), None)
    else:
        places = [Path(SEARCH)]
        if places[0].is_dir():
            sys.path.insert(0, SEARCH)
        else:
            where = None
    if where is None:
        print(f"{{Path(__file__).name}} was written for {{TARGET[0]}}, which is not at {{' or '.join(map(str, places))}} any more: "
              f"give the module to run it on: python {{Path(__file__).name}} path/to/your_module.py", file=sys.stderr)
        return None
    return where, attribute


def given(target):
    """A target from the command line, as --impl takes it: a module name, a .py file or a package folder, either + :object."""
    return (target, "") if Path(target).exists() else tuple(target.partition(":")[::2])


def load(where, attribute):
    """The module at `where` (a .py file, a package folder or a module name), or its `attribute` (an adapter object)."""
    path = Path(where)
    if path.suffix == ".py":
        sys.path.insert(0, str(path.parent))
        spec = importlib.util.spec_from_file_location(path.stem, path)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    elif path.is_dir():
        sys.path.insert(0, str(path.resolve().parent))
        module = importlib.import_module(path.resolve().name)
    else:
        module = importlib.import_module(where)
    for part in filter(None, attribute.split(".")):
        module = getattr(module, part)
    module = module() if isinstance(module, type) else module
    return getattr(module, "ADAPTER", module)


def to_backend(value):
    if isinstance(value, dict):
        return {{k: to_backend(v) for k, v in value.items()}}
    if isinstance(value, list):
        return [to_backend(v) for v in value]
    if not isinstance(value, np.ndarray):
        return value
    if BACKEND == "numpy":
        return value
    import torch

    kind = torch.int64 if value.dtype.kind in "iu" else torch.bool if value.dtype == bool else getattr(torch, DTYPE)
    return torch.as_tensor(value).to(kind)


def to_numpy(value):
    if isinstance(value, (tuple, list)):
        return tuple(to_numpy(v) for v in value)
    if hasattr(value, "detach"):
        value = value.detach().cpu()
        return (value.float() if str(value.dtype) == "torch.bfloat16" else value).numpy()
    return np.asarray(value)


def show(label, value):
    for i, part in enumerate(value if isinstance(value, tuple) else (value,)):
        part = np.asarray(part)
        name = f"{{label}}[{{i}}]" if isinstance(value, tuple) else label
        print(f"  {{name}}: {{part.dtype}} {{part.shape}}", np.array2string(part, precision=6, threshold=48))


def same(now, seen):
    """now is the answer the suite saw: the same parts, shapes, dtypes and values (NaN where it had NaN)."""
    if isinstance(now, tuple) or isinstance(seen, tuple):
        return isinstance(now, tuple) and isinstance(seen, tuple) and len(now) == len(seen) and all(map(same, now, seen))
    now, seen = np.asarray(now), np.asarray(seen)
    floats = now.dtype.kind in "fc" and seen.dtype.kind in "fc"
    return now.dtype == seen.dtype and now.shape == seen.shape and bool(np.array_equal(now, seen, equal_nan=floats))


def finite(value):
    parts = value if isinstance(value, tuple) else (value,)
    return all(np.isfinite(part).all() for part in map(np.asarray, parts) if part.dtype.kind in "fc")


def replay(module, number, name, args, kind, seen):
    """Call `name` as the suite did and show both answers; how it compares: same, changed, raises, not finite or unknown."""
    print(f"call {{number}}: {{name}}(...)")
    try:
        got = to_numpy(getattr(module, name)(*to_backend(args)))
    except Exception as exc:  # noqa: BLE001 - the student's code: show what it raised
        print(f"  raised {{type(exc).__name__}}: {{exc}}")
        print(f"  the suite saw an error: {{seen}}" if kind == "error" else "  the suite saw an answer")
        return "same" if kind == "error" else "raises"
    show("now", got)
    if kind == "dropped":
        print(f"  the suite saw an answer this script does not keep: {{seen}}")
        return "unknown"
    if kind == "error":
        print(f"  the suite saw an error: {{seen}}")
        return "changed"
    show("the suite saw", seen)
    if not finite(got) and finite(seen):
        return "not finite"
    return "same" if same(got, seen) else "changed"


def main(argv):
    target = given(argv[1]) if len(argv) > 1 else default_target()
    if target is None:
        return 2
    try:
        module = load(*target)
    except Exception as exc:  # noqa: BLE001 - a module missing, or raising as it loads: nothing replayed, so nothing reproduces
        print(f"{{Path(__file__).name}}: cannot load {{target[0]}}: {{type(exc).__name__}}: {{str(exc).partition(chr(10))[0]}}", file=sys.stderr)
        return 2
    results = [replay(module, number, name, args, kind, seen) for number, (name, args, (kind, seen)) in enumerate(CALLS, 1)]
    print()
    for line in EXPECTED[:1]:
        print("the suite expected:", line)
    for line in EXPECTED[1:]:
        print(f"  {{line}} (in the run that failed)")
    print("violated:", VIOLATION)
    print("hint:", HINT)
    print()
    broken = [f"call {{n}} {{r}}" for n, r in enumerate(results, 1) if r in ("raises", "not finite")]
    changed = [str(n) for n, r in enumerate(results, 1) if r == "changed"]
    unknown = f" ({{results.count('unknown')}} answer(s) not kept here were not compared)" if "unknown" in results else ""
    if broken or not changed:
        print(f"REPRODUCES: {{', '.join(broken) or 'every answer is the one the suite judged a violation of ' + INVARIANT}}{{unknown}}")
        return 1
    print(f"NO LONGER REPRODUCES: the answers to call(s) {{', '.join(changed)}} changed{{unknown}}. This script compares answers with "
          f"the failing ones; it does not re-check the property. Confirm the fix: pytest --pyargs invariants --impl <your module> -k {{INVARIANT}}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
'''
