"""A failing invariant as a script a student runs with plain python: the exact inputs, the calls, the property, what came back.

    path = write_repro(outcome, impl, "reports/")      # reports/repro_attention_causal_non_leakage.py
    $ python repro_attention_causal_non_leakage.py my_solution.py

The script needs numpy (and torch for a torch implementation), not hypothesis, pytest or this
suite. It loads the module it is given (by default the one the suite ran), repeats every call
the failing example made, with the same inputs (inline, exact: Python's float repr round-trips;
beside it in an .npz when they are large), and prints each answer beside the one the suite saw,
then the property, the violation and the hint.
"""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np

INLINE_ELEMENTS = 4096  # larger examples keep their arrays in an .npz beside the script


def _literal(value, arrays):
    """Python source for value; arrays go inline, or into `arrays` (name -> array) when it is not None."""
    if isinstance(value, np.ndarray):
        if arrays is not None:
            name = f"a{len(arrays)}"
            arrays[name] = value
            return f"ARRAYS[{name!r}]"
        return f"np.array({value.tolist()!r}, dtype={value.dtype.name!r})"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k!r}: {_literal(v, arrays)}" for k, v in value.items()) + "}"
    if isinstance(value, (list, tuple)):
        items = ", ".join(_literal(v, arrays) for v in value)
        return f"[{items}]" if isinstance(value, list) else f"({items}{',' if len(value) == 1 else ''})"
    return repr(value)


def _size(value):
    if isinstance(value, np.ndarray):
        return value.size
    if isinstance(value, dict):
        return sum(_size(v) for v in value.values())
    if isinstance(value, (list, tuple)):
        return sum(_size(v) for v in value)
    return 0


def _seen(answer):
    """What the suite got back, as source: the answer, or the error's message."""
    return ("error", str(answer).split("\n")[0]) if isinstance(answer, Exception) else ("answer", answer)


def repro_source(outcome, impl, *, target=None, npz_name=None):
    """(script source, arrays for an .npz or None) replaying `outcome`'s failing example on `impl`'s kind of implementation."""
    large = sum(_size(args) + _size(_seen(answer)[1]) for _, args, answer in outcome.calls) > INLINE_ELEMENTS
    arrays = {} if large else None
    calls = ",\n    ".join(f"({name!r}, {_literal(list(args), arrays)}, {_literal(_seen(answer), arrays)})" for name, args, answer in outcome.calls)
    load = f"ARRAYS = np.load(Path(__file__).with_name({npz_name!r}))\n" if large else ""
    source = TEMPLATE.format(
        invariant=outcome.invariant, statement=outcome.report.split("\n")[0], target=target or getattr(impl, "label", ""),
        backend=impl.backend, dtype=impl.dtype, load=load, calls=calls or "", violation=outcome.problem, hint=outcome.hint,
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
    path.write_text(source)
    return path


TEMPLATE = '''"""Counterexample to {invariant}, replayed without hypothesis or the suite.

    python {{this file}} [path/to/your_module.py]     (default: {target})

{statement}
"""

import importlib
import importlib.util
import sys
from pathlib import Path

import numpy as np

nan, inf = float("nan"), float("inf")  # how repr writes non-finite floats, in the values below
BACKEND, DTYPE = {backend!r}, {dtype!r}
{load}CALLS = [  # (function, arguments, what the suite got back)
    {calls},
]
VIOLATION = {violation!r}
HINT = {hint!r}


def load(target):
    """A module name or a .py file, either followed by :object (an adapter), as --impl takes them."""
    where, _, attribute = target.partition(":")
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
    module = load(argv[1] if len(argv) > 1 else {target!r})
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
        else:
            print(f"  the suite saw an error: {{seen}}")
    print()
    print("violated:", VIOLATION)
    print("hint:", HINT)


if __name__ == "__main__":
    main(sys.argv)
'''
