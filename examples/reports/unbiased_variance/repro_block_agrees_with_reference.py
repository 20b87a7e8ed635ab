"""Counterexample to block.agrees_with_reference, replayed without hypothesis or the suite.

    python {this file} [path/to/your_module.py]     (default: TARGET below, the module the suite ran)

Exit status: 1 while the failure reproduces, 0 once the answers changed, 2 when the module is not found or cannot be loaded.

block.agrees_with_reference: transformer_block agrees with the float64 reference (to 1e-10 in float64, the dtype tolerance otherwise).
"""

import importlib
import importlib.util
import sys
from pathlib import Path

import numpy as np

nan, inf = float("nan"), float("inf")  # how repr writes non-finite floats, in the values below
INVARIANT = 'block.agrees_with_reference'
BACKEND, DTYPE = 'numpy', 'float64'
TARGET = ('unbiased_variance.py', '')  # (module: a path or a name, object in it or "")
SEARCH = None  # the folder a module name was imported from; None for a path (a relative one: beside this script, else here)
CALLS = [  # (function, arguments, what the suite got back)
    ('transformer_block', [np.array([[[0.0]]], dtype='float64'), {'ln1_g': np.array([1.0], dtype='float64'), 'ln1_b': np.array([0.0], dtype='float64'), 'W_q': np.array([[0.0]], dtype='float64'), 'W_k': np.array([[0.0]], dtype='float64'), 'W_v': np.array([[0.0]], dtype='float64'), 'W_o': np.array([[0.0]], dtype='float64'), 'ln2_g': np.array([1.0], dtype='float64'), 'ln2_b': np.array([0.0], dtype='float64'), 'W1': np.array([[0.0, 0.0, 0.0, 0.0]], dtype='float64'), 'b1': np.array([0.0, 0.0, 0.0, 0.0], dtype='float64'), 'W2': np.array([[0.0], [0.0], [0.0], [0.0]], dtype='float64'), 'b2': np.array([0.0], dtype='float64')}, 1, False], ('answer', np.array([[[nan]]], dtype='float64'))),
]
EXPECTED = ('block output (held to the tanh-form GELU, the closer one: either form passes, one form for the whole call)[0, 0, 0] should be finite',)  # what the suite expected, in its own words
VIOLATION = 'block output (held to the tanh-form GELU, the closer one: either form passes, one form for the whole call)[0, 0, 0]=nan, but should be finite [transformer_block(x, params, n_heads=1, causal=False)]\n  1 of 1 elements are not finite'
HINT = "the block differs from GPT-2's: pre-norm, attention then feed-forward in sequence (the FFN reads x + attn, not x: no parallel sublayers), the attention biases used when given (where ATTENTION_BIASES = True is declared), LayerNorm eps 1e-5 (or the declared LAYER_NORM_EPS), one GELU form throughout (the declared GELU_FORM); or LayerNorm's variance in float16 (inf past 256)"


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
        print(f"{Path(__file__).name} was written for {TARGET[0]}, which is not at {' or '.join(map(str, places))} any more: "
              f"give the module to run it on: python {Path(__file__).name} path/to/your_module.py", file=sys.stderr)
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
        return {k: to_backend(v) for k, v in value.items()}
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
        name = f"{label}[{i}]" if isinstance(value, tuple) else label
        print(f"  {name}: {part.dtype} {part.shape}", np.array2string(part, precision=6, threshold=48))


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
    print(f"call {number}: {name}(...)")
    try:
        got = to_numpy(getattr(module, name)(*to_backend(args)))
    except Exception as exc:  # noqa: BLE001 - the student's code: show what it raised
        print(f"  raised {type(exc).__name__}: {exc}")
        print(f"  the suite saw an error: {seen}" if kind == "error" else "  the suite saw an answer")
        return "same" if kind == "error" else "raises"
    show("now", got)
    if kind == "dropped":
        print(f"  the suite saw an answer this script does not keep: {seen}")
        return "unknown"
    if kind == "error":
        print(f"  the suite saw an error: {seen}")
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
        print(f"{Path(__file__).name}: cannot load {target[0]}: {type(exc).__name__}: {str(exc).partition(chr(10))[0]}", file=sys.stderr)
        return 2
    results = [replay(module, number, name, args, kind, seen) for number, (name, args, (kind, seen)) in enumerate(CALLS, 1)]
    print()
    for line in EXPECTED[:1]:
        print("the suite expected:", line)
    for line in EXPECTED[1:]:
        print(f"  {line} (in the run that failed)")
    print("violated:", VIOLATION)
    print("hint:", HINT)
    print()
    broken = [f"call {n} {r}" for n, r in enumerate(results, 1) if r in ("raises", "not finite")]
    changed = [str(n) for n, r in enumerate(results, 1) if r == "changed"]
    unknown = f" ({results.count('unknown')} answer(s) not kept here were not compared)" if "unknown" in results else ""
    if broken or not changed:
        print(f"REPRODUCES: {', '.join(broken) or 'every answer is the one the suite judged a violation of ' + INVARIANT}{unknown}")
        return 1
    print(f"NO LONGER REPRODUCES: the answers to call(s) {', '.join(changed)} changed{unknown}. This script compares answers with "
          f"the failing ones; it does not re-check the property. Confirm the fix: pytest --pyargs invariants --impl <your module> -k {INVARIANT}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
