"""The implementation protocol (version 1) and the wrapper that lets the suite call any implementation.

An implementation is a namespace (a module, a file, an object) that defines some of the
functions in FUNCTIONS, plus BACKEND = "numpy" or "torch". The suite calls them positionally,
exactly as the signatures below are written, with arrays of the implementation's backend,
dtype and device; docs/protocol.md is the user-facing description of the same table.

`Implementation` wraps such a namespace: it converts the suite's numpy inputs to the
backend, calls, and converts the answer back to numpy, so that every invariant is written
once, in numpy, whatever the implementation runs on.
"""

from __future__ import annotations

import importlib
import importlib.util
import inspect
import os
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from invariants.tolerance import Tolerance, tolerance_for

PROTOCOL_VERSION = 1
BACKENDS = ("numpy", "torch")
DTYPES = ("float64", "float32", "float16", "bfloat16")


@dataclass(frozen=True)
class ProtocolFunction:
    """One function of the protocol: how the suite calls it and what it must return."""

    name: str
    params: tuple[str, ...]  # passed positionally, in this order
    returns: str
    summary: str

    @property
    def signature(self):
        return f"{self.name}({', '.join(self.params)})"


FUNCTIONS = {
    f.name: f
    for f in (
        ProtocolFunction("softmax", ("x", "axis"), "array, same shape as x", "exp(x)/Σexp(x) along axis"),
        ProtocolFunction("layer_norm", ("x", "gain", "bias", "eps"), "(..., d)", "per-row LayerNorm, population variance"),
        ProtocolFunction("rms_norm", ("x", "gain", "eps"), "(..., d)", "per-row RMSNorm"),
        ProtocolFunction("gelu", ("x",), "array, same shape as x", "GELU (tanh or erf form)"),
        ProtocolFunction("cross_entropy", ("logits", "targets"), "scalar", "mean NLL in nats; logits (..., V), int targets (...)"),
        ProtocolFunction(
            "attention",
            ("x", "W_q", "W_k", "W_v", "W_o", "n_heads", "causal"),
            "(out (B, T, d), weights (B, H, T, T))",
            "multi-head self-attention; x (B, T, d), each W (d, d)",
        ),
        ProtocolFunction("feed_forward", ("x", "W1", "b1", "W2", "b2"), "(..., d)", "GELU MLP; W1 (d, F), W2 (F, d)"),
        ProtocolFunction(
            "transformer_block",
            ("x", "params", "n_heads", "causal"),
            "(B, T, d)",
            "pre-norm block; params: ln1_g ln1_b W_q W_k W_v W_o ln2_g ln2_b W1 b1 W2 b2",
        ),
        ProtocolFunction(
            "gpt_logits",
            ("ids", "params", "n_heads"),
            "(B, T, V)",
            "decoder-only LM; params: wte (V, d), wpe (max_len, d), blocks [...], lnf_g, lnf_b; ValueError on bad ids",
        ),
        ProtocolFunction(
            "gpt_param_count", ("vocab", "d_model", "n_layers", "max_len", "attn_bias"), "int", "exact count, tied output"
        ),
        ProtocolFunction("top_k_gates", ("router_logits", "k"), "(N, E)", "softmax over each token's k kept scores, 0 elsewhere"),
        ProtocolFunction("moe", ("x", "router", "experts", "k"), "(N, d)", "x (N, d), router (d, E), experts [{W1, b1, W2, b2}]"),
        ProtocolFunction("load_balancing_loss", ("router_logits", "k"), "scalar", "Switch loss E·Σ f_i·P_i"),
        ProtocolFunction("tokens_per_expert", ("router_logits", "k"), "(E,) ints", "tokens routed to each expert"),
        ProtocolFunction("moe_n_params", ("d_model", "n_experts"), "int", "router + all experts"),
        ProtocolFunction("moe_active_params", ("d_model", "n_experts", "k"), "int", "router + k experts"),
        ProtocolFunction("inference_flops_per_token", ("n_params",), "number", "≈ 2N"),
        ProtocolFunction("training_flops", ("n_params", "n_tokens"), "number", "≈ 6ND"),
        ProtocolFunction("build_vocab", ("text",), "str", "sorted distinct characters"),
        ProtocolFunction("encode", ("text", "vocab"), "(n,) ints", "characters -> ids"),
        ProtocolFunction("decode", ("ids", "vocab"), "str", "ids -> characters"),
        ProtocolFunction("get_batch", ("data", "batch_size", "seq_len", "seed"), "(x, y), each (B, T)", "y is x shifted by one"),
    )
}


class ImplementationLoadError(Exception):
    """The --impl target could not be imported or holds none of the protocol."""


class ImplementationError(Exception):
    """A protocol function raised, or could not be called with the protocol's arguments."""

    def __init__(self, message, original=None):
        super().__init__(message)
        self.original = original


class OutputError(Exception):
    """A protocol function returned something that is not an array (or tuple of arrays) of the protocol."""


def _where(exc):
    """' (at file.py:12)' for the innermost frame of an exception's traceback, or ''."""
    tb = exc.__traceback__
    while tb is not None and tb.tb_next is not None:
        tb = tb.tb_next
    return f" (at {Path(tb.tb_frame.f_code.co_filename).name}:{tb.tb_lineno})" if tb is not None else ""


def _first_line(text, limit=300):
    line = str(text).strip().splitlines()[0] if str(text).strip() else ""
    return line if len(line) <= limit else line[: limit - 1] + "…"


def _signature_problem(fn, spec):
    """A sentence saying why fn cannot take the protocol's positional arguments, or None."""
    try:
        signature = inspect.signature(fn)
    except (TypeError, ValueError):  # builtins and C functions: nothing to check
        return None
    try:
        signature.bind(*spec.params)
    except TypeError as exc:
        return f"{spec.name}{signature} cannot be called as {spec.signature}: {exc}"
    return None


class Implementation:
    """An implementation under test, called with numpy inputs and answering with numpy outputs.

    backend: "numpy" or "torch"; device: "cpu", "cuda", "cuda:1", ...; dtype: one of DTYPES.
    Integer arrays (token ids, targets) always go in as int64. `raw(name)` gives the function
    itself, for checks that need autograd; in_process is False for proxies (the gate's worker).
    """

    in_process = True

    def __init__(self, namespace, *, label, backend, device="cpu", dtype="float64"):
        if backend not in BACKENDS:
            raise ImplementationLoadError(f"backend={backend!r} is not one of {', '.join(BACKENDS)}")
        if dtype not in DTYPES:
            raise ImplementationLoadError(f"dtype={dtype!r} is not one of {', '.join(DTYPES)}")
        if backend == "numpy" and (device != "cpu" or dtype == "bfloat16"):
            raise ImplementationLoadError(f"the numpy backend runs on cpu without bfloat16, not {device}/{dtype}")
        self.namespace = namespace
        self.label = label
        self.backend = backend
        self.device = device
        self.dtype = dtype
        self.functions = {name: getattr(namespace, name) for name in FUNCTIONS if callable(getattr(namespace, name, None))}
        self._torch = importlib.import_module("torch") if backend == "torch" else None

    @classmethod
    def from_functions(cls, *, backend, device="cpu", dtype="float64", label="functions", **functions):
        """Wrap loose callables: Implementation.from_functions(backend="torch", attention=my_attention)."""
        unknown = sorted(set(functions) - set(FUNCTIONS))
        if unknown:
            raise ImplementationLoadError(f"{', '.join(unknown)} are not protocol functions; see invariants.protocol.FUNCTIONS")
        namespace = type("Functions", (), {k: staticmethod(v) for k, v in functions.items()})
        return cls(namespace, label=label, backend=backend, device=device, dtype=dtype)

    def __repr__(self):
        return f"{self.label} ({self.backend}, {self.device}, {self.dtype})"

    @property
    def tolerance(self) -> Tolerance:
        """The comparison tolerance for this implementation's dtype."""
        return tolerance_for(self.dtype)

    def missing(self, names):
        """A skip reason naming the protocol functions this implementation lacks, or None."""
        absent = [name for name in names if name not in self.functions]
        if not absent:
            return None
        return f"{self.label} does not provide {', '.join(absent)} (protocol v{PROTOCOL_VERSION})"

    # -- conversion ---------------------------------------------------------------------------

    def to_backend(self, value, *, requires_grad=False):
        """numpy (and nested dicts/lists of it) -> the implementation's arrays; other values pass through."""
        if isinstance(value, dict):
            return {k: self.to_backend(v) for k, v in value.items()}
        if isinstance(value, (list, tuple)):
            return type(value)(self.to_backend(v) for v in value)
        if not isinstance(value, np.ndarray):
            return value
        integer = value.dtype.kind in "iu"
        if self.backend == "numpy":
            return value.astype(np.int64 if integer else value.dtype if value.dtype == bool else self.dtype)
        torch = self._torch
        dtype = torch.int64 if integer else torch.bool if value.dtype == bool else getattr(torch, self.dtype)
        contiguous = np.ascontiguousarray(value).reshape(value.shape)  # ascontiguousarray makes 0-d arrays 1-d
        tensor = torch.as_tensor(contiguous).to(device=self.device, dtype=dtype)
        return tensor.requires_grad_(True) if requires_grad else tensor

    def to_numpy(self, value, what):
        """The implementation's answer -> numpy arrays (tuples and dicts kept); anything else is an OutputError."""
        if isinstance(value, (tuple, list)):
            return tuple(self.to_numpy(v, f"{what}[{i}]") for i, v in enumerate(value))
        if isinstance(value, dict):
            return {k: self.to_numpy(v, f"{what}[{k!r}]") for k, v in value.items()}
        if isinstance(value, str):
            return value
        if isinstance(value, np.ndarray):
            return value
        if isinstance(value, (bool, int, float, np.generic)):
            return np.asarray(value)
        if self._torch is not None and isinstance(value, self._torch.Tensor):
            tensor = value.detach().cpu()
            if tensor.dtype == self._torch.bfloat16:  # numpy has no bfloat16; float32 holds it exactly
                tensor = tensor.float()
            return tensor.numpy()
        raise OutputError(f"{what} returned a {type(value).__module__}.{type(value).__qualname__}, not an array")

    def as_seen(self, value):
        """The float64 values the implementation actually receives for `value` (floats rounded to its dtype)."""
        if isinstance(value, dict):
            return {k: self.as_seen(v) for k, v in value.items()}
        if isinstance(value, (list, tuple)):
            return type(value)(self.as_seen(v) for v in value)
        if isinstance(value, np.ndarray) and value.dtype.kind == "f":
            return self.to_numpy(self.to_backend(value), "input").astype(np.float64)
        return value

    def raw(self, name):
        """The implementation's own function `name`, taking and returning backend arrays."""
        return self.functions[name]

    # -- calling ------------------------------------------------------------------------------

    def call(self, name, *args):
        """Call protocol function `name` with numpy arguments; the answer comes back as numpy."""
        fn = self.functions[name]
        spec = FUNCTIONS[name]
        try:
            out = fn(*self.to_backend(args))
        except Exception as exc:
            problem = _signature_problem(fn, spec) if isinstance(exc, TypeError) else None
            message = problem or f"{name} raised {type(exc).__name__}: {_first_line(exc)}{_where(exc)}"
            raise ImplementationError(message, original=exc) from None
        return self.to_numpy(out, name)

    def __getattr__(self, name):
        if name in FUNCTIONS:
            if name not in self.__dict__.get("functions", {}):
                raise AttributeError(f"{self.label} does not provide {name}")
            return lambda *args: self.call(name, *args)
        raise AttributeError(name)


def _import_target(target):
    """Import `target`: a dotted module name or a path to a .py file or a package folder."""
    path = Path(target)
    if target.endswith(".py") or os.sep in target or path.exists():
        if not path.exists():
            raise ImplementationLoadError(f"no file or folder {target!r}")
        file = path / "__init__.py" if path.is_dir() else path
        if not file.exists():
            raise ImplementationLoadError(f"{target!r} is a folder without __init__.py")
        name = f"_impl_{abs(hash(str(file.resolve())))}"
        spec = importlib.util.spec_from_file_location(name, file, submodule_search_locations=[str(path)] if path.is_dir() else None)
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        try:
            spec.loader.exec_module(module)
        except Exception as exc:
            del sys.modules[name]
            raise ImplementationLoadError(f"importing {target!r} raised {type(exc).__name__}: {_first_line(exc)}{_where(exc)}") from None
        return module
    try:
        return importlib.import_module(target)
    except ModuleNotFoundError as exc:
        if exc.name and target.startswith(exc.name):
            raise ImplementationLoadError(f"no module named {target!r}") from None
        raise ImplementationLoadError(f"importing {target!r} raised ModuleNotFoundError: {exc}") from None
    except Exception as exc:
        raise ImplementationLoadError(f"importing {target!r} raised {type(exc).__name__}: {_first_line(exc)}{_where(exc)}") from None


def load_implementation(target="reference.numpy", *, backend=None, device="cpu", dtype="float64"):
    """Load an --impl target: 'pkg.module', 'path/to/file.py' or either followed by ':object'.

    The backend comes from `backend`, else from the target's BACKEND attribute.
    """
    module_part, _, object_part = target.partition(":")
    if len(module_part) == 1 and object_part.startswith("\\"):  # a Windows drive letter, not module:object
        module_part, object_part = target, ""
    namespace = _import_target(module_part)
    for attr in filter(None, object_part.split(".")):
        try:
            namespace = getattr(namespace, attr)
        except AttributeError:
            raise ImplementationLoadError(f"{module_part!r} has no attribute {attr!r}") from None
    if inspect.isclass(namespace):  # a class of static methods or with a no-argument constructor
        try:
            namespace = namespace()
        except Exception as exc:
            raise ImplementationLoadError(f"{target}() raised {type(exc).__name__}: {_first_line(exc)}") from None
    backend = backend or getattr(namespace, "BACKEND", None)
    if backend is None:
        raise ImplementationLoadError(f"{target!r} does not say its backend: set BACKEND = 'numpy' or 'torch' in it, or pass --impl-backend")
    if not any(callable(getattr(namespace, name, None)) for name in FUNCTIONS):
        raise ImplementationLoadError(f"{target!r} provides none of the protocol functions ({', '.join(list(FUNCTIONS)[:4])}, ...)")
    if backend == "torch" and device.startswith("cuda"):
        import torch

        if not torch.cuda.is_available():
            raise ImplementationLoadError("CUDA requested but torch.cuda.is_available() is False")
    return Implementation(namespace, label=target, backend=backend, device=device, dtype=dtype)
