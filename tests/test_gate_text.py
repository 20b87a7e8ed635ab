"""invariants.gate.text: one escape per format, each checked against what that format's reader does with every hostile character."""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET
from xml.sax.saxutils import escape, quoteattr

import pytest

from invariants.gate.text import md_cell, md_code, neutralise, printable, xml_text

BREAKS = ["\n", "\r", "\r\n", "\x0b", "\x0c", "\x1c", "\x1d", "\x1e", "\x85", "\u2028", "\u2029"]  # str.splitlines()'s
COMMANDS = ["::set-output name=x::y", "  ::error::indented", "\u00a0\u200b::warning::after a no-break and a zero-width space",
            "section_start:1:x", "##vso[task.complete]", "##[error]x", "##teamcity[buildStatus status='SUCCESS']", "##TeamCity[x]"]


@pytest.mark.parametrize("sep", BREAKS, ids=[f"U+{ord(s[-1]):04X}" for s in BREAKS])
def test_no_line_a_viewer_splits_off_starts_a_ci_command(sep):
    text = neutralise("student said" + sep + sep.join(COMMANDS))
    acted = [line for line in text.splitlines() if re.match(r"[\s\u200b\ufeff]*(::|section_)", line) or re.search(r"##(vso|teamcity)?\[", line, re.I)]
    assert not acted, acted


def test_printable_shows_line_separators_and_controls_as_escapes():
    assert printable("a\u2028b\u2029c\x85d\x0be\x1b[31mf") == "a\\u2028b\\u2029c\\u0085d\\u000bef"


def test_xml_text_leaves_only_what_xml_1_0_allows():
    hostile = "".join(map(chr, range(0x20))) + "\ud800\udfff\ufffe\uffff\ud7ff\ue000\U0001f600"
    shown = xml_text(hostile)
    assert shown.startswith("\\u0000") and "\\u0008\t\n\\u000b\\u000c\r\\u000e" in shown
    assert shown.endswith("\\ud800\\udfff\\ufffe\\uffff\ud7ff\ue000\U0001f600")
    ET.fromstring(f"<a b={quoteattr(shown)}>{escape(shown)}</a>")


def test_markdown_cells_render_as_their_text_with_no_link_or_markup():
    cell = md_cell("see https://evil.example, WWW.evil.example and [x](y) <b>| *z* ![i](j) # h section_start:1:x")
    assert cell == ("see https\\://evil.example, WWW\\.evil.example and \\[x\\](y) &lt;b&gt;\\| \\*z\\* \\!\\[i\\](j) \\# h "
                    "section\\\\\\_start:1:x")


def test_neutralise_is_the_same_twice():
    once = neutralise("\n".join(COMMANDS))
    assert neutralise(once) == once


def test_a_code_span_outgrows_every_backtick_run_and_stays_on_one_line():
    assert md_code("a``b`c\n\nd") == "```a``b`c d```" and md_code("`a") == "`` `a ``"
    assert md_code("x|y") == "`x|y`" and md_code("x|y", cell=True) == "`x\\|y`"  # GFM drops the backslash in a cell
