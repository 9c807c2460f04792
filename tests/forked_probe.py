"""A worker module for tests/cli/test_forked.py: ``entry(argv)`` does what ``argv[0]`` names, and writes what a
forked rank finds about itself to ``argv[1]``."""

from __future__ import annotations

import json
import signal
import sys
import threading
import time
from pathlib import Path


def entry(argv: list[str]) -> int:
    what, out = argv[0], Path(argv[1])
    found = {
        "argv": sys.argv,
        "sigterm_default": signal.getsignal(signal.SIGTERM) is signal.SIG_DFL,
        "sigint_interrupts": signal.getsignal(signal.SIGINT) is signal.default_int_handler,
        "write_through": sys.stdout.write_through,  # type: ignore[attr-defined]
    }
    out.write_text(json.dumps(found))
    if what == "code":
        return 3
    if what == "raise":
        raise ValueError("boom from the probe")
    if what == "exit0":  # a worker's own way out (utils.process.exit_now), from deep inside its entry
        from disttrain.utils.process import exit_now

        exit_now(0)
        raise AssertionError("exit_now(0) came back")
    threading.Thread(target=time.sleep, args=(120,)).start()  # not a daemon: a fresh worker's exit skips it too
    print("probe done", flush=True)
    return 0
