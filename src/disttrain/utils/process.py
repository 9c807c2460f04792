"""Ending a worker process: the one way every ``__main__`` block of a worker leaves.

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
