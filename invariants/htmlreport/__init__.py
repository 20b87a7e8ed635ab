"""HTML reports and the lesson's figures: one self-contained file for a suite run or a gate batch.

    pytest --pyargs invariants --impl my_solution.py --invariants-json runs/{impl}-{dtype}.json --repro-dir runs/repro
    python -m invariants.htmlreport suite runs/*.json -o report.html       # invariants x implementations (failing rows first), a card per failure
    python -m invariants.htmlreport batch OUT -o class.html                # invariants-gate --batch DIR -o OUT: the class report
    python -m invariants.htmlreport figures -o examples/figures            # the lesson's figures, from the reference
    python -m invariants.htmlreport screenshot report.html -o report.png   # headless Chromium

The lesson's figures need matplotlib (pip install 'transformer-invariants[report]'); the reports
carry none (a figure in a report would be about the lesson, not its failures). docs/report.md
describes the inputs and the sections.
"""

from __future__ import annotations

from invariants.htmlreport.inputs import InputError, failure_parts, load_batch, load_suite
from invariants.htmlreport.render import render

__all__ = ["InputError", "failure_parts", "load_batch", "load_suite", "render", "suite_html", "batch_html"]


def suite_html(paths, *, max_repro_bytes=16384, generated=None):
    """The HTML report of one or more --invariants-json records."""
    return render(load_suite(paths, max_repro_bytes=max_repro_bytes), generated=generated)


def batch_html(folder, *, max_repro_bytes=16384, generated=None):
    """The HTML class report of a gate batch's output folder."""
    return render(load_batch(folder, max_repro_bytes=max_repro_bytes), generated=generated)
