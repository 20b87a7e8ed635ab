"""python -m invariants.htmlreport: suite, batch, figures, screenshot (see invariants/htmlreport/__init__.py)."""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path


def _report_options(p):
    p.add_argument("--max-repro-bytes", type=int, default=16384, metavar="N", help="embed repro scripts up to N bytes (default 16384)")
    p.add_argument("-o", "--output", required=True, metavar="FILE", help="the HTML file to write")


def _parser():
    parser = argparse.ArgumentParser(prog="python -m invariants.htmlreport", description="HTML reports and the lesson's figures.")
    sub = parser.add_subparsers(dest="command", required=True)
    suite = sub.add_parser("suite", help="a report of suite runs: the JSON records of pytest --invariants-json, one column each")
    suite.add_argument("records", nargs="+", metavar="RECORD.json")
    _report_options(suite)
    batch = sub.add_parser("batch", help="a class report of a gate batch: the -o folder of invariants-gate --batch")
    batch.add_argument("folder", metavar="OUT")
    _report_options(batch)
    figures = sub.add_parser("figures", help="write the lesson's figures as PNGs (needs matplotlib)")
    figures.add_argument("-o", "--output", default="examples/figures", metavar="DIR", help="default examples/figures")
    shot = sub.add_parser("screenshot", help="render an HTML file in headless Chromium and write a PNG of it")
    shot.add_argument("html", metavar="REPORT.html")
    shot.add_argument("-o", "--output", required=True, metavar="FILE.png")
    shot.add_argument("--width", type=int, default=1280)
    shot.add_argument("--height", type=int, default=900)
    shot.add_argument("--open-first-card", action="store_true", help="click the first failure card open and show it")
    examples = sub.add_parser("examples", help="regenerate the committed examples (figures, the two reports, screenshots); from a clone")
    examples.add_argument("--jobs", type=int, default=2, help="pytest-xdist workers per suite run (default 2)")
    examples.add_argument("--no-screenshots", action="store_true", help="skip the screenshots (no Chromium)")
    examples.add_argument("--keep", metavar="DIR", help="run the suite in DIR and keep its records; records already there are reused")
    return parser


def main(argv=None):
    args = _parser().parse_args(argv)
    if args.command == "figures":
        from invariants.htmlreport import figures

        try:
            paths = figures.write(args.output)
        except ImportError as exc:
            print(f"htmlreport: the figures need matplotlib ({exc}); pip install 'transformer-invariants[report]'", file=sys.stderr)
            return 2
        for path in paths:
            print(f"{path} ({path.stat().st_size:,} bytes)")
        return 0
    if args.command == "examples":
        from invariants.htmlreport.examples import regenerate

        for path in regenerate(jobs=args.jobs, screenshots=not args.no_screenshots, keep=args.keep,
                               log=lambda line: print(f"  {line}", file=sys.stderr)):
            print(f"{path} ({path.stat().st_size:,} bytes)")
        return 0
    if args.command == "screenshot":
        from invariants.htmlreport.browser import BrowserError, png_size, screenshot

        try:
            problems, timing = screenshot(args.html, args.output, width=args.width, height=args.height, open_first_card=args.open_first_card)
        except BrowserError as exc:
            print(f"htmlreport: {exc}", file=sys.stderr)
            return 2
        w, h = png_size(Path(args.output).read_bytes())
        print(f"{args.output}: {w} x {h}, {Path(args.output).stat().st_size:,} bytes; DOMContentLoaded at {timing['dom_content_loaded']:.0f} ms, "
              f"load event at {timing['load']:.0f} ms")
        for problem in problems:
            print(f"  problem: {problem}", file=sys.stderr)
        return 1 if problems else 0
    import invariants.htmlreport

    started = time.perf_counter()
    try:
        if args.command == "suite":
            text = invariants.htmlreport.suite_html(args.records, max_repro_bytes=args.max_repro_bytes)
        else:
            text = invariants.htmlreport.batch_html(args.folder, max_repro_bytes=args.max_repro_bytes)
    except invariants.htmlreport.InputError as exc:
        print(f"htmlreport: {exc}", file=sys.stderr)
        return 2
    out = Path(args.output)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(text, encoding="utf-8")
    print(f"{out}: {len(text.encode()):,} bytes in {time.perf_counter() - started:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
