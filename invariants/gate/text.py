"""Text that came from a submission, made safe for where it lands: a terminal and a CI job's log, XML, Markdown.

One function per format, applied where the text lands: printable() for a terminal, xml_text()
for XML 1.0, md_cell() and md_code() for Markdown (fenced blocks are reports._fenced), and
neutralise() over every report as a whole. (HTML is htmlreport's html.escape; Python source is
invariants.repro's repr.)

CI runners act on lines of a job's log: GitHub Actions on `::command::` at a line's start
(after spaces) and on the older `##[command]` anywhere in a line, Azure Pipelines on `##vso[`
and `##[` anywhere, TeamCity on `##teamcity[`, GitLab on `section_start:`/`section_end:`
markers (after its own escape codes, so anywhere). neutralise() breaks each of them with a
backslash, so that `cat summary.md` in a job runs nothing a student wrote; twice changes
nothing more. A line starts after any character some log viewer or runner takes for a line
break (CR, VT, FF, NEL, U+2028, U+2029, ...), not only after LF.

Where submission text is read, not only where it lands: quoted() caps every value quoted from a submission
(QUOTED_CHARS, its head and tail kept, the cut counted), and csv_cell() keeps a spreadsheet from reading a
cell as a formula (OWASP's CSV injection guidance). In Markdown, md_cell() also shows `$` as an entity (GitHub
renders $...$ as math) and breaks every @mention (a mention notifies whoever it names).
"""

from __future__ import annotations

import re
import unicodedata

_ESCAPES = re.compile(r"\x1b\[[0-?]*[ -/]*[@-~]|\x1b\][^\x07\x1b]*(?:\x07|\x1b\\)?")
_HIDDEN = ("Cc", "Cf", "Cs", "Co", "Zl", "Zp")  # control, format (bidi overrides), surrogate, private use, line and paragraph separators
_BREAKS = "\n\r\v\f\x1c\x1d\x1e\x85\u2028\u2029"  # what str.splitlines() splits on: each starts a line for some viewer
_LINE_COMMANDS = re.compile(rf"(?:\A|(?<=[{_BREAKS}]))([\s\u200b-\u200d\u2060\ufeff]*)(::)")  # GitHub's
_ANYWHERE_COMMANDS = re.compile(r"##(vso|teamcity)?\[", re.I)  # Azure's ##vso[ and ##[, GitHub's legacy ##[, TeamCity's ##teamcity[
_SECTIONS = re.compile(r"section_(start|end):", re.I)  # GitLab's
_AUTOLINKS = re.compile(r"(?=://)|(?<=www)(?=\.)", re.I)  # where GFM's bare links start: an escape there breaks them
_NOT_XML = re.compile("[^\t\n\r\x20-\ud7ff\ue000-\ufffd\U00010000-\U0010ffff]")  # outside XML 1.0's Char production
QUOTED_CHARS = 4000  # the most of one value a submission wrote (an answer, an exception's message) a report quotes
_FORMULA_STARTS = "=+-@\t\r\n\uff1d\uff0b\uff0d\uff20"  # what a spreadsheet may read as a formula's start (and their full-width forms)


def neutralise(text):
    """Workflow-command prefixes broken with a backslash: `\\::set-output`, `#\\#vso[`, `#\\#teamcity[`, `section\\_start:`."""
    text = _ANYWHERE_COMMANDS.sub(lambda m: "#\\#" + m.group(0)[2:], text)
    text = _SECTIONS.sub(lambda m: m.group(0)[:7] + "\\" + m.group(0)[7:], text)
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


def _shown(ch):
    return ch if ch in "\n\t" or unicodedata.category(ch) not in _HIDDEN else f"\\u{ord(ch):04x}"


def printable(text):
    """Terminal escape sequences removed; control, invisible format and line-separator characters shown as \\uXXXX; CI commands neutralised."""
    return neutralise("".join(map(_shown, _ESCAPES.sub("", text))))


def xml_text(text):
    """Every character XML 1.0 does not allow (C0 controls but tab, LF and CR; surrogates; U+FFFE, U+FFFF) shown as \\uXXXX."""
    return _NOT_XML.sub(lambda m: f"\\u{ord(m.group(0)):04x}", text)


def md_cell(text):
    """Inline Markdown that renders as the text itself: one line, no link (bare URLs too), image, HTML, emphasis, code span, cell break,
    math or mention."""
    text = " ".join(printable(str(text)).split())
    for raw, escaped in (("\\", "\\\\"), ("&", "&amp;"), ("<", "&lt;"), (">", "&gt;"), ("|", "\\|"), ("`", "\\`"),
                         ("*", "\\*"), ("_", "\\_"), ("[", "\\["), ("]", "\\]"), ("!", "\\!"), ("~", "\\~"), ("#", "\\#"),
                         ("$", "&#36;"), ("@", "@&#8288;")):  # no $ opens math; a word joiner after @ leaves no name a mention reads
        text = text.replace(raw, escaped)
    return _AUTOLINKS.sub("\\\\", text)  # https\:// and www\. render as written, as text


def md_code(text, *, cell=False):
    """A Markdown code span holding the text as written, on one line: a fence of backticks longer than any run inside it.

    In a table cell (cell=True) its pipes are escaped: GFM splits cells before it reads code spans, and drops the backslash.
    """
    text = " ".join(printable(str(text)).split())
    text = text.replace("|", "\\|") if cell else text
    fence = "`" * (max(map(len, re.findall("`+", text)), default=0) + 1)
    pad = " " if not text or text[0] == "`" or text[-1] == "`" else ""  # CommonMark strips one space each side, kept off a backtick
    return f"{fence}{pad}{text}{pad}{fence}"


def clean_output(data, cap):
    """Captured bytes -> printable text of at most about `cap` bytes: the head and the tail, the middle counted."""
    if len(data) <= cap:
        return printable(data.decode("utf-8", "replace"))
    half = cap // 2
    return cut_output(data[:half], data[-half:], len(data) - 2 * half)


def cut_output(head, tail, omitted):
    """Printable text of captured bytes of which only the `head` and the `tail` were kept, the `omitted` bytes between them counted."""
    shown = [printable(part.decode("utf-8", "replace")) for part in (head, tail)]
    return f"{shown[0]}\n[... {omitted} bytes not shown ...]\n{shown[1]}"


def quoted(text, limit=QUOTED_CHARS):
    """Text a submission wrote, as a report may quote it: at most `limit` characters, its head and tail, the cut counted."""
    text = str(text)
    if len(text) <= limit:
        return text
    half = limit // 2
    return f"{text[:half]}[... {len(text) - 2 * half} characters cut ...]{text[-half:]}"


def csv_cell(value):
    """A CSV cell no spreadsheet reads as a formula: text whose first character after spaces is = + - @, a tab or a line break
    gets a leading '."""
    text = str(value)
    start = text.lstrip(" ")[:1]
    return f"'{text}" if start and start in _FORMULA_STARTS else text


def one_line(text, limit=300):
    """The first line of text, printable and at most `limit` characters."""
    text = printable(str(text)).strip()
    line = text.splitlines()[0] if text else ""
    return line if len(line) <= limit else line[: limit - 1] + "…"
