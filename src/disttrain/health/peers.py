"""A collective that failed because a peer went away (its host died, the link was cut, it was killed), told
apart from a bug: gloo and NCCL say so in their error text, with the peer's address. (The launcher's worker
treats only peers on other nodes this way; a rank of its own node that died is torchrun's to report.)"""

from __future__ import annotations

import re

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
