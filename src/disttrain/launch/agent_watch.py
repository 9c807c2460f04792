"""The launcher's watch over torchrun's agent after a node was lost. When this node's ranks have stopped
because another node went away or its link is down, the agent still winds down through the rendezvous
store, which may live on the node that is out of reach: it would wait minutes on it. This watch gives the
agent ``grace_s`` once a rank recorded the loss and no worker of this launcher is left, then ends the
launcher with the ranks' exit code and one line, instead of a hang."""

from __future__ import annotations

import os
import sys
import threading
import time
from pathlib import Path

from disttrain.health.events import health_dir
from disttrain.health.peers import PEER_LOST_EXIT
from disttrain.utils.process import exit_now


def live_children(pid: int) -> list[int]:
    """The running child processes of ``pid`` (its workers, for a launcher)."""
    out = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2 :].split()  # state, ppid, ...
        if int(fields[1]) == pid and fields[0] != "Z":
            out.append(int(entry))
    return out


class AgentWatch:
    """A daemon thread that ends this launcher when its agent outstays a lost node (see the module doc)."""

    def __init__(
        self, run_dir: Path, endpoint: str, last_attempt: int, grace_s: float = 10.0, poll_s: float = 0.5
    ) -> None:
        self.run_dir, self.endpoint, self.grace_s, self.poll_s = run_dir, endpoint, grace_s, poll_s
        self.last_attempt = last_attempt  # the loss of a node ends the job only then (torchrun restarts before)
        self.started = time.time()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="disttrain-agent-watch", daemon=True)

    def __enter__(self) -> AgentWatch:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()

    def lost(self) -> bool:
        """A rank of this job recorded a lost node in the last attempt torchrun makes, since this launcher
        started."""
        markers = health_dir(self.run_dir).glob(f"peer-lost-attempt{self.last_attempt}-*")
        return any(p.stat().st_mtime >= self.started - 1 for p in markers)

    def _loop(self) -> None:
        idle_since: float | None = None
        while not self._stop.wait(self.poll_s):
            if not self.lost() or live_children(os.getpid()):
                idle_since = None
                continue
            idle_since = idle_since or time.monotonic()
            if time.monotonic() - idle_since >= self.grace_s and not self._stop.is_set():
                print(
                    f"disttrain: leaving without torchrun's agent, which cannot reach the rendezvous at "
                    f"{self.endpoint} to wind down",
                    file=sys.stderr,
                    flush=True,
                )
                exit_now(PEER_LOST_EXIT)
