"""Counterexample to attention.weights_are_distributions, replayed without hypothesis or the suite.

    python {this file} [path/to/your_module.py]     (default: TARGET below, the module the suite ran)

attention.weights_are_distributions: Each query's attention weights are a probability distribution over the keys: every entry >= 0, each row summing to 1.
"""

import importlib
import importlib.util
import sys
from pathlib import Path

import numpy as np

nan, inf = float("nan"), float("inf")  # how repr writes non-finite floats, in the values below
BACKEND, DTYPE = 'numpy', 'float64'
TARGET = 'mask_after_softmax.py'
CALLS = [  # (function, arguments, what the suite got back)
    ('attention', [np.array([[[0.0], [0.0]]], dtype='float64'), np.array([[0.0]], dtype='float64'), np.array([[0.0]], dtype='float64'), np.array([[0.0]], dtype='float64'), np.array([[0.0]], dtype='float64'), 1, True], ('answer', (np.array([[[0.0], [0.0]]], dtype='float64'), np.array([[[[0.5, 0.0], [0.5, 0.5]]]], dtype='float64')))),
]
VIOLATION = 'row sums of the attention weights=values out of tolerance, but should be close to the expected values within atol=1e-07 + rtol=1e-07·|expected| (float64) [attention(x[1, 2, 1], W_q, W_k, W_v, W_o, n_heads=1, causal=True)]\n  mismatched 1 of 2 elements (50.0%); tolerance atol=1e-07 + rtol=1e-07·|expected| (float64)\n  worst at index (0, 0, 0): got 0.5, expected 1\n  max abs error 0.5, max rel error 0.5'
HINT = 'the softmax runs over the wrong axis (the query axis: columns sum to 1, not rows), the weights are zeroed after the softmax without renormalising, or the softmax does not subtract the row max (exp of a score above 709, 88 in float32, overflows: inf/inf is NaN)'


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


def main(argv):
    module = load(argv[1] if len(argv) > 1 else TARGET)
    for number, (name, args, (kind, seen)) in enumerate(CALLS, 1):
        print(f"call {number}: {name}(...)")
        try:
            got = to_numpy(getattr(module, name)(*to_backend(args)))
        except Exception as exc:  # noqa: BLE001 - the student's code: show what it raised
            print(f"  raised {type(exc).__name__}: {exc}")
            continue
        show("now", got)
        if kind == "answer":
            show("the suite saw", seen)
        elif kind == "dropped":
            print(f"  the suite saw an answer too large to keep here: {seen}")
        else:
            print(f"  the suite saw an error: {seen}")
    print()
    print("violated:", VIOLATION)
    print("hint:", HINT)


if __name__ == "__main__":
    main(sys.argv)
