"""torchrun's agent's warnings: a stop the user asked for (Ctrl-C, SIGTERM) is our one line, not the agent's
three warnings; its warnings after a worker failed stay. (The real Ctrl-C: tests/cli/test_signals.py.)"""

from __future__ import annotations

import logging

import pytest

from disttrain.launch.agent_log import quiet_agent_log

pytestmark = pytest.mark.timeout(30)

AGENT = "torch.distributed.elastic.agent.server.api"
PROCS = "torch.distributed.elastic.multiprocessing.api"


def warn(name: str, msg: str, *args: object) -> None:
    logging.getLogger(name).warning(msg, *args)


def test_an_asked_for_stop_drops_the_agents_warnings_a_failure_keeps_them(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING)
    quiet_agent_log()
    warn(PROCS, "Sending process %s closing signal %s", 11, "SIGTERM")  # a worker failed: the others go
    warn(AGENT, "Received %s death signal, shutting down workers", 2)
    warn(PROCS, "Sending process %s closing signal %s", 12, "SIGINT")
    warn(PROCS, "Unable to shutdown process %s via %s, forcefully exiting via %s", 12, "SIGINT", "SIGKILL")
    kept = [r.getMessage() for r in caplog.records]
    assert kept == [
        "Sending process 11 closing signal SIGTERM",
        "Unable to shutdown process 12 via SIGINT, forcefully exiting via SIGKILL",
    ]
    quiet_agent_log()  # a new launch in the same process starts without a stop
    warn(PROCS, "Sending process %s closing signal %s", 13, "SIGTERM")
    assert caplog.records[-1].getMessage() == "Sending process 13 closing signal SIGTERM"
    assert len(logging.getLogger(PROCS).filters) == 1
