"""Facts about this host that several commands need: a free TCP port (or one held for a job's store), the CPU's
model name."""

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


_HELD: list[socket.socket] = []
"""The sockets that hold :func:`reserved_port`'s ports, open until this process exits."""


def reserved_port() -> int:
    """A free TCP port that no other process can be handed by the kernel until this process exits, for a store
    that a child (a job's rank 0) will listen on soon after. A port that :func:`free_port` names is free only
    until someone else binds it; on a busy host an outgoing connection's ephemeral port can take it before rank
    0 listens (``EADDRINUSE`` at the rendezvous). Held here by a bound socket that does not listen, with
    ``SO_REUSEADDR``: the kernel skips it when it picks ports, and a store that sets ``SO_REUSEADDR`` too (c10d's
    TCPStore and TensorPipe's do) may still listen on it."""
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind(("", 0))
    _HELD.append(s)
    return int(s.getsockname()[1])


def cpu_name() -> str:
    """The CPU's model name (/proc/cpuinfo on Linux), else what the platform module says."""
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.partition(":")[2].strip()
    return platform.processor() or platform.machine() or "unknown"
