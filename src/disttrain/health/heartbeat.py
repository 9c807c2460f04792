"""A process's heartbeat file, for the launcher's watch (:mod:`disttrain.launch.frozen_watch`): a daemon
thread that writes ``<run>/health/attempt<k>-rank<r>.json`` every period and never waits on the network (a
frozen peer hosting a store must not silence it), and hands the launcher's verdict on a frozen rank of this
attempt (``health/verdict-attempt<k>.json``) to its owner.

The trainer's :class:`~disttrain.health.monitor.HealthMonitor` writes its own record through it; the parameter
server's servers and the RL learner and actors, which have no step watchdog, use :class:`ProgressBeat`: a role,
a progress counter and the hang timeout, enough for the launcher to name one whose process stopped.
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from disttrain.config import HealthConfig
from disttrain.health.events import attempt, health_dir, write_state

log = logging.getLogger("disttrain")


STALE_BEATS = 3
"""A heartbeat at least this many periods old (beyond the hang timeout, for the launcher) says its process
stopped: the thread that writes it never waits on anything."""


def read_beats(run_dir: Path, node: int) -> tuple[int, dict[int, dict[str, Any]]]:
    """(the newest attempt, its heartbeats by rank) of this node's ranks, as their files hold them."""
    beats: dict[int, dict[int, dict[str, Any]]] = {}
    for p in (run_dir / "health").glob("attempt*-rank*.json"):
        try:
            beat = json.loads(p.read_text())
            k, r = int(beat["attempt"]), int(beat["rank"])
        except (OSError, ValueError, KeyError, TypeError):
            continue
        if int(beat.get("node", 0)) == node:
            beats.setdefault(k, {})[r] = beat
    if not beats:
        return -1, {}
    newest = max(beats)
    return newest, beats[newest]


def silent_ranks(run_dir: Path, period_s: float, now: float | None = None) -> list[int]:
    """Ranks of this attempt (any node) whose heartbeat file is :data:`STALE_BEATS` periods old while they were
    still running: their process stopped, and the launcher's watch will name them (rank 0's watchdog then
    leaves the verdict to it rather than blame a rank that only waits for them)."""
    now = time.time() if now is None else now
    out = []
    for p in health_dir(run_dir).glob(f"attempt{attempt()}-rank*.json"):
        try:
            beat = json.loads(p.read_text())
        except (OSError, ValueError):
            continue
        running = not beat.get("exit") and beat.get("phase") != "done" and "pid" in beat
        if running and now - float(beat.get("time", now)) > STALE_BEATS * period_s:
            out.append(int(beat["rank"]))
    return sorted(out)


def launcher_verdict(run_dir: Path) -> dict[str, Any] | None:
    """The launcher's verdict on a frozen rank of this attempt, or None (also while it is being written)."""
    path = health_dir(run_dir) / f"verdict-attempt{attempt()}.json"
    try:
        return dict(json.loads(path.read_text())) if path.is_file() else None
    except (OSError, ValueError):
        return None


class Heartbeat:
    """Writes ``record()`` as this rank's heartbeat file every ``period_s``; ``on_verdict`` gets the launcher's
    verdict when there is one."""

    def __init__(
        self,
        run_dir: Path,
        rank: int,
        record: Callable[[], dict[str, Any]],
        period_s: float,
        on_verdict: Callable[[dict[str, Any]], None] | None = None,
    ) -> None:
        self.run_dir, self.rank, self.record, self.period_s, self.on_verdict = (
            run_dir,
            rank,
            record,
            period_s,
            on_verdict,
        )
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="disttrain-heartbeat-file", daemon=True)

    def start(self) -> Heartbeat:
        write_state(self.run_dir, self.rank, self.record())  # at once: a rank that dies early still leaves one
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()

    def _loop(self) -> None:
        while not self._stop.wait(self.period_s):
            try:
                write_state(self.run_dir, self.rank, self.record())
                if self.on_verdict is not None and (verdict := launcher_verdict(self.run_dir)) is not None:
                    self.on_verdict(verdict)
            except OSError as e:  # a full or vanished disk: nothing to do but try again
                log.debug("health: heartbeat file not written: %s", e)


def role_timeout(cfg: HealthConfig) -> float:
    """How long a process without a step watchdog may stay silent: ``health.hang_timeout_s``, else the floor."""
    return cfg.hang_timeout_s if cfg.hang_timeout_s is not None else cfg.hang_floor_s


class ProgressBeat:
    """The heartbeat of a process without a step watchdog (a parameter server, an RL learner or actor):
    its ``role``, a progress counter it moves with :meth:`progress`, and the hang timeout the launcher judges
    its silence by."""

    def __init__(self, run_dir: Path, rank: int, role: str, cfg: HealthConfig) -> None:
        self.role, self.timeout_s, self.enabled = role, role_timeout(cfg), cfg.enabled
        self.step, self.since = 0, time.perf_counter()
        self.beat = Heartbeat(run_dir, rank, self._record, cfg.heartbeat_s)
        self.rank = rank

    def progress(self, step: int) -> None:
        """The owner moved on (an update applied, a chunk of experience sent): attribute writes only."""
        self.step, self.since = step, time.perf_counter()

    def _record(self) -> dict[str, Any]:
        return {
            "rank": self.rank,
            "attempt": attempt(),
            "role": self.role,
            "step": self.step,
            "phase": self.role,
            "in_phase_s": time.perf_counter() - self.since,
            "time": time.time(),
            "pid": os.getpid(),
            "node": int(os.environ.get("GROUP_RANK", "0")),
            "timeout_s": self.timeout_s,
        }

    def __enter__(self) -> ProgressBeat:
        if self.enabled:
            self.beat.start()
        return self

    def __exit__(self, *exc: object) -> None:
        if self.enabled:
            self.beat.stop()
            write_state(self.beat.run_dir, self.rank, {**self._record(), "phase": "done"})
