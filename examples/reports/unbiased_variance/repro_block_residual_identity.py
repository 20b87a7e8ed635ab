"""Counterexample to block.residual_identity, replayed without hypothesis or the suite.

    python {this file} [path/to/your_module.py]     (default: TARGET below, the module the suite ran)

block.residual_identity: With W_o, W2, b2 (and b_o) zeroed, a block returns its input exactly, and so does a stack of up to 4 such blocks.
"""

import importlib
import importlib.util
import sys
from pathlib import Path

import numpy as np

nan, inf = float("nan"), float("inf")  # how repr writes non-finite floats, in the values below
BACKEND, DTYPE = 'numpy', 'float64'
TARGET = 'unbiased_variance.py'
CALLS = [  # (function, arguments, what the suite got back)
    ('transformer_block', [np.array([[[0.0]]], dtype='float64'), {'ln1_g': np.array([1.0], dtype='float64'), 'ln1_b': np.array([0.0], dtype='float64'), 'W_q': np.array([[0.0]], dtype='float64'), 'W_k': np.array([[0.0]], dtype='float64'), 'W_v': np.array([[0.0]], dtype='float64'), 'W_o': np.array([[0.0]], dtype='float64'), 'ln2_g': np.array([1.0], dtype='float64'), 'ln2_b': np.array([0.0], dtype='float64'), 'W1': np.array([[0.0, 0.0, 0.0, 0.0]], dtype='float64'), 'b1': np.array([0.0, 0.0, 0.0, 0.0], dtype='float64'), 'W2': np.array([[0.0], [0.0], [0.0], [0.0]], dtype='float64'), 'b2': np.array([0.0], dtype='float64')}, 1, False], ('answer', np.array([[[nan]]], dtype='float64'))),
]
VIOLATION = 'output of block 1 of 1[0, 0, 0]=nan, but should be finite [transformer_block(x, silenced params, n_heads=1, causal=False), block 1 of 1]\n  1 of 1 elements are not finite'
HINT = 'the residual is replaced instead of added (x = attn(LN(x)) for x = x + attn(LN(x))), a sublayer has no skip, or a norm is applied after the add (post-norm LN(x + f(x))): a pre-norm block with silent sublayers is the identity'


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
