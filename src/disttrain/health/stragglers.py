"""Straggler verdicts that do not depend on thread scheduling.

Every ``health.straggler_interval`` steps each rank closes a *window*: the median, over the window's steps, of
its data wait (wall seconds in the ``data`` phase) and of its compute (CPU seconds of the training thread per
step, which a busy machine's preemptions do not inflate). The window's figures of every rank are brought
together by an :class:`Exchange`, and :func:`judge` names the slow ranks from them: the same figures for the
same window on every rank, so a run gives the same verdict on a quiet machine and on a busy one.

* :class:`CollectiveExchange`: one all-gather of ``2`` floats per rank, on the training thread, at the window's
  last step (every rank reaches it: the trainer's ranks step together). 0.1-1 ms every 50 steps by default.
* :class:`StoreExchange`: for ranks that do not step together (the parameter server's ssp/asp trainers, and
  its bsp trainers, whose steps a server's loss can roll back unevenly): each rank posts its window to the
  c10d store and the rank that completes it judges it. Nobody waits for anybody.

:func:`open_store` is the client of the job's store that health uses (the heartbeats' too: its own socket).
"""

from __future__ import annotations

import datetime
import json
import logging
import os
import statistics
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import torch
import torch.distributed as dist

from disttrain.health.events import attempt, log_event

log = logging.getLogger("disttrain")

KEYS = ("compute_s", "data_s")
"""The per-phase figures of a window, in the order an exchange carries them."""

MIN_SHARE = 0.05
"""A straggler's excess time per step must be at least this share of the other ranks' median step."""

WARMUP_STEPS = 2
"""Steps of a process (an attempt) left out of every window: the first builds the optimizer state and caches,
the second rebuilds DDP's buckets; they differ by rank (a window of 4 named a rank 1.6x slow from them)."""

Figures = tuple[float, float]
"""One rank's window: (compute seconds per step, data-wait seconds per step), medians over the window."""


def judge(figures: dict[int, Figures], factor: float) -> dict[int, str]:
    """The ranks slower than the median of the others by ``factor`` in compute or data wait, each with why; an
    excess under :data:`MIN_SHARE` of the others' step (or 1 ms) is no straggler: a data wait of 1.6x 0.1 ms (a
    busy machine preempting the rank once) is not one."""
    slow: dict[int, str] = {}
    if len(figures) < 2:
        return slow
    steps = {r: c + d for r, (c, d) in figures.items()}
    for i, key in enumerate(KEYS):
        vals = {r: f[i] for r, f in figures.items()}
        for r, v in vals.items():
            ref = statistics.median(x for q, x in vals.items() if q != r)
            floor = max(1e-3, MIN_SHARE * statistics.median(x for q, x in steps.items() if q != r))
            if v > factor * ref and v - ref > floor and r not in slow:
                slow[r] = f"{key[:-2]} {v * 1e3:.1f} ms/step vs {ref * 1e3:.1f} ms ({v / max(ref, 1e-9):.1f}x)"
    return slow


class Exchange(Protocol):
    """Brings one window's figures of every rank together: {rank: figures} (None: not on this rank, or not
    yet). ``everywhere``: every rank gets them (rank 0 then reports), else only the one that judges."""

    everywhere: bool

    def __call__(self, window: int, mine: Figures) -> dict[int, Figures] | None: ...


class CollectiveExchange:
    """An all-gather on ``group`` (None: the world) of CPU tensors: gloo, or the CPU side of ``cpu:gloo,cuda:nccl``."""

    everywhere = True

    def __init__(self, group: Any = None) -> None:
        self.group = group

    def __call__(self, window: int, mine: Figures) -> dict[int, Figures]:
        n = dist.get_world_size(self.group)
        out = [torch.empty(len(KEYS), dtype=torch.float64) for _ in range(n)]
        dist.all_gather(out, torch.tensor(mine, dtype=torch.float64), group=self.group)
        return {r: (float(t[0]), float(t[1])) for r, t in enumerate(out)}


def open_store(timeout_s: float = 30.0) -> Any:
    """A client of the c10d store the job rendezvoused on, under this attempt's health prefix (its own socket:
    no other thread's store calls wait on it); an in-process store when there is no group."""
    if not dist.is_initialized() or "MASTER_ADDR" not in os.environ:
        return dist.HashStore()
    store = dist.TCPStore(
        os.environ["MASTER_ADDR"],
        int(os.environ["MASTER_PORT"]),
        is_master=False,
        timeout=datetime.timedelta(seconds=timeout_s),
        wait_for_workers=False,
    )
    return dist.PrefixStore(f"disttrain/health/a{attempt()}", store)


class StoreExchange:
    """Each rank posts its window to the store; the one whose post completes it (a counter reaching the live
    ranks) gets every rank's figures. A window counted past the live ranks (posted again after a rollback) is
    never judged twice. ``gone``: the ranks that left for good (they post no more)."""

    everywhere = False

    def __init__(self, rank: int, world: int, gone: set[int], store: Any = None) -> None:
        self.rank, self.world, self.gone = rank, world, gone
        self._store = store

    def __call__(self, window: int, mine: Figures) -> dict[int, Figures] | None:
        if self._store is None:
            self._store = open_store()
        store = self._store
        store.set(f"win/{window}/{self.rank}", json.dumps(mine))
        live = self.world - len(self.gone)
        if store.add(f"win/{window}/n", 1) != live:
            return None
        # a rank gone for good never posts: never wait for it
        posted = [r for r in range(self.world) if store.check([f"win/{window}/{r}"])]
        raws = store.multi_get([f"win/{window}/{r}" for r in posted])
        figs = {r: json.loads(raw) for r, raw in zip(posted, raws, strict=True)}
        return {r: (float(f[0]), float(f[1])) for r, f in figs.items()} if len(figs) > 1 else None


@dataclass
class StragglerCheck:
    """One rank's side: the window being filled, the exchange at its end, the verdict every rank then holds
    (``stragglers``, ``rank_figures``); rank 0, or the rank that judged, logs each straggler as an event."""

    interval: int
    factor: float
    exchange: Exchange | None
    rank: int
    run_dir: Path | None
    stragglers: list[int] = field(default_factory=list)
    rank_figures: dict[str, list[float]] = field(default_factory=dict)
    _win: list[Figures] = field(default_factory=list)
    _steps: int = 0

    def add(self, step: int, compute_s: float, data_s: float) -> None:
        """Step ``step`` took ``compute_s`` of CPU and waited ``data_s`` for data; at a window's last step, the
        exchange and the verdict. The first :data:`WARMUP_STEPS` steps of the process count in no window."""
        if not self.interval:
            return
        self._steps += 1
        if self._steps > WARMUP_STEPS:
            self._win.append((compute_s, data_s))
        if step % self.interval or self.exchange is None or not self._win:
            return  # (every rank has the same steps in its window: all of them exchange, or none)
        mine = (statistics.median(c for c, _ in self._win), statistics.median(d for _, d in self._win))
        self._win = []
        every = self.exchange(step, mine)
        if every is not None:
            self._verdict(step, every)

    def _verdict(self, step: int, every: dict[int, Figures]) -> None:
        slow = judge(every, self.factor)
        self.stragglers = sorted(slow)
        self.rank_figures = {key: [every[r][i] for r in sorted(every)] for i, key in enumerate(KEYS)}
        if self.exchange is not None and self.exchange.everywhere and self.rank != 0:
            return  # rank 0 reports what every rank knows
        for r, why in sorted(slow.items()):
            first = step - self.interval + 1
            log.warning("straggler: rank %d over steps %d-%d: %s", r, first, step, why)
            log_event(self.run_dir, "straggler", rank=r, steps=[first, step], detail=why)
