"""Fault injection for tests: ``DISTTRAIN_FAULT`` names points where a rank is killed or an I/O error raised."""

from __future__ import annotations

import errno
import os
import signal

_FIRED: set[str] = set()


def fault_matches(name: str, step: int, rank: int, once: bool = False) -> bool:
    """Does DISTTRAIN_FAULT (comma-separated '<point>:<step>:<rank>' specs) name this point? First attempt
    only (a job restarted by torchrun then runs through); with ``once``, each spec fires once per process.
    Points: checkpoint/step points SIGKILL (:func:`fault_point`); kill_save_process SIGKILLs DCP's background
    save process (process-mode saves); hang, slow, nan: see disttrain.health."""
    if os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") != "0":
        return False
    spec = f"{name}:{step}:{rank}"
    if spec not in os.environ.get("DISTTRAIN_FAULT", "").split(",") or (once and spec in _FIRED):
        return False
    _FIRED.add(spec)
    return True


def fault_point(name: str, step: int, rank: int) -> None:
    """Fault injection for tests: DISTTRAIN_FAULT='<point>:<step>:<rank>' SIGKILLs this process there."""
    if fault_matches(name, step, rank):
        os.kill(os.getpid(), signal.SIGKILL)


def fault_error(name: str, step: int, rank: int) -> None:
    """Fault injection for tests: with '<point>:<step>:<rank>' among DISTTRAIN_FAULT's comma-separated specs,
    raise an I/O error there (a failing disk) instead of killing the process."""
    if f"{name}:{step}:{rank}" in os.environ.get("DISTTRAIN_FAULT", "").split(","):
        raise OSError(errno.EIO, f"injected I/O error (DISTTRAIN_FAULT={name}:{step}:{rank})")
