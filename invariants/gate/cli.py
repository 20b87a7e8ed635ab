"""invariants-gate: grade a submission (or a folder of them) against an assignment file.

    invariants-gate student.zip -a p01 -o reports/
    invariants-gate --batch submissions/ -a p01 -o reports/ --jobs 2
    invariants-gate --batch submissions/ -a p01 -o reports/ --shard 3/8   # one CI job of eight
    invariants-gate --merge shards/ -o summary/                                              # the class summary of all eight
    invariants-gate my_code/ -a p01 --visible-only      # a student's preview

Exit codes: 0 passed, 1 failed, 2 usage or assignment-file error, 3 not gradable, 4 gate error.
A batch (and a merge) exits 0 when every submission got a verdict, 4 when the gate failed on any.
Standard error shows the progress (the invariant running, or the submissions graded, and the time
left): on a terminal one line rewritten in place; in a log (not a terminal, or CI set) whole lines, the
first at once and then at most one every LOG_EVERY_SECONDS; nothing with -q.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

from invariants.gate import result as R
from invariants.pipes import quiet_when_reader_leaves, reader_gone, reader_may_leave

FORMATS = ("json", "junit", "gradescope", "markdown")
LOG_EVERY_SECONDS = 10  # in a log, a progress line at most this often: a grading that runs for minutes still says where it is


def _parser():
    p = argparse.ArgumentParser(
        prog="invariants-gate",
        description="Grade transformer implementations against an assignment's invariants; the submission runs in a confined worker.",
        epilog="Exit codes: 0 passed, 1 failed, 2 usage or assignment error, 3 not gradable, 4 gate error. "
               "A batch exits 0 when every submission got a verdict, 4 if the gate failed on any. See docs/gate.md.",
    )
    p.add_argument("submissions", nargs="*", help="a .py file, a folder (package or modules) or a .zip; with --batch, folders of them")
    p.add_argument("-a", "--assignment", help="assignment file (TOML, or a pyproject.toml with [tool.invariants-gate]), "
                                              "or a shipped one by name (p01: invariants/gate/assignments/p01.toml)")
    p.add_argument("-o", "--out", default="gate-reports", help="folder for the reports (default: gate-reports)")
    p.add_argument("--formats", default=",".join(FORMATS), help=f"comma-separated report formats (default: all of {','.join(FORMATS)})")
    p.add_argument("--batch", action="store_true", help="each SUBMISSION is a folder holding many submissions")
    p.add_argument("-j", "--jobs", type=int, default=1, help="submissions graded in parallel in a batch (default 1)")
    p.add_argument("--shard", metavar="K/N", help="with --batch: grade only the K-th of N deterministic shares (round robin over the "
                                                  "sorted folder); merge the shards' reports with --merge")
    p.add_argument("--merge", nargs="+", metavar="DIR", help="build the class summary from the reports under DIR... (shards' "
                                                             "outputs) into -o; no grading")
    p.add_argument("--visible-only", action="store_true", help="run only the visible invariants: what a student previews locally")
    p.add_argument("--show-hidden", action="store_true", help="name hidden invariants in the terminal, Markdown and JUnit reports")
    p.add_argument("--seed", type=int, help="a fixed hypothesis seed (to reproduce a report's seed; every submission gets the same inputs)")
    p.add_argument("--secret-env", help="environment variable holding the course secret for per-submission seeds (default: the "
                                        "assignment's [seed], else the secret the gate keeps, made on first use: docs/gate.md, Seeds)")
    p.add_argument("--secret-file", help="file holding the course secret for per-submission seeds")
    p.add_argument("--max-examples", type=int, help="override the assignment's examples per invariant")
    p.add_argument("--entry", help="module to load inside a folder or zip submission (default: __init__.py, submission.py, adapter.py)")
    p.add_argument("--scratch-root", help="where the per-submission scratch folders go (default: the system temp folder)")
    p.add_argument("--keep-scratch", action="store_true", help="keep the scratch folder (captured output, the unpacked submission)")
    p.add_argument("-q", "--quiet", action="store_true", help="print only the verdict line")
    p.add_argument("--list", action="store_true", help="list the registered invariants (or the assignment's selection) and exit")
    return p


def _list(options):
    from invariants.gate.batch import load
    from invariants.registry import all_invariants

    if options.get("assignment"):
        assignment = load(options, {})
        for s in assignment.selected:
            print(f"{s.name:<55} {s.points:>4g} pt  {s.visibility}")
        for name, reason in assignment.excluded:
            print(f"{name:<55} excluded: {reason}")
        return 0
    for inv in all_invariants():
        note = "  [in-process only: not gradable by the gate]" if inv.in_process else ""
        print(f"{inv.name:<55} {inv.statement}{note}")
    return 0


@quiet_when_reader_leaves
def main(argv=None):
    args = _parser().parse_args(argv)
    formats = tuple(f.strip() for f in args.formats.split(",") if f.strip())
    unknown = [f for f in formats if f not in FORMATS]
    if unknown:
        print(f"invariants-gate: --formats {unknown[0]!r} is not one of {', '.join(FORMATS)}", file=sys.stderr)
        return R.USAGE_ERROR_EXIT
    options = {"assignment": args.assignment, "formats": formats, "seed": args.seed, "max_examples": args.max_examples, "entry": args.entry,
               "visible_only": args.visible_only, "show_hidden": args.show_hidden, "scratch_root": args.scratch_root,
               "keep_scratch": args.keep_scratch, "hidden": [str(Path(p).resolve()) for p in args.submissions]}
    from invariants.gate.batch import load
    from invariants.gate.config import ConfigError
    from invariants.gate.secret import SecretError, course_secret

    try:
        if args.list:
            return _list(options)
        if args.merge:
            return _merge(args)
        shard = None
        if args.shard:
            from invariants.gate.batch import parse_shard

            try:
                shard = parse_shard(args.shard)
            except ValueError as exc:
                print(f"invariants-gate: {exc}", file=sys.stderr)
                return R.USAGE_ERROR_EXIT
            if not args.batch:
                print("invariants-gate: --shard splits a --batch: add --batch FOLDER", file=sys.stderr)
                return R.USAGE_ERROR_EXIT
        if not args.assignment:
            print("invariants-gate: pass the assignment file with -a/--assignment (a file, or a shipped one by name: -a p01)", file=sys.stderr)
            return R.USAGE_ERROR_EXIT
        if not args.submissions:
            print("invariants-gate: name a submission (a .py file, a folder or a .zip)", file=sys.stderr)
            return R.USAGE_ERROR_EXIT
        if args.jobs < 1:
            print(f"invariants-gate: --jobs {args.jobs} must be at least 1", file=sys.stderr)
            return R.USAGE_ERROR_EXIT
        state = {}
        assignment = load(options, state)
        if not assignment.selected:
            print(f"invariants-gate: {assignment.path} selects no invariant{' that is visible' if args.visible_only else ''}", file=sys.stderr)
            return R.USAGE_ERROR_EXIT
        if args.seed is None:  # once for the whole run (and its pool processes): the secret made on first use is made here
            try:
                options["secret"] = course_secret(assignment, secret_file=args.secret_file, secret_env=args.secret_env)
            except SecretError as exc:
                print(f"invariants-gate: {exc}", file=sys.stderr)
                return R.EXIT_CODES[R.GATE_ERROR]
        if args.batch or len(args.submissions) > 1:
            return _batch(args, options, shard)
        return _single(args.submissions[0], args, options, state)
    except ConfigError as exc:
        print(f"invariants-gate: {exc}", file=sys.stderr)
        return R.USAGE_ERROR_EXIT
    except OSError as exc:
        if isinstance(exc, BrokenPipeError) and reader_gone():
            raise  # standard output's reader left early (--list | head -1): quiet_when_reader_leaves ends it quietly
        print(f"invariants-gate: {exc}", file=sys.stderr)
        return R.USAGE_ERROR_EXIT


class _Progress:
    """progress(text) on standard error: on a terminal one line rewritten in place, in a log (not a terminal, or CI set) whole lines,
    the first at once and then at most one every LOG_EVERY_SECONDS."""

    def __init__(self):
        self.terminal = not os.environ.get("CI") and sys.stderr.isatty()
        self.logged = None  # when the latest line went into the log

    def __call__(self, text):
        from invariants.gate.text import printable

        now = time.monotonic()
        if self.terminal:
            sys.stderr.write("\r\x1b[K" + printable(text)[:150])
        elif self.logged is None or now - self.logged >= LOG_EVERY_SECONDS:
            self.logged = now
            sys.stderr.write(f"invariants-gate: {printable(text)[:150]}\n")
        sys.stderr.flush()

    def done(self):
        """Clear the terminal's progress line."""
        if self.terminal:
            sys.stderr.write("\r\x1b[K")
            sys.stderr.flush()


def _progress(args):
    """A _Progress, or None with -q."""
    return None if args.quiet else _Progress()


def _invariant_progress(show_hidden, show):
    """progress(result, inv_result, seconds_left) for grade(): the invariant running (hidden.N for a hidden one), the time left, to show."""
    from invariants.gate.reports import hide_names

    def progress(result, inv, left):
        number = result.invariants.index(inv) + 1
        show(f"[{number}/{len(result.invariants)}] {hide_names(result, show_hidden)(inv.name)}: "
                f"{max(left, 0):.0f} s left of the run's {result.limits['run_seconds']:g} s")

    return progress


def _single(path, args, options, state):
    from invariants.gate.batch import grade_and_report
    from invariants.gate.reports import headline, report_failed, to_terminal, write_reports

    if not Path(path).exists():
        print(f"invariants-gate: no file or folder {path!r}", file=sys.stderr)
        return R.USAGE_ERROR_EXIT
    shown = _progress(args)
    result, written = grade_and_report(path, args.out, options, state=state,
                                       progress=_invariant_progress(args.show_hidden, shown) if shown else None)
    if shown:
        shown.done()
    if args.quiet:
        terminal = headline(result, show_hidden=args.show_hidden) + "\n"
    else:
        try:
            terminal = to_terminal(result, show_hidden=args.show_hidden)
        except Exception as exc:  # noqa: BLE001 - like any report's fault, a gate error for this submission, in its reports too
            report_failed(result, "the terminal report", exc)
            written = write_reports(result, args.out, options["formats"], show_hidden=args.show_hidden)
            terminal = headline(result, show_hidden=args.show_hidden) + "\n"
        terminal += "reports: " + ", ".join(str(p) for p in written) + "\n"
    with reader_may_leave():  # a reader that leaves early (| head) changes no verdict
        sys.stdout.write(terminal)
    return result.exit_code


def _batch(args, options, shard=None):
    from invariants.gate.batch import batch_exit_code, grade_folder, load, points, submissions_in, timing, write_manifest, write_summary
    from invariants.gate.text import printable

    paths = []
    for given in args.submissions:
        path = Path(given)
        if not path.exists():
            print(f"invariants-gate: no file or folder {given!r}", file=sys.stderr)
            return R.USAGE_ERROR_EXIT
        paths += submissions_in(path) if args.batch else [path]
    if not paths:
        print("invariants-gate: no submissions found (.py files, .zip files or folders)", file=sys.stderr)
        return R.USAGE_ERROR_EXIT
    began = time.monotonic()

    def progress(done, total):
        shown(f"graded {done} of {total} submission(s), about {(time.monotonic() - began) / done * (total - done):.0f} s left")

    shown = _progress(args)
    if shown:
        shown(f"grading with {args.jobs} job(s)")
    rows = grade_folder(paths, args.out, options, jobs=args.jobs, shard=shard, progress=progress if shown else None)
    if shown:
        shown.done()
    wall = time.monotonic() - began
    if shard is not None:
        manifest = write_manifest(args.out, shard, rows, len(paths))
        written = f"shard {shard[0]} of {shard[1]}: {len(rows)} of {len(paths)} submissions; {manifest} (merge the shards with --merge)"
    else:
        written = "class summary: " + ", ".join(str(p) for p in write_summary(rows, args.out, load(options, {}).name))
    with reader_may_leave():  # written before a word is printed: a reader that leaves early (| head) loses no summary and no verdict
        for row in rows:
            print(printable(f"{row['verdict']:<13} {points(row):>13} {row['submission']}: {row['reason']}"))
        print(f"graded {len(rows)} submission(s) in {wall:.0f} s with {args.jobs} job(s): {timing(rows)}")
        print(written)
    return batch_exit_code(rows)


def _merge(args):
    from invariants.gate.batch import MergeError, batch_exit_code, merge_rows, secret_notice, timing, write_summary

    try:
        rows = merge_rows(args.merge)
    except MergeError as exc:
        print(f"invariants-gate: --merge: {exc}", file=sys.stderr)
        return R.USAGE_ERROR_EXIT
    if secret_notice(rows):
        print(f"invariants-gate: --merge: {secret_notice(rows)}", file=sys.stderr)
    written = write_summary(rows, args.out, rows[0]["assignment"])
    with reader_may_leave():
        print(f"merged {len(rows)} report(s): {timing(rows)}")
        print("class summary: " + ", ".join(str(p) for p in written))
    return batch_exit_code(rows)


if __name__ == "__main__":
    sys.exit(main())
