"""Signals a worker turns into exceptions: SIGTERM from torchrun or a scheduler becomes :class:`Terminated`."""

from __future__ import annotations

import logging
import signal
from typing import Any

from disttrain.errors import Terminated

log = logging.getLogger("disttrain")


def raise_on_sigterm() -> None:
    """Turn SIGTERM into :class:`Terminated` in the main thread, so that a rank torchrun stops notes why it
    left (:func:`record_exit`) instead of vanishing like the SIGKILLed rank: the restart log then names the
    rank that really failed first, not every rank that left no record."""

    def handler(signum: int, frame: Any) -> None:
        STOPPING.append(signum)
        raise Terminated("SIGTERM: stopped by the launcher (another rank failed, or the job was cancelled)")

    def interrupt(signum: int, frame: Any) -> None:
        STOPPING.append(signum)
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, handler)
    signal.signal(signal.SIGINT, interrupt)


STOPPING: list[int] = []
"""The stop signals this process received: a collective that fails afterwards failed because the other
ranks are stopping too, not because of a fault."""
