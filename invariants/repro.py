"""A failing invariant as a script a student runs with plain python: the exact inputs, the calls, the property, what came back.

    path = write_repro(outcome, impl, "reports/")      # reports/repro_attention_causal_non_leakage.py
    $ python repro_attention_causal_non_leakage.py my_solution.py

The script needs numpy (and torch for a torch implementation), not hypothesis, pytest or this
suite. It loads the module it is given (by default the one the suite ran), repeats every call
the failing example made, with the same inputs (inline, exact: Python's float repr round-trips;
beside it in an .npz when they are large), and prints each answer beside the one the suite saw,
then the property, the violation and the hint. An answer that would take the arrays kept past
MAX_ARRAY_BYTES is described (dtype, shape, bytes) instead of kept.

What the implementation controls (its answers, its error messages, the file name) reaches the
script only as data: Python literals written by repr() of plain values, or the .npz. The
docstring and comments carry the suite's own text only.
"""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np

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
    return ("error", str(answer).split("\n")[0][:1000]) if isinstance(answer, Exception) else ("answer", answer)


def _kept(calls):
    """(name, args, seen) per call, an answer described ("dropped", text) once the arrays kept would pass MAX_ARRAY_BYTES."""
    used = sum(_nbytes(args) for _, args, _ in calls)
    kept = []
    for name, args, answer in calls:
        kind, seen = _seen(answer)
        if kind == "answer" and used + _nbytes(seen) > MAX_ARRAY_BYTES:
            kind, seen = "dropped", f"{_described(seen)}, {_nbytes(seen):,} bytes: over the {MAX_ARRAY_BYTES >> 20} MiB this script keeps"
        used += _nbytes(seen)
        kept.append((name, list(args), (kind, seen)))
    return kept


def repro_source(outcome, impl, *, target=None, npz_name=None):
    """(script source, arrays for an .npz or None) replaying `outcome`'s failing example on `impl`'s kind of implementation."""
    calls = _kept(outcome.calls)
    large = sum(_size(args) + _size(seen) for _, args, seen in calls) > INLINE_ELEMENTS
    arrays = {} if large else None
    listed = ",\n    ".join(f"({name!r}, {_literal(args, arrays)}, {_literal(seen, arrays)})" for name, args, seen in calls)
    load = f"ARRAYS = np.load(Path(__file__).with_name({npz_name!r}))\n" if large else ""
    source = TEMPLATE.format(
        invariant=re.sub(r"[^\w.]", "_", outcome.invariant), statement=_docstring(outcome.report.split("\n")[0]),
        target=_literal(target or getattr(impl, "label", ""), None), backend=impl.backend, dtype=impl.dtype, load=load, calls=listed,
        violation=_literal(outcome.problem, None), hint=_literal(outcome.hint, None),
    )
    return source, arrays


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

{statement}
"""

import importlib
import importlib.util
import sys
from pathlib import Path

import numpy as np

nan, inf = float("nan"), float("inf")  # how repr writes non-finite floats, in the values below
BACKEND, DTYPE = {backend!r}, {dtype!r}
TARGET = {target}
{load}CALLS = [  # (function, arguments, what the suite got back)
    {calls},
]
VIOLATION = {violation}
HINT = {hint}


def load(target):
    """A module name or a .py file, either followed by :object (an adapter), as --impl takes them."""
    where, _, attribute = (target, "", "") if Path(target).is_file() else target.partition(":")
    path = Path(where)
    if path.suffix == ".py":
        sys.path.insert(0, str(path.parent))
        spec = importlib.util.spec_from_file_location(path.stem, path)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
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


def main(argv):
    module = load(argv[1] if len(argv) > 1 else TARGET)
    for number, (name, args, (kind, seen)) in enumerate(CALLS, 1):
        print(f"call {{number}}: {{name}}(...)")
        try:
            got = to_numpy(getattr(module, name)(*to_backend(args)))
        except Exception as exc:  # noqa: BLE001 - the student's code: show what it raised
            print(f"  raised {{type(exc).__name__}}: {{exc}}")
            continue
        show("now", got)
        if kind == "answer":
            show("the suite saw", seen)
        elif kind == "dropped":
            print(f"  the suite saw an answer too large to keep here: {{seen}}")
        else:
            print(f"  the suite saw an error: {{seen}}")
    print()
    print("violated:", VIOLATION)
    print("hint:", HINT)


if __name__ == "__main__":
    main(sys.argv)
'''
