"""Counterexample to attention.causal_non_leakage, replayed without hypothesis or the suite.

    python {this file} [path/to/your_module.py]     (default: TARGET below, the module the suite ran)

attention.causal_non_leakage: Replacing the tokens at positions >= j by other finite values leaves causal attention's outputs and weights at positions < j exactly equal.
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
    ('attention', [np.array([[[-0.78125], [-0.078125]]], dtype='float64'), np.array([[1.0]], dtype='float64'), np.array([[1.0]], dtype='float64'), np.array([[0.0]], dtype='float64'), np.array([[0.0]], dtype='float64'), 1, True], ('answer', (np.array([[[0.0], [0.0]]], dtype='float64'), np.array([[[[0.6339769774981698, 0.0], [0.5137294579602455, 0.4862705420397545]]]], dtype='float64')))),
    ('attention', [np.array([[[-0.78125], [0.0]]], dtype='float64'), np.array([[1.0]], dtype='float64'), np.array([[1.0]], dtype='float64'), np.array([[0.0]], dtype='float64'), np.array([[0.0]], dtype='float64'), 1, True], ('answer', (np.array([[[0.0], [0.0]]], dtype='float64'), np.array([[[[0.6480209940680554, 0.0], [0.5, 0.5]]]], dtype='float64')))),
]
VIOLATION = 'attention weights of the queries at positions < 1=different values, but should be exactly equal (bitwise, == per element) [attention(x[1, 2, 1], W_q, W_k, W_v, W_o, n_heads=1, causal=True) with x[:, 1:] replaced]\n  mismatched 1 of 2 elements (50.0%); exact equality required\n  worst at index (0, 0, 0, 0): got 0.648020994, expected 0.633976977\n  max abs error 0.014, max rel error 0.0222'
HINT = "the future leaks into the past: the mask is missing, applied after the softmax (the future stays in the denominator), off by one (triu with k=2: each token sees the next), built for another length (a longer mask sliced as if earlier tokens were cached), right only up to some length (a mask buffer built for a block size of 64, a kernel that masks only within its tiles of 16 to 128: see the length in the call), or a finite value instead of -inf (an additive mask of -1e4, GPT-2's masked_bias: it leaks once scores are that large)"


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
