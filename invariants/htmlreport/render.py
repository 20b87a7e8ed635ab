"""A Report as one self-contained HTML file: inline CSS and JS, nothing fetched.

Sections: a summary (per implementation; for a class, the verdicts, the score histogram, the pass
rate per invariant and the submissions with alike code), the matrix of invariants x implementations
(or submissions), showing the rows with a failure first (all of them at a click), and a card per
failure (the shrunk example, the problem, the hint, the repro, the full text; a native <details>
that opens on click). The lesson's figures are not in a report: they say nothing about its failures.
"""

from __future__ import annotations

import html
from datetime import datetime, timezone

from invariants.gate.reports import VERDICT_WORDS as VERDICT
from invariants.htmlreport.inputs import FAILING, pass_rates, score_histogram, score_text
from invariants.repro import portable

MARK = {"passed": "✓", "failed": "✗", "error": "!", "vacuous": "∅", "voided": "⊘", "missing": "–", "skipped": "○", "not_run": "·"}
WORD = {"passed": "passed", "failed": "failed", "error": "error", "vacuous": "vacuous", "voided": "voided", "missing": "missing",
        "skipped": "skipped", "not_run": "not run"}


def e(text):
    return html.escape(str(text), quote=True)


CSS = """
:root{--ok:#15803d;--ok-bg:#dcfce7;--bad:#b91c1c;--bad-bg:#fee2e2;--err:#b45309;--err-bg:#fef3c7;--skip:#6b7280;--skip-bg:#f3f4f6;--miss:#7c3aed;--miss-bg:#ede9fe;--ink:#111827;--muted:#6b7280;--line:#e5e7eb;--accent:#2563eb}
*{box-sizing:border-box}
body{margin:0;font:14px/1.45 system-ui,-apple-system,"Segoe UI",Roboto,"DejaVu Sans",sans-serif;color:var(--ink);background:#fff}
header{padding:20px 28px 12px;border-bottom:1px solid var(--line)}h1{margin:0 0 4px;font-size:22px}h2{font-size:17px;margin:26px 0 10px}
.sub{color:var(--muted);margin:0}main{padding:0 28px 40px;max-width:1400px}
nav{padding:8px 28px;border-bottom:1px solid var(--line);position:sticky;top:0;background:#fff;z-index:2}
nav a{margin-right:16px;color:var(--accent);text-decoration:none}
code,pre,.mono{font-family:"DejaVu Sans Mono",ui-monospace,Menlo,Consolas,monospace;font-size:12.5px}
pre{background:#f9fafb;border:1px solid var(--line);border-radius:6px;padding:8px 10px;
overflow:auto;white-space:pre-wrap;word-break:break-word;margin:6px 0}
.tiles{display:flex;flex-wrap:wrap;gap:12px}
.tile{border:1px solid var(--line);border-radius:8px;padding:10px 14px;min-width:220px;flex:1 1 240px}
.tile h3{margin:0 0 6px;font-size:14px}
.tile dl{display:grid;grid-template-columns:max-content 1fr;gap:2px 10px;margin:6px 0;font-size:12.5px}.tile dt{color:var(--muted)}
.tile dd{margin:0;word-break:break-word}.counts span{margin-right:10px}
.warn{background:var(--err-bg);border-left:4px solid var(--err);padding:6px 10px;margin:6px 0;font-size:13px}
.diag{font-size:12.5px;color:#374151;margin:6px 0 0;padding-left:16px}details.diag{padding-left:0}
details.diag summary{cursor:pointer;color:var(--accent)}.s-passed{color:var(--ok)}.s-failed{color:var(--bad)}.s-error{color:var(--err)}
.s-skipped,.s-not_run{color:var(--skip)}.s-missing,.s-vacuous,.s-voided{color:var(--miss)}
.badge{display:inline-block;border-radius:10px;padding:0 8px;font-size:12px;font-weight:600}.badge.s-passed{background:var(--ok-bg)}
.badge.s-failed{background:var(--bad-bg)}.badge.s-error{background:var(--err-bg)}
.badge.s-skipped,.badge.s-not_run{background:var(--skip-bg)}.badge.s-missing,.badge.s-vacuous,.badge.s-voided{background:var(--miss-bg)}
.badge.v-passed{background:var(--ok-bg);color:var(--ok)}.badge.v-failed{background:var(--bad-bg);color:var(--bad)}
.badge.v-not_gradable,.badge.v-gate_error{background:var(--err-bg);color:var(--err)}table{border-collapse:collapse}
th,td{padding:3px 8px;border-bottom:1px solid var(--line);text-align:left;vertical-align:top}
table.matrix th.col{font-weight:600;font-size:12px;max-width:9em;overflow-wrap:anywhere;white-space:normal;text-align:center;vertical-align:bottom}
table.matrix td.cell{text-align:center;font-weight:700;min-width:3.2em}
table.matrix td.cell a{text-decoration:none;color:inherit;display:block}table.matrix td.cell.s-passed{background:var(--ok-bg)}
table.matrix td.cell.s-failed{background:var(--bad-bg)}table.matrix td.cell.s-error{background:var(--err-bg)}
table.matrix td.cell.s-missing,table.matrix td.cell.s-vacuous,table.matrix td.cell.s-voided{background:var(--miss-bg)}
table.matrix td.cell.s-skipped,table.matrix td.cell.s-not_run{background:var(--skip-bg)}td.cell.absent{color:#d1d5db}
tr.group th{background:#f9fafb;font-size:13px;padding-top:8px}tr.group a{font-weight:400;font-size:12px;margin-left:8px;color:var(--accent)}
table.only-failing tr.row:not(.has-failure),table.only-failing tr.group:not(.has-failure){display:none}
.controls{margin:6px 0 10px;font-size:13px}
.controls button{font:inherit;margin-right:6px;padding:2px 10px;border:1px solid var(--line);border-radius:6px;background:#fff;cursor:pointer}
.legend span{margin-right:12px}
details.card{border:1px solid var(--line);border-left:4px solid var(--bad);border-radius:6px;margin:8px 0;background:#fff}
details.card.k-error{border-left-color:var(--err)}details.card.k-vacuous,details.card.k-voided{border-left-color:var(--miss)}details.card,section,h3{scroll-margin-top:48px}
details.card>summary{cursor:pointer;padding:8px 12px;list-style-position:inside}
details.card>summary .reason{color:#374151;font-size:12.5px;display:block;margin-left:18px}
details.card[open]>summary{border-bottom:1px solid var(--line)}.card-body{padding:8px 14px 12px}
.card-body h4{margin:10px 0 2px;font-size:13px}.hint{background:#eff6ff;border-left:4px solid var(--accent);padding:6px 10px}
table.example td:first-child{color:var(--muted);white-space:nowrap}table.example td{font-size:12.5px}
.bar{display:inline-block;width:160px;height:10px;background:var(--bad-bg);border-radius:5px;vertical-align:middle;margin-right:6px;overflow:hidden}
.bar span{display:block;height:100%;background:var(--ok)}.hidden-tag{font-size:11px;color:var(--miss);margin-left:6px}
footer{color:var(--muted);font-size:12px;padding:16px 28px;border-top:1px solid var(--line)}.nowrap{white-space:nowrap}
.grid2{display:grid;grid-template-columns:minmax(300px,420px) 1fr;gap:24px;align-items:start}
"""

JS = """
(function () {
  "use strict";
  var cards = Array.prototype.slice.call(document.querySelectorAll("details.card"));
  function openFromHash() {
    var id = decodeURIComponent(location.hash.slice(1));
    var target = id && document.getElementById(id);
    if (target && target.tagName === "DETAILS") { target.open = true; target.scrollIntoView({block: "start"}); }
  }
  window.addEventListener("hashchange", openFromHash);
  openFromHash();
  var only = document.getElementById("only-failing");
  if (only) {
    only.addEventListener("change", function () {
      document.getElementById("matrix").classList.toggle("only-failing", only.checked);
    });
  }
  document.querySelectorAll("button[data-cards]").forEach(function (button) {
    button.addEventListener("click", function () {
      var open = button.dataset.cards === "open";
      cards.forEach(function (card) { card.open = open; });
    });
  });
  document.querySelectorAll("button[data-download]").forEach(function (button) {
    button.addEventListener("click", function () {
      var text = document.getElementById(button.dataset.download).textContent;
      var link = document.createElement("a");
      link.href = URL.createObjectURL(new Blob([text], {type: "text/x-python"}));
      link.download = button.dataset.name;
      document.body.appendChild(link);
      link.click();
      link.remove();
    });
  });
  document.documentElement.dataset.ready = String(cards.length);  // for the browser test: the script ran to its end
})();
"""


def _status_counts(counts):
    return "".join(f'<span class="s-{e(s)}">{MARK.get(s, "?")} {n} {e(WORD.get(s, s))}</span>' for s, n in counts.items())


def _suite_summary(report):
    out = ['<section id="summary"><h2>Summary</h2><div class="tiles">']
    for c, col in enumerate(report.columns):
        facts = "".join(f"<dt>{e(k)}</dt><dd>{e(v)}</dd>" for k, v in col.facts)
        warning = f'<div class="warn">NOT RUN: {e(col.warning)}</div>' if col.warning else ""
        diag = report.diagnoses.get(c) or []
        named = [line for line in diag if line.startswith(("likely bug:", "non-finite"))]
        why = [line for line in diag if line not in named]
        diag_html = (f'<ul class="diag">{"".join(f"<li>{e(line)}</li>" for line in named)}</ul>' if named else "") + (
            f'<details class="diag"><summary>why</summary><ul>{"".join(f"<li>{e(line)}</li>" for line in why)}</ul></details>' if why else "")
        out.append(f'<div class="tile"><h3>{e(col.label)}</h3><div class="counts">{_status_counts(col.counts)}</div>{warning}'
                   f"<dl>{facts}</dl>{diag_html}</div>")
    out.append("</div></section>")
    return "".join(out)


def _histogram_svg(counts, edges):
    """The score histogram as inline SVG: one bar per bin of score / max score."""
    width, height, left, bottom = 420, 190, 34, 34
    top = max(counts) or 1
    bar = (width - left - 30) / len(counts)
    parts = [f'<svg id="score-histogram" width="{width}" height="{height}" role="img" '
             f'aria-label="Score histogram: submissions per tenth of the maximum score">']
    plot = height - bottom - 16
    for i, n in enumerate(counts):
        h = plot * n / top
        x = left + i * bar
        parts.append(f'<rect x="{x + 2:.1f}" y="{16 + plot - h:.1f}" width="{bar - 4:.1f}" height="{h:.1f}" fill="#2563eb">'
                     f"<title>{edges[i]:.0f}–{edges[i + 1]:.0f}%: {n}</title></rect>")
        if n:
            parts.append(f'<text x="{x + bar / 2:.1f}" y="{16 + plot - h - 3:.1f}" font-size="11" text-anchor="middle">{n}</text>')
    for i in range(0, len(edges), 2):
        parts.append(f'<text x="{left + i * bar:.1f}" y="{height - bottom + 14}" font-size="10" text-anchor="middle">{edges[i]:.0f}%</text>')
    parts.append(f'<line x1="{left}" y1="{16 + plot}" x2="{left + len(counts) * bar:.1f}" y2="{16 + plot}" stroke="#111827"/>')
    parts.append(f'<text x="{(width + left) / 2:.0f}" y="{height - 4}" font-size="11" text-anchor="middle">score, as a share of the maximum</text>')
    parts.append(f'<text x="10" y="{16 + plot / 2:.0f}" font-size="11" text-anchor="middle" transform="rotate(-90 10 {16 + plot / 2:.0f})">'
                 "submissions</text></svg>")
    return "".join(parts)


def _batch_summary(report):
    verdicts = {}
    for col in report.columns:
        verdicts[col.verdict] = verdicts.get(col.verdict, 0) + 1
    counts, edges = score_histogram(report)
    rows = "".join(
        f'<tr><td><a href="#sub-{c}">{e(col.label)}</a></td><td><span class="badge v-{e(col.verdict)}">{e(VERDICT.get(col.verdict, col.verdict))}'
        f'</span></td><td class="mono nowrap">{score_text(col.score, col.max_score)}</td><td>{e(col.reason)}</td></tr>'
        for c, col in enumerate(report.columns))
    rates = "".join(
        f'<tr><td><code>{e(name)}</code></td><td class="mono">{p} / {g}</td><td><span class="bar" title="{100 * p / g:.0f}%">'
        f'<span style="width:{100 * p / g:.1f}%"></span></span>{100 * p / g:.0f}%</td></tr>' if g else
        f"<tr><td><code>{e(name)}</code></td><td>0 / 0</td><td></td></tr>" for name, p, g in pass_rates(report))
    said = ", ".join(f"{n} {VERDICT.get(v, v)}" for v, n in verdicts.items())
    unscored = sum(col.score is None for col in report.columns)
    left_out = f'<p class="sub">{unscored} submission(s) without a score (not gradable, a gate error) are not in it.</p>' if unscored else ""
    return (f'<section id="summary"><h2>Class summary</h2><p>{len(report.columns)} submissions: {e(said)}. '
            "This report is for staff: it shows hidden invariants and their failures.</p>"
            f'<div class="grid2"><div><h3>Score histogram</h3>{_histogram_svg(counts, edges)}{left_out}</div>'
            f'<div><h3>Submissions</h3><table class="subs"><tr><th>Submission</th><th>Verdict</th><th>Score</th><th>Reason</th></tr>{rows}'
            f'</table></div></div><h3 id="pass-rates">Pass rate of each invariant</h3><p class="sub">Lowest first: where the class '
            f'struggles.</p><table class="rates"><tr><th>Invariant</th><th>Passed</th><th>Rate</th></tr>{rates}</table>'
            f"{_similar_pairs(report)}</section>")


def _similar_pairs(report):
    """The submissions with alike code, as class-summary.md lists them: both shares and the matching spans, each linked to its cards."""
    if report.pairs is None:
        return ""

    def who(name, column):
        return f'<a href="#sub-{column}">{e(name)}</a>' if column is not None else e(name)

    rows = "".join(f"<tr><td>{who(p.a, p.a_column)}</td><td>{who(p.b, p.b_column)}</td><td class=\"mono\">{100 * p.share_of_a:.0f}%</td>"
                   f'<td class="mono">{100 * p.share_of_b:.0f}%</td><td class="mono">{e(p.spans)}</td></tr>' for p in report.pairs)
    table = (f'<table class="pairs" id="pairs"><tr><th>A</th><th>B</th><th>Share of A</th><th>Share of B</th><th>Matching spans</th></tr>'
             f"{rows}</table>" if rows else "<p>No two submissions have alike code.</p>")
    return ('<h3 id="similar-pairs">Submissions with alike code (for review)</h3><p class="sub">Winnowing fingerprints '
            "(invariants/gate/similarity.py); a share is how much of one submission's code the other has too. Alike code is a reason for a person "
            f"to look, not a verdict.</p>{table}")


def _breakable(label):
    """A label that may wrap after its underscores and dots (file names are long and have no spaces)."""
    return e(label).replace("_", "_<wbr>").replace(".", ".<wbr>")


def _matrix(report):
    """The matrix; where a row has a failure, the rows without one are hidden until the filter is unticked."""
    heads = "".join(f'<th class="col" title="{e(col.title)}">{_breakable(col.label)}</th>' for col in report.columns)
    body, group, group_rows = [], None, []

    def close_group():
        if group is not None:
            failing = any("has-failure" in r for r in group_rows)
            body.append(f'<tr class="group{" has-failure" if failing else ""}"><th colspan="{len(report.columns) + 1}">{e(group)}</th></tr>')
            body.extend(group_rows)

    for name in report.rows:
        component = report.components.get(name, name.split(".")[0])
        if component != group:
            close_group()
            group, group_rows = component, []
        cells, failing = [], False
        for c in range(len(report.columns)):
            cell = report.cells.get((name, c))
            if cell is None:
                cells.append('<td class="cell absent" title="not in this run">·</td>')
                continue
            failing = failing or cell.status in FAILING
            tip = e(f"{WORD.get(cell.status, cell.status)}{' ' + cell.score if cell.score else ''}: {cell.reason}")
            mark = MARK.get(cell.status, "?")
            inner = f'<a href="#{cell.card}">{mark}</a>' if cell.card else mark
            cells.append(f'<td class="cell s-{e(cell.status)}" title="{tip}">{inner}</td>')
        short = name.split(".", 1)[1] if "." in name else name
        group_rows.append(f'<tr class="row{" has-failure" if failing else ""}"><td title="{e(report.statements.get(name, ""))}">'
                          f'<code>{e(short)}</code></td>{"".join(cells)}</tr>')
    close_group()
    present = {cell.status for cell in report.cells.values()}
    legend = "".join(f'<span class="s-{s}">{MARK[s]} {WORD[s]}</span>' for s in MARK if s in present or s in ("passed", "failed", "error"))
    what = "implementations" if report.kind == "suite" else "submissions"
    failing = len({name for (name, _), cell in report.cells.items() if cell.status in FAILING})
    only = " checked" if failing else ""
    return (f'<section id="matrix-section"><h2>Invariants × {what}</h2><div class="controls legend">{legend}</div>'
            f'<div class="controls"><label><input type="checkbox" id="only-failing"{only}> only the {failing} of {len(report.rows)} '
            "rows with a failure</label> (untick to show every invariant) · hover a cell for its reason; a failure's mark opens its card</div>"
            f'<table class="matrix{" only-failing" if failing else ""}" id="matrix"><tr><th>invariant</th>{heads}</tr>{"".join(body)}</table>'
            "</section>")


def _repro(card):
    parts = []
    if card.repro_path:  # by its name, and its script naming no folder of the machine that ran it (invariants.repro.portable)
        name = card.repro_path.replace("\\", "/").rsplit("/", 1)[-1]
        parts.append(f"<pre>python {e(name)} path/to/your_solution.py</pre>")
        source = portable(card.repro_source)
        if source:
            parts.append(f'<button type="button" data-download="{card.id}-repro" data-name="{e(name)}">download {e(name)}</button>'
                         f'<details><summary>the script</summary><pre id="{card.id}-repro">{e(source)}</pre></details>')
        parts.append('<p class="sub">Plain python (numpy, and torch for a torch implementation): it replays the failing calls on your '
                     "current code, prints each answer beside the one the suite saw and what the suite expected, and exits 1 while the "
                     "failure reproduces, 0 once the answers changed (then rerun the suite: the script does not re-check the property).</p>")
    if card.text.notes:
        parts.append(f"<p class=\"sub\">For maintainers, hypothesis's notes on this exact example (its replay):</p>"
                     f"<pre>{e(chr(10).join(card.text.notes))}</pre>")
    return f"<h4>Repro</h4>{''.join(parts)}" if parts else ""


def _card(report, card):
    col = report.columns[card.column]
    t = card.text
    example = "".join(f"<tr><td>{e(label)}</td><td><code>{e(text)}</code></td></tr>" for label, text in t.example)
    hidden = '<span class="hidden-tag">hidden from students</span>' if card.visibility and card.visibility != "visible" else ""
    return (f'<details class="card k-{e(card.status)}" id="{card.id}" data-invariant="{e(card.invariant)}">'
            f'<summary><span class="badge s-{e(card.status)}">{e(WORD.get(card.status, card.status))}</span> <code>{e(card.invariant)}</code> · '
            f'{e(col.label)}{hidden}<span class="reason">{e(card.reason)}</span></summary><div class="card-body">'
            f"<p>{e(card.statement)}</p>"
            + (f"<h4>Shrunk example</h4><table class=\"example\">{example}</table>" if example else "")
            + (f"<h4>What came back</h4><pre>{e(t.problem)}</pre>" if t.problem else "")
            + (f'<h4>Hint</h4><div class="hint">{e(card.hint)}</div>' if card.hint else "")
            + _repro(card)
            + (f"<details><summary>the whole report</summary><pre>{e(card.report)}</pre></details>" if card.report else "")
            + "</div></details>")


def _cards(report):
    if not report.cards:
        return '<section id="failures"><h2>Failures</h2><p>None: every invariant that ran held.</p></section>'
    out = [f'<section id="failures"><h2>Failures ({len(report.cards)})</h2><div class="controls">'
           '<button type="button" data-cards="open">expand all</button><button type="button" data-cards="close">collapse all</button>'
           "click a card to open it</div>"]
    for c, col in enumerate(report.columns):
        mine = [card for card in report.cards if card.column == c]
        if mine:
            out.append(f'<h3 id="sub-{c}">{e(col.label)} <span class="sub">({len(mine)})</span></h3>')
            out.extend(_card(report, card) for card in mine)
        elif report.kind == "batch":
            out.append(f'<h3 id="sub-{c}">{e(col.label)}</h3><p class="sub">{e(col.reason)}</p>')
    out.append("</section>")
    return "".join(out)


def render(report, *, generated=None):
    """The HTML text of report."""
    when = generated or datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    summary = _suite_summary(report) if report.kind == "suite" else _batch_summary(report)
    nav = ['<a href="#summary">Summary</a>', '<a href="#matrix-section">Matrix</a>', f'<a href="#failures">Failures ({len(report.cards)})</a>']
    if report.kind == "batch":
        nav[1:1] = ['<a href="#pass-rates">Pass rates</a>'] + (['<a href="#similar-pairs">Alike code</a>'] if report.pairs is not None else [])
    sources = ", ".join(report.sources)
    return (f'<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8"><meta name="viewport" content="width=device-width, initial-scale=1">'
            f"<title>{e(report.title)}: {e(report.subtitle)}</title><style>{CSS}</style></head><body>"
            f'<header><h1>{e(report.title)}</h1><p class="sub">{e(report.subtitle)}</p></header><nav>{"".join(nav)}</nav><main>'
            f"{summary}{_matrix(report)}{_cards(report)}</main>"
            f"<footer>transformer-invariants htmlreport · from {e(sources)} · generated {e(when)}</footer>"
            f"<script>{JS}</script></body></html>\n")
