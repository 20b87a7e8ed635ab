"""The implementation protocol (version 2: version 1 plus the modern decoder) and the wrapper that lets the suite call any implementation.

An implementation is a namespace (a module, a file, an object) that defines some of the
functions in FUNCTIONS, plus BACKEND = "numpy" or "torch". The suite calls them positionally,
exactly as the signatures below are written, with arrays of the implementation's backend,
dtype and device; docs/protocol.md is the user-facing description of the same table.

`Implementation` wraps such a namespace: it rounds the suite's numpy inputs to the dtype and
hands them to a transport, which converts to the backend, calls, and converts the answer back
to numpy (invariants.boundary), so that every invariant is written once, in numpy, whatever
the implementation runs on and whichever process it runs in.
"""

from __future__ import annotations

import importlib
import importlib.util
import inspect
import os
import sys
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from invariants.boundary import (
    CallError,
    OutputError,  # noqa: F401 - raised through here by every transport
    answer,
    first_line,
    rounded,
    to_backend,
    to_numpy,
    where,
)
from invariants.conventions import read_declarations
from invariants.tolerance import Tolerance, tolerance_for

PROTOCOL_VERSION = 2
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
        ProtocolFunction("moe", ("x", "router", "experts", "k"), "(N, d)",
                         "x (N, d), router (d, E), experts [{W1, b1, W2, b2}] (EXPERT_FFN = 'swiglu': [{W_gate, W_up, W_down}])"),
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
        # version 2: the modern decoder
        ProtocolFunction("rope", ("x", "positions", "base"), "(..., T, D)", "rotary embedding: pair i at position p rotated by p·base^(-2i/D)"),
        ProtocolFunction(
            "gqa_attention",
            ("q", "k", "v", "causal", "key_mask", "window"),
            "(out (B, H, T, D), weights (B, H, T, S))",
            "grouped-query attention core; q (B, H, T, D), k, v (B, H_kv, S, D), S >= T; key_mask (B, S) bool or None; window or None",
        ),
        ProtocolFunction("swiglu", ("x", "W_gate", "W_up", "W_down"), "(..., d)", "(SiLU(x·W_gate) ⊙ x·W_up)·W_down"),
        ProtocolFunction(
            "llama_block",
            ("x", "params", "n_heads", "n_kv_heads", "rope_base", "window"),
            "(B, T, d)",
            "RMSNorm pre-norm block, GQA with RoPE, SwiGLU; params: attn_norm W_q W_k W_v W_o ffn_norm W_gate W_up W_down (+ b_q b_k b_v)",
        ),
        ProtocolFunction(
            "llama_logits",
            ("ids", "params", "n_heads", "n_kv_heads", "rope_base", "window"),
            "(B, T, V)",
            "Llama-style LM; params: embed (V, d), blocks [...], norm (d,), W_out (d, V); ValueError on ids outside [0, V)",
        ),
        ProtocolFunction(
            "llama_decode",
            ("ids", "params", "n_heads", "n_kv_heads", "rope_base", "window", "chunks"),
            "(logits (B, T, V), cache_sizes (n,) ints)",
            "prefill chunks[0] tokens, then each chunk on the implementation's own KV cache",
        ),
        ProtocolFunction(
            "cross_attention",
            ("x", "memory", "W_q", "W_k", "W_v", "W_o", "n_heads"),
            "(out (B, T, d), weights (B, H, T, S))",
            "queries from x (B, T, d), keys and values from memory (B, S, d), no mask",
        ),
        ProtocolFunction(
            "decoder_block",
            ("x", "memory", "params", "n_heads"),
            "(B, T, d)",
            "pre-norm encoder-decoder block: causal self-attention, cross-attention, GELU feed-forward",
        ),
    )
}


class ImplementationLoadError(Exception):
    """The --impl target could not be imported or holds none of the protocol."""


class ImplementationError(Exception):
    """A protocol function raised, or could not be called with the protocol's arguments."""

    def __init__(self, message, original=None):
        super().__init__(message)
        self.original = original


class TransportLost(BaseException):  # noqa: N818 - a BaseException, so hypothesis stops at once instead of shrinking
    """The implementation can no longer be reached: its process died, hung or ran past a time limit.

    `cause` names which ("died", "call_timeout", ...); `out_of_time` is True when a clock, not
    the implementation, ended the run, so that a counterexample already found still stands.
    """

    def __init__(self, cause, message, *, out_of_time=False):
        super().__init__(message)
        self.cause, self.message, self.out_of_time = cause, message, out_of_time


class InProcess:
    """The transport that calls the implementation's own functions in this process."""

    in_process = True

    def __init__(self, namespace, *, backend, device, dtype):
        self.namespace = namespace
        self.backend, self.device, self.dtype = backend, device, dtype
        self.callables = {name: getattr(namespace, name) for name in FUNCTIONS if callable(getattr(namespace, name, None))}
        self.functions = frozenset(self.callables)
        self.declarations = read_declarations(namespace)

    def call(self, name, args):
        """The answer to name(*args), rounded() numpy in, plain numpy out; ImplementationError or OutputError otherwise."""
        try:
            return answer(self.callables[name], name, FUNCTIONS[name].params, args, backend=self.backend, device=self.device, dtype=self.dtype)
        except CallError as exc:
            raise ImplementationError(exc.message, original=exc.original) from None

    def raw(self, name):
        return self.callables[name]


class Implementation:
    """An implementation under test, called with numpy inputs and answering with numpy outputs.

    backend: "numpy" or "torch"; device: "cpu", "cuda", "cuda:1", ...; dtype: one of DTYPES.
    Inputs are rounded to the dtype here (invariants.boundary.rounded), then handed to a
    transport: InProcess for a namespace in this process (the default), the gate's worker
    transport for a submission in another. Both convert through invariants.boundary.answer.
    `raw(name)` gives the function itself, for checks that need autograd (in process only).
    """

    def __init__(self, namespace: object = None, *, label: str, backend: str, device: str = "cpu", dtype: str = "float64",
                 transport: Any = None) -> None:
        if backend not in BACKENDS:
            raise ImplementationLoadError(f"backend={backend!r} is not one of {', '.join(BACKENDS)}")
        if dtype not in DTYPES:
            raise ImplementationLoadError(f"dtype={dtype!r} is not one of {', '.join(DTYPES)}")
        if backend == "numpy" and (device != "cpu" or dtype == "bfloat16"):
            raise ImplementationLoadError(f"the numpy backend runs on cpu without bfloat16, not {device}/{dtype}")
        if (namespace is None) == (transport is None):
            raise TypeError("Implementation needs a namespace or a transport, not both")
        self.label = label
        self.backend = backend
        self.device = device
        self.dtype = dtype
        try:
            self.transport = transport or InProcess(namespace, backend=backend, device=device, dtype=dtype)
        except ValueError as exc:  # a declared convention with a value it cannot take
            raise ImplementationLoadError(f"{label}: {exc}") from None
        self.namespace = namespace
        self.functions = self.transport.functions  # the protocol functions it provides (names)
        self.declarations = self.transport.declarations  # {convention: value} (invariants.conventions)
        self.in_process = self.transport.in_process
        self.calls: list[tuple[str, Any, Any]] | None = None  # records (name, args, answer) while the runner asks for it (repro scripts)

    @classmethod
    def from_functions(cls, *, backend: str, device: str = "cpu", dtype: str = "float64", label: str = "functions",
                       **functions: Callable[..., Any]) -> Implementation:
        """Wrap loose callables: Implementation.from_functions(backend="torch", attention=my_attention)."""
        unknown = sorted(set(functions) - set(FUNCTIONS))
        if unknown:
            raise ImplementationLoadError(f"{', '.join(unknown)} are not protocol functions; see invariants.protocol.FUNCTIONS")
        namespace = type("Functions", (), {k: staticmethod(v) for k, v in functions.items()})
        return cls(namespace, label=label, backend=backend, device=device, dtype=dtype)

    def __repr__(self) -> str:
        return f"{self.label} ({self.backend}, {self.device}, {self.dtype})"

    @property
    def tolerance(self) -> Tolerance:
        """The comparison tolerance for this implementation's dtype."""
        return tolerance_for(self.dtype)

    def missing(self, names: Iterable[str]) -> str | None:
        """A skip reason naming the protocol functions this implementation lacks, or None."""
        absent = [name for name in names if name not in self.functions]
        if not absent:
            return None
        return f"{self.label} does not provide {', '.join(absent)} (protocol v{PROTOCOL_VERSION})"

    # -- conversion (one place: invariants.boundary) ---------------------------------------------

    def to_backend(self, value: Any, *, requires_grad: bool = False) -> Any:
        """numpy (and nested dicts/lists of it) -> the implementation's arrays, rounded to its dtype; other values pass through."""
        return to_backend(rounded(value, self.dtype), backend=self.backend, device=self.device, dtype=self.dtype, requires_grad=requires_grad)

    def to_numpy(self, value: Any, what: str) -> Any:
        """The implementation's answer -> plain numpy (tuples and dicts kept); anything else is an OutputError."""
        return to_numpy(value, what)

    def as_seen(self, value: Any) -> Any:
        """The float64 values the implementation actually receives for `value` (floats rounded to its dtype)."""
        if isinstance(value, dict):
            return {k: self.as_seen(v) for k, v in value.items()}
        if isinstance(value, (list, tuple)):
            return type(value)(self.as_seen(v) for v in value)
        if isinstance(value, np.ndarray) and value.dtype.kind == "f":
            return rounded(value, self.dtype).astype(np.float64, copy=False)  # rounded() made a fresh array
        return value

    def raw(self, name: str) -> Callable[..., Any]:
        """The implementation's own function `name`, taking and returning backend arrays (in process only)."""
        if not self.in_process:
            raise ImplementationError(f"{name} runs in another process: its own callables never reach the suite")
        return self.transport.raw(name)

    # -- calling ------------------------------------------------------------------------------

    def call(self, name: str, *args: Any) -> Any:
        """Call protocol function `name` with numpy arguments; the answer comes back as numpy."""
        if name not in self.functions:
            raise AttributeError(f"{self.label} does not provide {name}")
        args = rounded(args, self.dtype)
        if self.calls is None:
            return self.transport.call(name, args)
        try:
            answer = self.transport.call(name, args)
        except (ImplementationError, OutputError) as exc:
            self.calls.append((name, args, exc))
            raise
        self.calls.append((name, args, answer))
        return answer

    def __getattr__(self, name: str) -> Callable[..., Any]:
        if name in FUNCTIONS:
            if name not in self.__dict__.get("functions", ()):
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
            raise ImplementationLoadError(f"importing {target!r} raised {type(exc).__name__}: {first_line(exc)}{where(exc)}") from None
        return module
    try:
        return importlib.import_module(target)
    except ModuleNotFoundError as exc:
        if exc.name and target.startswith(exc.name):
            raise ImplementationLoadError(f"no module named {target!r}") from None
        raise ImplementationLoadError(f"importing {target!r} raised ModuleNotFoundError: {exc}") from None
    except Exception as exc:
        raise ImplementationLoadError(f"importing {target!r} raised {type(exc).__name__}: {first_line(exc)}{where(exc)}") from None


def load_target(target: str, *, backend: str | None = None) -> tuple[object, str]:
    """(namespace, backend) of an --impl target, 'pkg.module', 'path/to/file.py' or either followed by ':object'.

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
            raise ImplementationLoadError(f"{target}() raised {type(exc).__name__}: {first_line(exc)}") from None
    backend = backend or getattr(namespace, "BACKEND", None)
    if backend is None:
        raise ImplementationLoadError(f"{target!r} does not say its backend: set BACKEND = 'numpy' or 'torch' in it, or pass --impl-backend")
    if not any(callable(getattr(namespace, name, None)) for name in FUNCTIONS):
        raise ImplementationLoadError(f"{target!r} provides none of the protocol functions ({', '.join(list(FUNCTIONS)[:4])}, ...)")
    return namespace, backend


def load_implementation(target: str = "reference.numpy", *, backend: str | None = None, device: str = "cpu",
                        dtype: str = "float64") -> Implementation:
    """Load an --impl target (load_target) as an Implementation on `device` in `dtype`."""
    namespace, backend = load_target(target, backend=backend)
    if backend == "torch" and device.startswith("cuda"):
        import torch

        if not torch.cuda.is_available():
            raise ImplementationLoadError("CUDA requested but torch.cuda.is_available() is False")
    return Implementation(namespace, label=target, backend=backend, device=device, dtype=dtype)
