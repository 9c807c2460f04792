"""Ending a worker process: the one way every ``__main__`` block of a worker leaves, and the one line it may
leave on the node's console on the way out.

torch's gloo/DDP/RPC destructors can deadlock during interpreter teardown, so a worker flushes what it
wrote and leaves with ``os._exit``, skipping that teardown.
"""

from __future__ import annotations

import logging
import os
import sys
import threading
from collections.abc import Callable

_SUCCESS_RETURNS = False
"""Set in a rank that torchrun's agent forked (:mod:`disttrain.launch.forked`): the agent learns of a success
only from the rank's function returning, so there exit code 0 on the main thread unwinds to it instead."""


def success_returns(on: bool) -> None:
    """Make :func:`exit_now` with code 0 on the main thread raise ``SystemExit(0)`` (``on``) or end the process."""
    global _SUCCESS_RETURNS
    _SUCCESS_RETURNS = on


def exit_now(code: int = 0) -> None:
    """Flush logs and the standard streams, then end the process at once with ``code`` (in a forked rank,
    code 0 on the main thread raises ``SystemExit(0)``: see :func:`success_returns`)."""
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    if code == 0 and _SUCCESS_RETURNS and threading.current_thread() is threading.main_thread():
        raise SystemExit(0)
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
