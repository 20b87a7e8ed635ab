"""Output into a pipe whose reader left early (`invariants-card --list | head -1`) ends quietly: no traceback, no error message.

Python's documented way (the note on SIGPIPE in the `signal` module's documentation): catch BrokenPipeError around the output,
flush inside that, and point standard output at /dev/null so that the flush at the interpreter's exit writes nowhere. Only a
pipe that has lost its reader counts: a BrokenPipeError from anything else (a worker's pipe) stays an error.
"""

from __future__ import annotations

import contextlib
import functools
import os
import select
import sys


def reader_gone(stream=None):
    """Whether `stream` (standard output by default) writes into a pipe whose reader has closed it (POLLERR on its write end)."""
    stream = stream or sys.stdout
    try:
        poller = select.poll()
        poller.register(stream.fileno(), select.POLLOUT)
        return any(events & select.POLLERR for _, events in poller.poll(0))
    except (AttributeError, OSError, ValueError):  # no poll here (Windows), or no file behind the stream
        return False


@contextlib.contextmanager
def reader_may_leave():
    """Around writing to standard output: where its reader has left, stop writing quietly and go on (a verdict's status stands)."""
    try:
        yield
        sys.stdout.flush()  # inside: a reader gone shows here, not at the interpreter's exit
    except BrokenPipeError:
        if not reader_gone():
            raise
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())


def quiet_when_reader_leaves(main):
    """main(argv) -> status, ending quietly with status 0 where its standard output's reader left first: it took what it wanted."""

    @functools.wraps(main)
    def run(argv=None):
        with reader_may_leave():
            return main(argv)
        return 0

    return run
