"""What the worker may send the parent: one schema for every frame, and each answer's expected shapes, checked before use.

    frames.check(header, "answer")                     # a FrameError naming the field that breaks the schema
    frames.answer_problem("layer_norm", args, header)  # None, or "shape of layer_norm output=(4000000,), but should be (2, 4)"

The worker runs the submission in its own process, so from the parent's go-ahead ("load") on,
any frame may have been written by the submission (it can write to the worker's pipe at import):
a frame that breaks the schema is the submission's protocol fault, never the gate's. Only the
hello comes before any submission code. wire.receive_header has bounded the header's size and
depth already; the schema bounds every list and checks every field's type, and the answer's
declared dtypes and shapes are held to what its arguments call for before its bytes are read.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from invariants.answers import FLOATS, TEXT, Either
from invariants.asserts import InvariantViolation
from invariants.gate.wire import DTYPES, WireError
from invariants.protocol import FUNCTIONS, OutputError

MAX_ITEMS = 1000  # entries of any list or mapping in a frame
LOAD_PROBLEMS = ("syntax_error", "import_error", "exit_at_import")  # the worker's words for a submission it could not load
ERROR_KINDS = ("raised", "signature", "output")
SCALAR = (type(None), bool, int, float, str)


class FrameError(WireError):
    """A frame that breaks the schema below; the message names the frame and the field."""


class WrongAnswer(OutputError, InvariantViolation):
    """An answer of another dtype or shape than its arguments call for: a wrong answer ("failed"), refused as one the protocol does not allow."""


# The schema's words: a type (or a tuple of types) is itself; ListOf and MapOf hold at most MAX_ITEMS
# entries of their spec; Maybe allows null; OneOf names the allowed strings; a Record names every
# field it allows, and the optional ones it may leave out.


@dataclass(frozen=True)
class ListOf:
    item: object


@dataclass(frozen=True)
class MapOf:
    value: object


@dataclass(frozen=True)
class Maybe:
    spec: object


@dataclass(frozen=True)
class OneOf:
    words: tuple


@dataclass(frozen=True)
class Record:
    fields: dict
    optional: tuple = ()


ANY = object()  # a wire value tree, which wire.decode validates
EVIDENCE = Record({"kind": str, "name": str, "where": str, "detail": str})
FRAMES = {  # the frames the worker sends, by "op"; every frame also has "op" and "buffers" (wire.receive_header checks those)
    "hello": Record({"protections": MapOf(str), "missing": ListOf(str), "uid": int}),
    "loaded": Record({"ok": bool, "problem": Maybe(Record({"kind": OneOf(LOAD_PROBLEMS), "message": str})), "functions": ListOf(str),
                      "declarations": MapOf(SCALAR), "backend": Maybe(str), "evidence": ListOf(EVIDENCE)}),
    "answer": Record({"ok": bool, "value": ANY, "evidence": ListOf(EVIDENCE), "used": ListOf(str),
                      "error": Record({"kind": OneOf(ERROR_KINDS), "message": str, "type": str, "builtin_bases": ListOf(str)},
                                      optional=("type", "builtin_bases"))},
                     optional=("value", "error")),
}


def check(header, op):
    """`header` is a frame of kind `op` that fits FRAMES[op]; FrameError names what does not."""
    got = header.get("op")
    if got != op:
        raise FrameError(f"{_a(repr(str(got)[:40]))} frame where {_a(repr(op))} frame was due")
    spec = FRAMES[op]
    _fits(spec, {k: v for k, v in header.items() if k not in ("op", "buffers")}, f"the {op} frame")
    if op == "answer" and {"value", "error"} & set(header) != {"value" if header["ok"] else "error"}:
        raise FrameError("the answer frame must carry a value when ok is true and an error when it is false")


def _fits(spec, value, where):
    if spec is ANY:
        return
    if isinstance(spec, type) or isinstance(spec, tuple):
        if not isinstance(value, spec) or (isinstance(value, bool) and bool not in (spec if isinstance(spec, tuple) else (spec,))):
            raise FrameError(f"{where} is {_a(type(value).__name__)}, not {_name(spec)}")
        return
    if isinstance(spec, Maybe):
        if value is not None:
            _fits(spec.spec, value, where)
        return
    if isinstance(spec, OneOf):
        if value not in spec.words:
            raise FrameError(f"{where} is {str(value)[:40]!r}, not one of {', '.join(spec.words)}")
        return
    container = list if isinstance(spec, ListOf) else dict
    if not isinstance(value, container):
        raise FrameError(f"{where} is {_a(type(value).__name__)}, not {_a(container.__name__)}")
    if isinstance(spec, (ListOf, MapOf)) and len(value) > MAX_ITEMS:
        raise FrameError(f"{where} has {len(value)} entries (more than {MAX_ITEMS})")
    if isinstance(spec, ListOf):
        for i, item in enumerate(value):
            _fits(spec.item, item, f"{where}[{i}]")
    elif isinstance(spec, MapOf):
        for key, item in value.items():
            _fits(spec.value, item, f"{where}[{key[:40]!r}]")
    else:
        unknown = sorted(set(value) - set(spec.fields))
        if unknown:
            raise FrameError(f"{where} has a field {unknown[0][:40]!r} it does not define")
        for name, field_spec in spec.fields.items():
            if name not in value:
                if name in spec.optional:
                    continue
                raise FrameError(f"{where} lacks its field {name!r}")
            _fits(field_spec, value[name], f"{where}'s {name}")


def _a(word):
    """'an int', 'a str', "an 'answer'": the word with its article."""
    return f"{'an' if word.lstrip(chr(39))[:1] in 'aeiou' else 'a'} {word}"


def _name(spec):
    kinds = spec if isinstance(spec, tuple) else (spec,)
    return " or ".join("null" if k is type(None) else k.__name__ for k in kinds)


# -- answers: their dtypes and shapes, from the arguments -------------------------------------------------


def expected(name, args):
    """The answer name(*args) calls for (its entry's answer_form: an Array, TEXT, or a tuple of them), or None where the arguments do not say."""
    try:
        return FUNCTIONS[name].answer_form(*args)
    except (AttributeError, IndexError, KeyError, TypeError, ValueError):  # arguments an invariant made odd on purpose
        return None


def answer_problem(name, args, header):
    """Why the answer frame `header` to name(*args) is not what its arguments call for, read from its declarations alone; or None."""
    want = expected(name, args)
    if want is None:
        return None
    arrays = []  # the declared arrays that fit
    problem = _mismatch(want, header["value"], f"{name} output", arrays)
    needed = sum(math.prod(a["shape"]) * np.dtype(DTYPES[a["dtype"]]).itemsize for a in arrays)
    if problem is None and sum(header["buffers"]) != needed:  # so that no more bytes are read than the answer can use
        raise FrameError(f"the answer frame announces {sum(header['buffers'])} bytes of arrays, but its arrays need {needed}")
    return problem


def _mismatch(want, tree, what, arrays):
    if isinstance(want, Either):
        problems = []
        for form in want.forms:
            fits = []
            problem = _mismatch(form, tree, what, fits)
            if problem is None:
                arrays.extend(fits)
                return None
            problems.append(problem)
        return "; or ".join(problems)
    if isinstance(want, tuple):
        items = tree.get("__tuple__") if isinstance(tree, dict) else None
        if not isinstance(items, list) or len(items) != len(want):
            return f"type of {what}={_kind(tree)}, but should be a tuple of {len(want)} arrays"
        return next((p for i, (w, t) in enumerate(zip(want, items, strict=True)) if (p := _mismatch(w, t, f"{what}[{i}]", arrays))),
                    None)
    if want == TEXT:
        return None if isinstance(tree, str) else f"type of {what}={_kind(tree)}, but should be str"
    if isinstance(tree, (bool, int, float)) and want.shape is None:
        return None
    if not (isinstance(tree, dict) and "__array__" in tree):
        return f"type of {what}={_kind(tree)}, but should be an array"
    dtype, shape = tree.get("dtype"), tree.get("shape")
    if not isinstance(shape, list) or not all(isinstance(n, int) for n in shape) or dtype not in _KINDS:
        return None  # wire.decode words a malformed array
    if _KINDS[dtype] not in want.kinds:
        return f"dtype of {what}={dtype}, but should be {'a float dtype' if want.kinds == FLOATS else 'a real number dtype'}"
    if not want.fits_shape(shape):
        return f"shape of {what}={tuple(shape)}, but should be {'a scalar' if want.shape is None else want.shape_text()}"
    arrays.append(tree)
    return None


_KINDS = {name: np.dtype(code).kind for name, code in DTYPES.items()}


def _kind(tree):
    if isinstance(tree, dict) and len(tree) == 1:
        return {"__tuple__": "tuple", "__list__": "list", "__dict__": "dict", "__float__": "float"}.get(next(iter(tree)), "object")
    return "array" if isinstance(tree, dict) and "__array__" in tree else type(tree).__name__
