"""invariants-gate: grade a submission (or a folder of them) against an assignment file.

    invariants-gate student.zip -a p01 -o reports/
    invariants-gate --batch submissions/ -a p01 -o reports/ --jobs 2
    invariants-gate --batch submissions/ -a p01 -o reports/ --shard 3/8   # one CI job of eight
    invariants-gate --merge shards/ -o summary/                                              # the class summary of all eight
    invariants-gate my_code/ -a p01 --visible-only      # a student's preview

Exit codes: 0 passed, 1 failed, 2 usage or assignment-file error, 3 not gradable, 4 gate error.
A batch (and a merge) exits 0 when every submission got a verdict, 4 when the gate failed on any.
On a terminal one line on standard error shows the progress (the invariant running, or the
submissions graded, and the time left); not with -q, in CI (CI set) or when it is not a terminal.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
from pathlib import Path

from invariants.gate import result as R

FORMATS = ("json", "junit", "gradescope", "markdown")


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
    p.add_argument("--seed", type=int, help="a fixed hypothesis seed (to reproduce a report's seed)")
    p.add_argument("--secret-env", help="environment variable holding the course secret for per-submission seeds")
    p.add_argument("--secret-file", help="file holding the course secret for per-submission seeds")
    p.add_argument("--max-examples", type=int, help="override the assignment's examples per invariant")
    p.add_argument("--entry", help="module to load inside a folder or zip submission (default: __init__.py, submission.py, adapter.py)")
    p.add_argument("--scratch-root", help="where the per-submission scratch folders go (default: the system temp folder)")
    p.add_argument("--keep-scratch", action="store_true", help="keep the scratch folder (captured output, the unpacked submission)")
    p.add_argument("-q", "--quiet", action="store_true", help="print only the verdict line")
    p.add_argument("--list", action="store_true", help="list the registered invariants (or the assignment's selection) and exit")
    return p


def _secret(options, assignment):
    """The course secret, or None: --secret-file, --secret-env, then the assignment's [seed] table."""
    file = options.get("secret_file") or assignment.secret_file
    env = options.get("secret_env") or assignment.secret_env
    if file:
        return Path(file).read_text(encoding="utf-8").strip() or None
    if env:
        return os.environ.get(env) or None
    return None


def load(options, state):
    """The assignment named in options, loaded once per process (state caches it)."""
    from invariants.gate.config import load_assignment

    if "assignment" not in state:
        assignment = load_assignment(options["assignment"])
        if options.get("max_examples"):
            assignment = dataclasses.replace(assignment, max_examples=options["max_examples"])
        if options.get("entry"):
            assignment = dataclasses.replace(assignment, entry=options["entry"])
        if options.get("visible_only"):
            assignment = assignment.visible_only()
        state["assignment"] = assignment
    return state["assignment"]


def grade_and_report(path, out_dir, options, *, state, progress=None):
    """Grade one submission and write its reports; (GradeResult, paths written). progress: as invariants.gate.grade.grade takes it."""
    from invariants.gate.grade import grade
    from invariants.gate.reports import write_reports

    assignment = load(options, state)
    result = grade(path, assignment, seed=options.get("seed"), secret=_secret(options, assignment),
                   scratch_root=options.get("scratch_root"), keep_scratch=options.get("keep_scratch", False),
                   hidden=[*options.get("hidden", ()), str(Path(out_dir).resolve())], progress=progress)
    written = write_reports(result, out_dir, options["formats"], show_hidden=options.get("show_hidden", False))
    return result, written


def _list(options):
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


def main(argv=None):
    args = _parser().parse_args(argv)
    formats = tuple(f.strip() for f in args.formats.split(",") if f.strip())
    unknown = [f for f in formats if f not in FORMATS]
    if unknown:
        print(f"invariants-gate: --formats {unknown[0]!r} is not one of {', '.join(FORMATS)}", file=sys.stderr)
        return R.USAGE_ERROR_EXIT
    options = {"assignment": args.assignment, "formats": formats, "seed": args.seed, "secret_env": args.secret_env,
               "secret_file": args.secret_file, "max_examples": args.max_examples, "entry": args.entry,
               "visible_only": args.visible_only, "show_hidden": args.show_hidden, "scratch_root": args.scratch_root,
               "keep_scratch": args.keep_scratch, "hidden": [str(Path(p).resolve()) for p in args.submissions]}
    from invariants.gate.config import ConfigError

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
        if args.batch or len(args.submissions) > 1:
            return _batch(args, options, shard)
        return _single(args.submissions[0], args, options, state)
    except ConfigError as exc:
        print(f"invariants-gate: {exc}", file=sys.stderr)
        return R.USAGE_ERROR_EXIT
    except OSError as exc:
        print(f"invariants-gate: {exc}", file=sys.stderr)
        return R.USAGE_ERROR_EXIT


def _progress_shown(args):
    """Whether to show progress: on a terminal only, and neither with -q nor in CI (its logs get nothing extra)."""
    return not args.quiet and not os.environ.get("CI") and sys.stderr.isatty()


def _status(text):
    """Rewrite the progress line on standard error ('' clears it)."""
    from invariants.gate.text import printable

    sys.stderr.write("\r\x1b[K" + printable(text)[:150])
    sys.stderr.flush()


def _invariant_progress(show_hidden):
    """progress(result, inv_result, seconds_left) for grade(): the invariant running (hidden.N for a hidden one), the time left."""
    from invariants.gate.reports import hide_names

    def progress(result, inv, left):
        number = result.invariants.index(inv) + 1
        _status(f"[{number}/{len(result.invariants)}] {hide_names(result, show_hidden)(inv.name)}: "
                f"{max(left, 0):.0f} s left of the run's {result.limits['run_seconds']:g} s")

    return progress


def _single(path, args, options, state):
    from invariants.gate.reports import headline, to_terminal

    if not Path(path).exists():
        print(f"invariants-gate: no file or folder {path!r}", file=sys.stderr)
        return R.USAGE_ERROR_EXIT
    shown = _progress_shown(args)
    result, written = grade_and_report(path, args.out, options, state=state,
                                       progress=_invariant_progress(args.show_hidden) if shown else None)
    if shown:
        _status("")
    if args.quiet:
        print(headline(result, show_hidden=args.show_hidden))
    else:
        sys.stdout.write(to_terminal(result, show_hidden=args.show_hidden))
        print("reports: " + ", ".join(str(p) for p in written))
    return result.exit_code


def _batch(args, options, shard=None):
    import time

    from invariants.gate.batch import batch_exit_code, grade_folder, submissions_in, timing, write_manifest, write_summary
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
        _status(f"graded {done} of {total} submission(s), about {(time.monotonic() - began) / done * (total - done):.0f} s left")

    shown = _progress_shown(args)
    if shown:
        _status(f"grading with {args.jobs} job(s)")
    rows = grade_folder(paths, args.out, options, jobs=args.jobs, shard=shard, progress=progress if shown else None)
    if shown:
        _status("")
    for row in rows:
        print(printable(f"{row['verdict']:<13} {row['score']:>6g}/{row['max_score']:<6g} {row['submission']}: {row['reason']}"))
    wall = time.monotonic() - began
    print(f"graded {len(rows)} submission(s) in {wall:.0f} s with {args.jobs} job(s): {timing(rows)}")
    if shard is not None:
        manifest = write_manifest(args.out, shard, rows, len(paths))
        print(f"shard {shard[0]} of {shard[1]}: {len(rows)} of {len(paths)} submissions; {manifest} (merge the shards with --merge)")
    else:
        written = write_summary(rows, args.out, load(options, {}).name)
        print("class summary: " + ", ".join(str(p) for p in written))
    return batch_exit_code(rows)


def _merge(args):
    from invariants.gate.batch import MergeError, batch_exit_code, merge_rows, timing, write_summary

    try:
        rows = merge_rows(args.merge)
    except MergeError as exc:
        print(f"invariants-gate: --merge: {exc}", file=sys.stderr)
        return R.USAGE_ERROR_EXIT
    written = write_summary(rows, args.out, rows[0]["assignment"])
    print(f"merged {len(rows)} report(s): {timing(rows)}")
    print("class summary: " + ", ".join(str(p) for p in written))
    return batch_exit_code(rows)


if __name__ == "__main__":
    sys.exit(main())
