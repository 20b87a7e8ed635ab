"""Text that came from a submission, made safe to show in a terminal, XML, Markdown or JSON."""

from __future__ import annotations

import re
import unicodedata

_ESCAPES = re.compile(r"\x1b\[[0-?]*[ -/]*[@-~]|\x1b\][^\x07\x1b]*(?:\x07|\x1b\\)?")
_HIDDEN = ("Cc", "Cf", "Cs", "Co")  # control, format (bidi overrides), surrogate, private use


def printable(text):
    """Terminal escape sequences removed; control and invisible format characters shown as \\uXXXX."""
    text = _ESCAPES.sub("", text)
    return "".join(ch if ch in "\n\t" or unicodedata.category(ch) not in _HIDDEN else f"\\u{ord(ch):04x}" for ch in text)


def clean_output(data, cap):
    """Captured bytes -> printable text of at most about `cap` bytes: the head and the tail, the middle counted."""
    if len(data) <= cap:
        return printable(data.decode("utf-8", "replace"))
    half = cap // 2
    omitted = len(data) - 2 * half
    head = printable(data[:half].decode("utf-8", "replace"))
    tail = printable(data[-half:].decode("utf-8", "replace"))
    return f"{head}\n[... {omitted} bytes not shown ...]\n{tail}"


def one_line(text, limit=300):
    """The first line of text, printable and at most `limit` characters."""
    text = printable(str(text)).strip()
    line = text.splitlines()[0] if text else ""
    return line if len(line) <= limit else line[: limit - 1] + "…"
