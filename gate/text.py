"""Text that came from a submission, made safe to show in a terminal, XML, Markdown or JSON, and in a CI job's log.

CI runners act on lines of a job's log: GitHub Actions on `::command::` at a line's start
(after spaces) and on the older `##[command]` anywhere in a line, Azure Pipelines on `##vso[`
and `##[` anywhere, GitLab on `section_start:`/`section_end:` markers. neutralise() breaks
each of them with a backslash, so that `cat summary.md` in a job runs nothing a student wrote.
"""

from __future__ import annotations

import re
import unicodedata

_ESCAPES = re.compile(r"\x1b\[[0-?]*[ -/]*[@-~]|\x1b\][^\x07\x1b]*(?:\x07|\x1b\\)?")
_HIDDEN = ("Cc", "Cf", "Cs", "Co")  # control, format (bidi overrides), surrogate, private use
_LINE_COMMANDS = re.compile(r"^([^\S\n]*)(::|section_start:|section_end:)", re.M)  # GitHub's (after any spaces), GitLab's sections
_ANYWHERE_COMMANDS = re.compile(r"##(vso)?\[", re.I)  # Azure's ##vso[ and ##[, GitHub's legacy ##[


def neutralise(text):
    """Workflow-command prefixes broken with a backslash: `\\::set-output`, `#\\#vso[`, `\\section_start:`."""
    text = _ANYWHERE_COMMANDS.sub(lambda m: "#\\#" + m.group(0)[2:], text)
    return _LINE_COMMANDS.sub(lambda m: m.group(1) + "\\" + m.group(2), text)


def neutralise_tree(value):
    """neutralise() every string in a JSON-ready value (keys included)."""
    if isinstance(value, str):
        return neutralise(value)
    if isinstance(value, dict):
        return {neutralise(str(k)): neutralise_tree(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [neutralise_tree(v) for v in value]
    return value


def printable(text):
    """Terminal escape sequences removed; control and invisible format characters shown as \\uXXXX; CI commands neutralised."""
    text = _ESCAPES.sub("", text)
    return neutralise("".join(ch if ch in "\n\t" or unicodedata.category(ch) not in _HIDDEN else f"\\u{ord(ch):04x}" for ch in text))


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
