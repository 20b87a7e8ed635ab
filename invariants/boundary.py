"""The one crossing between the suite's numpy values and an implementation's arrays, in process or in the gate's worker.

    args = rounded(args, "float32")                    # in the suite: the values the implementation will see
    out = answer(fn, spec_params, args, backend="torch", device="cpu", dtype="float32")   # where fn runs

Both transports (invariants.protocol.InProcess and the gate's worker) call `answer`, so an
in-process run and a gate run convert, call and word errors the same way by construction.
numpy-only at import (torch is imported when a torch backend is asked for) and free of the
rest of the package, so that the gate's worker can load this file on its own.
"""

from __future__ import annotations

import inspect
import os
import sys
import traceback

import numpy as np


class OutputError(Exception):
    """A protocol function returned something that is not an array (or a tuple or dict of arrays)."""


class CallError(Exception):
    """A protocol function raised (kind "raised") or cannot take the protocol's arguments (kind "signature")."""

    def __init__(self, kind, message, original):
        super().__init__(message)
        self.kind, self.message, self.original = kind, message, original


# -- into the implementation ------------------------------------------------------------------


def _bfloat16(values):
    """float64 or float32 values rounded to bfloat16 (round to nearest, ties to even), held exactly in float32."""
    single = np.asarray(values, dtype=np.float32)
    bits = single.view(np.uint32).astype(np.uint64)
    kept = ((bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000).astype(np.uint32).view(np.float32)
    return np.where(np.isnan(single), single, kept)


def rounded(value, dtype):
    """Numpy values as an implementation of `dtype` receives them: floats rounded to it, integers int64, numpy scalars as Python numbers.

    Nested dicts, lists and tuples keep their structure; other values pass through. bfloat16,
    which numpy lacks, is held in float32 (exactly).
    """
    if isinstance(value, np.ndarray):  # the common case first: rounded() runs on every argument of every call
        kind = value.dtype.kind
        if kind == "f":
            return _bfloat16(value) if dtype == "bfloat16" else value.astype(dtype)
        return value.astype(np.int64) if kind in "iu" else value
    if isinstance(value, dict):
        return {k: rounded(v, dtype) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(rounded(v, dtype) for v in value)
    if isinstance(value, np.generic):  # a numpy float64 scalar would promote a float32 implementation's arrays
        return value.item()
    return value


def to_backend(value, *, backend, device="cpu", dtype="float64", requires_grad=False):
    """rounded() numpy values -> the backend's arrays on `device` (floats in `dtype`); other values pass through."""
    if backend == "numpy":  # rounded() values are numpy's already, in fresh containers
        return value
    if isinstance(value, np.ndarray):
        return _tensor(value, device, dtype, requires_grad)
    if isinstance(value, dict):
        return {k: to_backend(v, backend=backend, device=device, dtype=dtype) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(to_backend(v, backend=backend, device=device, dtype=dtype) for v in value)
    return value


def _tensor(array, device, dtype, requires_grad):
    """A torch tensor of `array` on `device`: floats in `dtype`, integers int64, booleans bool (sharing memory where nothing changes)."""
    import torch

    kind = array.dtype.kind
    target = torch.int64 if kind in "iu" else torch.bool if kind == "b" else getattr(torch, dtype)
    if not array.flags.writeable:  # a tensor would share memory the implementation could write to
        array = array.copy()
    if not (array.ndim and array.flags.c_contiguous):  # rounded() arrays are contiguous already
        array = np.ascontiguousarray(array).reshape(array.shape)  # ascontiguousarray makes 0-d arrays 1-d
    tensor = torch.from_numpy(array)
    if tensor.dtype != target or device != "cpu":
        tensor = tensor.to(device=device, dtype=target)
    return tensor.requires_grad_(True) if requires_grad else tensor


# -- out of the implementation ----------------------------------------------------------------


def _torch_tensor(value):
    torch = sys.modules.get("torch")
    return torch is not None and isinstance(value, torch.Tensor)


def to_numpy(value, what):
    """An answer as plain numpy: lists and tuples as tuples, dict keys as str, numbers as 0-d arrays, integers int64.

    Only the bytes cross: an ndarray subclass or a number subclass leaves its methods behind.
    Anything else (None, objects, complex or object arrays) is an OutputError that names `what`.
    """
    if isinstance(value, (tuple, list)):
        return tuple(to_numpy(v, f"{what}[{i}]") for i, v in enumerate(value))
    if isinstance(value, dict):
        return {str(k): to_numpy(v, f"{what}[{k!r}]") for k, v in value.items()}
    if type(value) is str:
        return value
    if isinstance(value, np.generic) or type(value) in (bool, int, float):
        value = np.asarray(value)
    elif _torch_tensor(value):
        tensor = value.detach().cpu()
        if tensor.dtype == sys.modules["torch"].bfloat16:
            tensor = tensor.float()  # numpy has no bfloat16; float32 holds it exactly
        value = tensor.numpy()
    if not isinstance(value, np.ndarray):
        raise OutputError(f"{what} returned a {type(value).__module__}.{type(value).__qualname__}, not an array")
    value = value.view(np.ndarray)
    kind = value.dtype.kind
    if kind in "iu":
        return value.astype(np.int64)
    if kind == "b" or (kind == "f" and value.dtype.itemsize <= 8):  # float16, 32 or 64 (bfloat16 comes back as float32), not longdouble
        return value
    raise OutputError(f"{what} returned an array of dtype {value.dtype}, not a real-valued one")


# -- declarations -----------------------------------------------------------------------------

MAX_DECLARED_BITS = 63  # an int past int64 declares nothing real (and past 4,300 digits has no repr, nor JSON)
MAX_DECLARED_CHARACTERS = 80  # longer than any declarable word
_PLAIN = {bool: bool, int: int.__int__, float: float.__float__, str: str.__str__}  # the slot itself: a subclass cannot override it


def declared_value(value):
    """The plain bool, int, float or str a declaration states, or a short description of what else it is (a str no convention allows).

    A numpy scalar, a 0-d array or a 0-d torch tensor states its one value (a float16 or float32 one its shortest
    decimal: np.float32(1e-5) states 1e-05), a subclass of a plain type (np.float64, an IntEnum) its plain value.
    The suite's reader (invariants.conventions.read_declarations) and the gate's worker both call this, so both read
    one value the same way and refuse the rest with the same words; only plain values cross to the gate's parent.
    """
    if _torch_tensor(value):
        if value.ndim:
            return f"a tensor of shape {tuple(value.shape)}"
        try:
            value = to_numpy(value, "the declaration")
        except (Exception, SystemExit) as exc:  # a complex tensor, or a tensor subclass's own code
            return f"a tensor that is no real number ({type(exc).__name__})"
    if isinstance(value, np.ndarray):
        if value.ndim:
            return f"an array of shape {value.shape}"
        value = value[()]
    if isinstance(value, np.floating) and value.dtype.itemsize < 8:
        return float(str(value))  # the decimal the code was written with, not float32's binary neighbour 1.0000000474974513e-05
    if isinstance(value, np.generic):
        value = value.item()
    plain = next((kind for kind in _PLAIN if isinstance(value, kind)), None)
    if value is None:
        return None  # refused by every convention, in its own words
    if plain is None:
        name = type(value).__name__
        return f"{'an' if name[:1].lower() in 'aeiou' else 'a'} {name}"[:MAX_DECLARED_CHARACTERS]
    value = _PLAIN[plain](value)
    if plain is int and value.bit_length() > MAX_DECLARED_BITS:
        return f"an int of {value.bit_length()} bits"
    if plain is str and len(value) > MAX_DECLARED_CHARACTERS:
        return f"a str of {len(value)} characters"
    return value


# -- calling ----------------------------------------------------------------------------------


def first_line(text, limit=300):
    """The first line of `text`, cut to `limit` characters."""
    text = str(text).strip()
    line = text.splitlines()[0] if text else ""
    return line if len(line) <= limit else line[: limit - 1] + "…"


def where(exc, root=None):
    """' (at file.py:12)' for the innermost traceback frame of exc, preferring frames under `root` (shown relative to it)."""
    frames = list(traceback.walk_tb(exc.__traceback__))
    if root is not None:
        frames = [f for f in frames if f[0].f_code.co_filename.startswith(root)] or frames
    if not frames:
        return ""
    frame, line = frames[-1]
    name = frame.f_code.co_filename
    shown = os.path.relpath(name, root) if root and name.startswith(root) else os.path.basename(name)
    return f" (at {shown}:{line})"


def describe_exception(exc, root=None):
    """'ValueError: bad ids (at model.py:12)'; a SystemExit says that sys.exit() was called."""
    if isinstance(exc, SystemExit):
        return f"SystemExit({exc.code!r}): sys.exit() was called{where(exc, root)}"
    return f"{type(exc).__name__}: {first_line(exc)}{where(exc, root)}"


def signature_problem(fn, name, params):
    """A sentence saying why fn cannot be called as name(*params), or None (also for builtins, which cannot be inspected)."""
    try:
        signature = inspect.signature(fn)
    except (TypeError, ValueError):
        return None
    try:
        signature.bind(*params)
    except TypeError as exc:
        return f"{name}{signature} cannot be called as {name}({', '.join(params)}): {exc}"
    return None


def answer(fn, name, params, args, *, backend, device="cpu", dtype="float64", root=None):
    """fn(*args) with rounded() numpy args converted to the backend, and its answer as plain numpy.

    Raises CallError when fn raises (a SystemExit included) or cannot take the protocol's
    parameters `params`, OutputError when its answer is not arrays; `root` shortens file names.
    """
    converted = to_backend(args, backend=backend, device=device, dtype=dtype)
    try:
        out = fn(*converted)
    except (Exception, SystemExit) as exc:
        problem = signature_problem(fn, name, params) if isinstance(exc, TypeError) else None
        if problem:
            raise CallError("signature", problem, exc) from None
        raise CallError("raised", f"{name} raised {describe_exception(exc, root)}", exc) from None
    try:
        return to_numpy(out, name)
    except OutputError:
        raise
    except (Exception, SystemExit) as exc:  # converting a tensor subclass runs the implementation's code too
        raise OutputError(f"converting {name}'s answer raised {describe_exception(exc, root)}") from None
