"""The gate's wire format: a JSON header and raw array bytes over a pipe; never pickle.

One message is a frame:

    u32 big-endian header length | header (UTF-8 JSON) | buffer 0 | buffer 1 | ...

The header's "buffers" lists each buffer's byte length. Values in the header are JSON
scalars and strings, and these tagged objects:

    {"__array__": i, "dtype": "float64", "shape": [2, 3]}   buffer i, little-endian, C order
    {"__tuple__": [...]}   {"__list__": [...]}   {"__dict__": {"key": ...}}   {"__float__": "nan"}

Only plain dtypes cross (DTYPES below); the worker turns bfloat16 into float32 (exact) and
other integers into int64 before answering. A header is at most MAX_HEADER_BYTES, nested at most
MAX_HEADER_DEPTH deep (counted on its bytes before json parses them), and can be read apart from
its buffers (receive_header), so that the parent holds it to invariants.gate.frames' schema first. Standard library and numpy only: the worker
imports this module before it loads a submission.
"""

from __future__ import annotations

import json
import math
import os
import re
import select
import struct
import time

import numpy as np

DTYPES = {"float16": "<f2", "float32": "<f4", "float64": "<f8", "int32": "<i4", "int64": "<i8", "bool": "|b1"}
MAX_HEADER_BYTES = 4 << 20
MAX_DEPTH = 12
MAX_NODES = 100_000
MAX_DIMS = 8
MAX_HEADER_DEPTH = 2 * MAX_DEPTH + 8  # a value's levels (two brackets each: {"__list__": [...]}) under a frame's own few
_LENGTH = struct.Struct(">I")
_STRING = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"')  # a JSON string, escapes included: its brackets are text


class WireError(Exception):
    """A frame or a value that breaks the wire format; the message says what."""


class PipeClosed(WireError):
    """The other end closed the pipe (the worker exited or was killed)."""


class WireTimeout(WireError):
    """The other end did not answer before the deadline."""


# -- values <-> (header tree, buffers) ------------------------------------------------------


def encode(value):
    """(tree, buffers): a JSON-ready tree with array placeholders, and the arrays' bytes."""
    buffers = []

    def walk(v, depth):
        if depth > MAX_DEPTH:
            raise WireError(f"value nested deeper than {MAX_DEPTH} levels")
        if v is None or isinstance(v, (bool, str)):
            return v
        if isinstance(v, int):
            return v
        if isinstance(v, float):
            return v if math.isfinite(v) else {"__float__": repr(v)}
        if isinstance(v, np.generic):
            return walk(np.asarray(v), depth)
        if isinstance(v, np.ndarray):
            name = v.dtype.name
            if name not in DTYPES:
                raise WireError(f"an array of dtype {name} cannot cross the wire (allowed: {', '.join(DTYPES)})")
            data = np.ascontiguousarray(v, dtype=np.dtype(DTYPES[name])).tobytes()
            buffers.append(data)
            return {"__array__": len(buffers) - 1, "dtype": name, "shape": list(v.shape)}
        if isinstance(v, tuple):
            return {"__tuple__": [walk(x, depth + 1) for x in v]}
        if isinstance(v, list):
            return {"__list__": [walk(x, depth + 1) for x in v]}
        if isinstance(v, dict):
            if not all(isinstance(k, str) for k in v):
                raise WireError("a dict with a key that is not a string cannot cross the wire")
            return {"__dict__": {k: walk(x, depth + 1) for k, x in v.items()}}
        raise WireError(f"a {type(v).__module__}.{type(v).__qualname__} cannot cross the wire")

    return walk(value, 0), buffers


def decode(tree, buffers):
    """The value a tree and its buffers stand for; arrays are fresh, writable numpy arrays.

    Validates everything (the sender may be hostile): tags, dtypes, shapes against byte counts,
    depth and size; anything else is a WireError.
    """
    nodes = 0
    used = set()

    def walk(t, depth):
        nonlocal nodes
        nodes += 1
        if nodes > MAX_NODES or depth > MAX_DEPTH:
            raise WireError(f"value larger than {MAX_NODES} nodes or deeper than {MAX_DEPTH} levels")
        if t is None or isinstance(t, (bool, int, float, str)):
            return t
        if isinstance(t, list):
            raise WireError("an untagged list in a value")
        if not isinstance(t, dict) or len(t) not in (1, 3):
            raise WireError("a malformed value")
        if "__array__" in t:
            return _array(t, buffers, used)
        (tag, body), = t.items()
        if tag == "__float__" and body in ("nan", "inf", "-inf"):
            return float(body)
        if tag in ("__tuple__", "__list__") and isinstance(body, list):
            items = [walk(x, depth + 1) for x in body]
            return tuple(items) if tag == "__tuple__" else items
        if tag == "__dict__" and isinstance(body, dict):
            return {str(k): walk(x, depth + 1) for k, x in body.items()}
        raise WireError(f"unknown tag {str(tag)[:40]!r} in a value")

    return walk(tree, 0)


def _array(t, buffers, used):
    index, dtype, shape = t.get("__array__"), t.get("dtype"), t.get("shape")
    if dtype not in DTYPES:
        raise WireError(f"array dtype {str(dtype)[:40]!r} is not one of {', '.join(DTYPES)}")
    if not isinstance(index, int) or isinstance(index, bool) or not 0 <= index < len(buffers) or index in used:
        raise WireError("an array placeholder points at no buffer, or at one already used")
    if not isinstance(shape, list) or len(shape) > MAX_DIMS or not all(isinstance(n, int) and not isinstance(n, bool) and n >= 0 for n in shape):
        raise WireError(f"array shape {str(shape)[:60]} is not a list of at most {MAX_DIMS} non-negative ints")
    used.add(index)
    np_dtype = np.dtype(DTYPES[dtype])
    expected = math.prod(shape) * np_dtype.itemsize
    if expected != len(buffers[index]):
        raise WireError(f"array of shape {tuple(shape)} and dtype {dtype} needs {expected} bytes, got {len(buffers[index])}")
    return np.frombuffer(buffers[index], dtype=np_dtype).reshape(shape).astype(np.dtype(dtype), copy=True)


# -- frames over file descriptors ------------------------------------------------------------


def pack(header, buffers=()):
    """The bytes of one frame: header (a JSON-ready dict) plus its buffers."""
    header = dict(header, buffers=[len(b) for b in buffers])
    head = json.dumps(header, separators=(",", ":"), allow_nan=False).encode()
    return b"".join([_LENGTH.pack(len(head)), head, *buffers])


def send(fd, header, buffers=(), deadline=None):
    """Write one frame to fd; with a deadline (time.monotonic()), a non-blocking fd and a WireTimeout."""
    data = memoryview(pack(header, buffers))
    while data:
        if deadline is not None:
            _wait(fd, deadline, write=True)
        try:
            written = os.write(fd, data)
        except BlockingIOError:
            continue
        except (BrokenPipeError, OSError) as exc:
            raise PipeClosed(f"the pipe closed while sending ({exc.strerror or exc})") from None
        data = data[written:]


def receive(fd, *, max_bytes, deadline=None):
    """Read one frame from fd: (header dict, list of bytearray buffers). Limits every size."""
    header = receive_header(fd, deadline=deadline)
    return header, receive_buffers(fd, header, max_bytes=max_bytes, deadline=deadline)


def receive_header(fd, *, deadline=None):
    """Read one frame's header from fd, leaving its buffers unread: a JSON object within MAX_HEADER_BYTES and MAX_HEADER_DEPTH."""
    (length,) = _LENGTH.unpack(_read_exactly(fd, _LENGTH.size, deadline))
    if length > MAX_HEADER_BYTES:
        raise WireError(f"a header of {length} bytes (more than {MAX_HEADER_BYTES})")
    raw = bytes(_read_exactly(fd, length, deadline))
    brackets = raw.count(b"[") + raw.count(b"{")  # a header nests no deeper than it has brackets: most skip the count
    if brackets > MAX_HEADER_DEPTH and (depth := nesting(raw)) > MAX_HEADER_DEPTH:
        raise WireError(f"a header nested {depth} levels deep (more than {MAX_HEADER_DEPTH})")
    try:
        header = json.loads(raw.decode("utf-8"), parse_constant=_no_constants)
    except (UnicodeDecodeError, ValueError) as exc:
        raise WireError(f"a header that is not JSON ({_first_line(exc)})") from None
    sizes = header.get("buffers") if isinstance(header, dict) else None
    if not isinstance(sizes, list) or not all(isinstance(n, int) and not isinstance(n, bool) and n >= 0 for n in sizes):
        raise WireError("a header without a valid list of buffer sizes")
    return header


def receive_buffers(fd, header, *, max_bytes, deadline=None):
    """Read the buffers that `header` (from receive_header) announces, at most max_bytes in all."""
    sizes = header["buffers"]
    if sum(sizes) > max_bytes:
        raise WireError(f"a message of {sum(sizes)} bytes of arrays (the limit is {max_bytes})")
    return [_read_exactly(fd, n, deadline) for n in sizes]


def discard_buffers(fd, header, *, max_bytes, deadline=None):
    """Read past the buffers that `header` announces without keeping them (1 MiB at a time), so the next frame can be read."""
    total = sum(header["buffers"])
    if total > max_bytes:
        raise WireError(f"a message of {total} bytes of arrays (the limit is {max_bytes})")
    while total:
        total -= len(_read_exactly(fd, min(total, 1 << 20), deadline))


def nesting(raw):
    """How deep `[` and `{` nest in JSON text `raw` (bytes), outside strings; counted without recursion."""
    bare = np.frombuffer(_STRING.sub(b'""', raw), dtype=np.uint8)
    steps = ((bare == ord("[")) | (bare == ord("{"))).astype(np.int32) - ((bare == ord("]")) | (bare == ord("}")))
    return int(np.cumsum(steps).max(initial=0))


def _first_line(exc, limit=120):
    """The first line of an exception's text, cut to `limit` characters."""
    text = str(exc).strip().splitlines()
    return (text[0] if text else type(exc).__name__)[:limit]


def _no_constants(name):
    raise ValueError(f"{name} is not JSON")


def _read_exactly(fd, n, deadline):
    buffer = bytearray(n)
    view = memoryview(buffer)
    got = 0
    while got < n:
        if deadline is not None:
            _wait(fd, deadline, write=False)
        try:
            chunk = os.readv(fd, [view[got:]])
        except BlockingIOError:
            continue
        except OSError as exc:
            raise PipeClosed(f"the pipe failed while receiving ({exc.strerror or exc})") from None
        if chunk == 0:
            raise PipeClosed("the pipe closed")
        got += chunk
    return buffer


def _wait(fd, deadline, *, write):
    remaining = deadline - time.monotonic()
    if remaining <= 0:
        raise WireTimeout("deadline passed")
    ready = select.select([], [fd], [], remaining) if write else select.select([fd], [], [], remaining)
    if not any(ready):
        raise WireTimeout("deadline passed")
