"""torchrun's agent's log, as a disttrain user needs it: warnings and errors only, and no warnings about a stop
the user asked for. On Ctrl-C or a scheduler's SIGTERM the agent warns that it received a death signal and that
it sends each worker a closing signal; the job then says its own line (where it stopped, how to resume), so
those lines are dropped. The same "closing signal" warning after a worker failed, with no stop asked for, stays.
A forked rank's failure (:mod:`disttrain.launch.forked`) is the agent's one "failed (exitcode ...)" line, as a
fresh process's is, without the traceback of the agent's own polling that comes with it.
"""

from __future__ import annotations

import logging

AGENT_LOGGERS = ("torch.distributed.elastic", "torch.distributed.run", "torch.distributed.launcher")
"""The agent's loggers, kept at WARNING (its INFO lines say nothing a user acts on)."""
_STOP = "torch.distributed.elastic.agent.server.api"  # "Received SIGINT death signal, shutting down workers"
_CLOSING = "torch.distributed.elastic.multiprocessing.api"  # "Sending process 123 closing signal SIGINT"
_SPAWN = "torch.multiprocessing.spawn"  # forked ranks: "Terminating process 123 via signal SIGTERM"


class StopNoise(logging.Filter):
    """Drops the agent's warnings about a stop signal it received, and its closing-signal warnings after one."""

    def __init__(self) -> None:
        super().__init__()
        self.stopping = False

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        if record.name == _STOP and "death signal" in message:
            self.stopping = True
            return False
        if record.name == _CLOSING and message.startswith("failed (exitcode"):
            record.exc_info, record.exc_text = None, None  # how the agent learnt of it, not the rank's error
        closing = (record.name == _CLOSING and "closing signal" in message) or (
            record.name == _SPAWN and "via signal" in message
        )
        return not (self.stopping and closing)


def quiet_agent_log() -> StopNoise:
    """Set the agent's loggers to WARNING and drop its warnings about an asked-for stop (idempotent)."""
    for name in AGENT_LOGGERS:
        logging.getLogger(name).setLevel(logging.WARNING)
    noise = StopNoise()
    for name in (_STOP, _CLOSING, _SPAWN):
        logger = logging.getLogger(name)
        for old in [f for f in logger.filters if isinstance(f, StopNoise)]:
            logger.removeFilter(old)
        logger.addFilter(noise)
    return noise
