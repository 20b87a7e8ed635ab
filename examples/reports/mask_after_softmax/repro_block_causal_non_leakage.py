"""Counterexample to block.causal_non_leakage, replayed without hypothesis or the suite.

    python {this file} [path/to/your_module.py]     (default: TARGET below, the module the suite ran)

block.causal_non_leakage: In decoder mode (causal=True), changing x at positions >= j leaves the block's outputs at positions < j exactly equal.
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
    ('transformer_block', [np.array([[[-1.359375, -0.859375, 0.578125], [0.734375, -0.59375, 0.421875]]], dtype='float64'), {'ln1_g': np.array([1.0, 1.0, 1.0], dtype='float64'), 'ln1_b': np.array([0.0, 0.0, 0.0], dtype='float64'), 'W_q': np.array([[-0.5234375, 0.1953125, 0.1640625], [-0.234375, 0.5234375, -0.7734375], [-0.7734375, 0.5078125, 0.2578125]], dtype='float64'), 'W_k': np.array([[0.015625, 0.890625, -0.484375], [0.1953125, -0.125, -0.078125], [-0.3046875, 0.0, -0.421875]], dtype='float64'), 'W_v': np.array([[0.6171875, -0.2109375, 0.109375], [-0.4765625, 0.2265625, -0.1171875], [0.359375, 0.0234375, -0.8125]], dtype='float64'), 'W_o': np.array([[-0.2890625, 0.7578125, 0.6875], [0.359375, 0.09375, -0.9765625], [0.3046875, -0.5625, 1.1640625]], dtype='float64'), 'ln2_g': np.array([1.0, 1.0, 1.0], dtype='float64'), 'ln2_b': np.array([0.0, 0.0, 0.0], dtype='float64'), 'W1': np.array([[0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0], [0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0], [0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0]], dtype='float64'), 'b1': np.array([0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0], dtype='float64'), 'W2': np.array([[0.0, 0.0, 0.0], [0.0, 0.0, 0.0], [0.0, 0.0, 0.0], [0.0, 0.0, 0.0], [0.0, 0.0, 0.0], [0.0, 0.0, 0.0], [0.0, 0.0, 0.0], [0.0, 0.0, 0.0], [0.0, 0.0, 0.0], [0.0, 0.0, 0.0], [0.0, 0.0, 0.0], [0.0, 0.0, 0.0]], dtype='float64'), 'b2': np.array([0.0, 0.0, 0.0], dtype='float64')}, 3, True], ('answer', np.array([[[-1.5479992091210173, -0.4614732723590196, -0.2160113955247297], [0.2602275879057326, 0.38093127276558847, 0.06936854691560179]]], dtype='float64'))),
    ('transformer_block', [np.array([[[-1.359375, -0.859375, 0.578125], [0.0, 0.0, 0.0]]], dtype='float64'), {'ln1_g': np.array([1.0, 1.0, 1.0], dtype='float64'), 'ln1_b': np.array([0.0, 0.0, 0.0], dtype='float64'), 'W_q': np.array([[-0.5234375, 0.1953125, 0.1640625], [-0.234375, 0.5234375, -0.7734375], [-0.7734375, 0.5078125, 0.2578125]], dtype='float64'), 'W_k': np.array([[0.015625, 0.890625, -0.484375], [0.1953125, -0.125, -0.078125], [-0.3046875, 0.0, -0.421875]], dtype='float64'), 'W_v': np.array([[0.6171875, -0.2109375, 0.109375], [-0.4765625, 0.2265625, -0.1171875], [0.359375, 0.0234375, -0.8125]], dtype='float64'), 'W_o': np.array([[-0.2890625, 0.7578125, 0.6875], [0.359375, 0.09375, -0.9765625], [0.3046875, -0.5625, 1.1640625]], dtype='float64'), 'ln2_g': np.array([1.0, 1.0, 1.0], dtype='float64'), 'ln2_b': np.array([0.0, 0.0, 0.0], dtype='float64'), 'W1': np.array([[0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0], [0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0], [0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0]], dtype='float64'), 'b1': np.array([0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0], dtype='float64'), 'W2': np.array([[0.0, 0.0, 0.0], [0.0, 0.0, 0.0], [0.0, 0.0, 0.0], [0.0, 0.0, 0.0], [0.0, 0.0, 0.0], [0.0, 0.0, 0.0], [0.0, 0.0, 0.0], [0.0, 0.0, 0.0], [0.0, 0.0, 0.0], [0.0, 0.0, 0.0], [0.0, 0.0, 0.0], [0.0, 0.0, 0.0]], dtype='float64'), 'b2': np.array([0.0, 0.0, 0.0], dtype='float64')}, 3, True], ('answer', np.array([[[-1.5214883598053317, -0.5010502030287399, -0.13708934737306722], [-0.16057976277779767, 0.3620435795298277, -0.7386325368170183]]], dtype='float64'))),
]
VIOLATION = 'block output at positions < 1=different values, but should be exactly equal (bitwise, == per element) [transformer_block(x[1, 2, 3], params, n_heads=3, causal=True) with x[:, 1:] changed]\n  mismatched 3 of 3 elements (100.0%); exact equality required\n  worst at index (0, 0, 2): got -0.137089347, expected -0.216011396\n  max abs error 0.0789, max rel error 0.365'
HINT = 'the block does not pass causal=True to its attention, builds the mask for the wrong positions or only up to some length (a mask buffer for a fixed block size, a kernel masking only within its tiles: see the length in the call), or something mixes tokens outside attention (a norm over the sequence axis)'


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
