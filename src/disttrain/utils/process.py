"""Ending a worker process: the one way every ``__main__`` block of a worker leaves, and the one line it may
leave on the node's console on the way out.

torch's gloo/DDP/RPC destructors can deadlock during interpreter teardown, so a worker flushes what it
wrote and leaves with ``os._exit``, skipping that teardown.
"""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Callable


def exit_now(code: int = 0) -> None:
    """Flush logs and the standard streams, then end the process at once with ``code``."""
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def run_and_exit(main: Callable[[], int | None]) -> None:
    """Run a worker's ``main`` and end the process with its exit code (0 for ``None``), skipping teardown."""
    exit_now(main() or 0)


def say_on_console(line: str) -> None:
    """Print ``line`` where the node's user sees it: this process's stderr, or its launcher's where torchrun
    redirected this rank's output to a log file (``--redirects``; Linux's ``/proc``). A rank other than the
    first may be the one to notice why the job stops, and torchrun ends the others as soon as it leaves."""
    stream = sys.stderr
    parent = f"/proc/{os.getppid()}/fd/2"
    try:
        mine, theirs = os.fstat(sys.stderr.fileno()), os.stat(parent)
        if (mine.st_dev, mine.st_ino) != (theirs.st_dev, theirs.st_ino):
            stream = open(parent, "a")  # noqa: SIM115 - closed below
    except (OSError, ValueError):  # no /proc, or no stderr of our own: keep ours
        pass
    try:
        print(line, file=stream, flush=True)
    finally:
        if stream is not sys.stderr:
            stream.close()
