"""Stop signals in a worker. SIGTERM (a scheduler preempting the job, or torchrun passing on the launcher's)
and SIGUSR1 (Slurm's warning before the time limit, ``--signal=USR1@90``) ask for a graceful stop: every rank
finishes the step it is in, they save a checkpoint together and leave (:data:`PREEMPT`; the ranks agree on
the step through the loss all-reduce every step already does). SIGINT (Ctrl-C) interrupts at once.

A rank that torchrun stops because another one failed gets SIGTERM too: its next collective fails (the
peer is gone), and :data:`STOPPING` tells that failure apart from a fault."""

from __future__ import annotations

import signal
import time
from dataclasses import dataclass
from typing import Any


@dataclass
class StopRequest:
    """The first graceful-stop signal this process received (0: none) and when."""

    signum: int = 0
    at: float = 0.0

    @property
    def requested(self) -> bool:
        return self.signum != 0

    @property
    def requeue(self) -> bool:
        """SIGUSR1: Slurm's time-limit warning; the job asks to be requeued after its checkpoint."""
        return self.signum == signal.SIGUSR1


PREEMPT = StopRequest()
STOPPING: list[int] = []
"""The stop signals this process received: a collective that fails afterwards failed because the other
ranks are stopping too, not because of a fault."""


def install_stop_signals() -> None:
    """SIGTERM / SIGUSR1 -> :data:`PREEMPT` (a repeat changes nothing: Slurm signals every process of the step
    and torchrun passes the same signal on, so each rank gets it twice); SIGINT -> KeyboardInterrupt."""

    def request(signum: int, frame: Any) -> None:
        STOPPING.append(signum)
        if not PREEMPT.requested:
            PREEMPT.signum, PREEMPT.at = signum, time.monotonic()

    def interrupt(signum: int, frame: Any) -> None:
        STOPPING.append(signum)
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, request)
    signal.signal(signal.SIGUSR1, request)
    signal.signal(signal.SIGINT, interrupt)
