"""HTML reports and the lesson's figures: one self-contained file for a suite run or a gate batch.

    pytest --pyargs invariants --impl my_solution.py --invariants-json runs/{impl}-{dtype}.json --repro-dir runs/repro
    python -m htmlreport suite runs/*.json -o report.html       # invariants x implementations, a card per failure
    python -m htmlreport batch OUT -o class.html                # invariants-gate --batch DIR -o OUT: the class report
    python -m htmlreport figures -o examples/figures            # the lesson's figures, from the reference
    python -m htmlreport screenshot report.html -o report.png   # headless Chromium

The figures need matplotlib (pip install 'transformer-invariants[report]'); without it the reports
are written without them. docs/report.md describes the inputs and the sections.
"""

from __future__ import annotations

from htmlreport.inputs import InputError, load_batch, load_suite, split_failure
from htmlreport.render import render

__all__ = ["InputError", "load_batch", "load_suite", "render", "split_failure", "suite_html", "batch_html"]


def _figures(figures):
    """figures: None (draw them; none when matplotlib is missing), False (none), a folder of PNGs, or {name: PNG bytes}."""
    from htmlreport import figures as F

    if figures is False:
        return {}
    if figures is None:
        try:
            return F.draw()
        except ImportError:
            return {}
    if isinstance(figures, dict):
        return figures
    return F.read(figures)


def suite_html(paths, *, figures=None, max_repro_bytes=16384, generated=None):
    """The HTML report of one or more --invariants-json records."""
    return render(load_suite(paths, max_repro_bytes=max_repro_bytes), _figures(figures), generated=generated)


def batch_html(folder, *, figures=None, max_repro_bytes=16384, generated=None):
    """The HTML class report of a gate batch's output folder."""
    return render(load_batch(folder, max_repro_bytes=max_repro_bytes), _figures(figures), generated=generated)
