"""Facts about this host that several commands need: a free TCP port, the CPU's model name."""

from __future__ import annotations

import contextlib
import platform
import socket
from pathlib import Path


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port nobody listens on now at ``host`` (``""``: every interface); the caller binds it soon after."""
    with socket.socket() as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def cpu_name() -> str:
    """The CPU's model name (/proc/cpuinfo on Linux), else what the platform module says."""
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.partition(":")[2].strip()
    return platform.processor() or platform.machine() or "unknown"
