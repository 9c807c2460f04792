"""A collective that failed because a peer went away (its host died, the link was cut, it was killed), told
apart from a bug: gloo and NCCL say so in their error text, with the peer's address. (The launcher's worker
treats only peers on other nodes this way; a rank of its own node that died is torchrun's to report.)"""

from __future__ import annotations

import os
import re

import torch.distributed as dist

PEER_LOST_EXIT = 4
"""A worker's exit code when it stopped because it lost contact with another node (it said so itself)."""

_LOST = re.compile(
    r"Connection reset by peer|Connection closed by peer|Connection refused|Socket Timeout|Timed out waiting|"
    r"timed out|No route to host|Broken pipe|NCCL communicator was aborted|remote process exited",
    re.IGNORECASE,
)
_ADDR = re.compile(r"\[([0-9a-fA-F.:]+)\]:\d+")


def lost_peer(e: BaseException) -> tuple[str, str] | None:
    """(the peer's address or 'a peer', what happened) if ``e`` is a collective losing a peer, else None."""
    text = str(e)
    found = _LOST.search(text)
    if not isinstance(e, RuntimeError) or found is None:
        return None
    addr = _ADDR.search(text)
    return (addr.group(1) if addr else "a peer"), found.group(0)


_NODES: dict[int, str] = {}
"""Every node's address by node rank (torchrun's GROUP_RANK), learned at start-up by :func:`learn_nodes`."""


def learn_nodes() -> None:
    """Gather each node's address (``DISTTRAIN_NODE_ADDR``, set by the launcher) once, while every link is up:
    a collective that later times out names no peer, and this lets the message name the other nodes."""
    if not dist.is_initialized() or int(os.environ.get("GROUP_WORLD_SIZE", "1")) < 2:
        return
    mine = (int(os.environ.get("GROUP_RANK", "0")), os.environ.get("DISTTRAIN_NODE_ADDR", ""))
    every: list[tuple[int, str]] = [mine] * dist.get_world_size()
    dist.all_gather_object(every, mine)
    _NODES.update(dict(every))


def other_nodes() -> str:
    """The other nodes' addresses (``10.0.0.2`` or ``one of 10.0.0.2, 10.0.0.3``), or ``another node``."""
    me = int(os.environ.get("GROUP_RANK", "0"))
    others = sorted({a for n, a in _NODES.items() if n != me and a})
    if not others:
        return "another node"
    return others[0] if len(others) == 1 else "one of " + ", ".join(others)
