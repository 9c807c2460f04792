"""A BSP trainer's rows, step by step: one exchange per server and step, the next step's rows read in the same
message as this step's pushes, and the hot rows served from the trainer's cache (:mod:`disttrain.ps.cache`).

The data of every step is known in advance (each step's batch comes from its own generator), so the rows of
step t+1 are asked for in step t's message: they are read after every trainer's step t is applied, which is
what a pull at the start of step t+1 would read. The first step of a run (or of a resume) reads its rows in
an exchange that pushes nothing.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from disttrain.ps.cache import RowCache
from disttrain.ps.client import PendingStep, Routes, TableGroup


@dataclass
class StepRows:
    """One step's distinct rows per table, where each sample's id is among them, and their values."""

    uniq: list[torch.Tensor]
    inverse: list[torch.Tensor]
    values: list[torch.Tensor]
    routes: Routes | None = None
    """Where ``uniq`` live (when all of them were pulled: no cache), for the push of their gradients."""

    def embeddings(self) -> torch.Tensor:
        """(batch, tables, dim) rows of the step's samples (one gather for every table)."""
        starts = [0, *torch.tensor([len(u) for u in self.uniq]).cumsum(0)[:-1].tolist()]
        where = torch.stack([inv + s for inv, s in zip(self.inverse, starts, strict=True)], dim=1)
        return torch.cat(self.values)[where]


def unique_columns(ids: torch.Tensor, offsets: torch.Tensor) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """Per column of ``ids`` (batch, tables): its distinct ids (sorted) and where each id is among them, as
    ``torch.unique(ids[:, i], return_inverse=True)`` gives, from one ``unique`` over every table: each table's
    ids shifted by ``offsets[i]`` (the rows of the tables before it) so the tables' ranges follow each other."""
    flat, inverse = torch.unique(ids + offsets, return_inverse=True)
    bounds = [*torch.searchsorted(flat, offsets).tolist(), len(flat)]
    uniq = [flat[bounds[i] : bounds[i + 1]] - offsets[i] for i in range(len(offsets))]
    return uniq, [inverse[:, i] - bounds[i] for i in range(len(offsets))]


def summed_columns(grads: torch.Tensor, inverse: list[torch.Tensor], counts: list[int]) -> list[torch.Tensor]:
    """Per table: ``grads[:, i]`` (batch, tables, dim) summed per distinct id (in batch order, as a per-table
    ``index_add_`` sums them), from one ``index_add_`` over every table."""
    starts = [0, *torch.tensor(counts).cumsum(0)[:-1].tolist()]
    where = torch.stack([inv + s for inv, s in zip(inverse, starts, strict=True)], dim=1).reshape(-1)
    total = torch.zeros(sum(counts), grads.shape[2]).index_add_(0, where, grads.reshape(-1, grads.shape[2]))
    return list(total.split(counts))


class BspRows:
    """The rows a BSP trainer trains on: ``group``'s tables, ``caches`` (one per table; empty: no cache)."""

    def __init__(self, group: TableGroup, caches: list[RowCache], rank: int, trainers: int) -> None:
        self.group, self.caches, self.rank, self.trainers = group, caches, rank, trainers
        self.dim = group.tables[0].dim
        self.epoch = 0  # roll-backs so far (a spare server took a dead one's place)
        self.seq = 0  # messages sent in this epoch: each server takes a trainer's messages in this order
        sizes = torch.tensor([t.sharding.rows for t in group.tables])
        self.offsets = torch.cat([torch.zeros(1, dtype=torch.int64), sizes.cumsum(0)[:-1]])

    def first(self, step: int, ids: torch.Tensor, every_ids: torch.Tensor, resumed: bool) -> StepRows:
        """The rows ``ids`` of step ``step`` read in a message that pushes nothing (the run's first step, or the
        first after a sync point of an overlapped run); ``every_ids``: every trainer's; ``resumed``: the loaded
        counts hold this step's reads (counted before the checkpoint)."""
        empty = [torch.empty(0, dtype=torch.int64) for _ in self.group.tables]
        grads = [torch.empty(0, self.dim) for _ in self.group.tables]
        rows, _, _ = self._send(empty, grads, step - 1, (ids, every_ids), 0.0, None, count=not resumed).wait()
        assert rows is not None
        return rows

    def send(
        self,
        step: int,
        rows: StepRows,
        grads: torch.Tensor,
        next_ids: tuple[torch.Tensor, torch.Tensor] | None,
        loss: float,
        dense_grad: torch.Tensor | None,
        sync: bool,
    ) -> InFlight:
        """Push step ``step``'s ``grads`` ((batch, tables, dim), already divided by the trainers) of ``rows``,
        and ask for the rows of ``next_ids`` (this trainer's ids of a later step, and every trainer's: all
        trainers count the same reads, so they keep the same hot rows; None: none). ``sync``: every cached
        row is pushed and dropped (a checkpoint, an evaluation or the end follows). :meth:`InFlight.wait`
        gives the rows, the step's mean loss and mean dense gradient."""
        push_ids, push_grads = [], []
        sums = summed_columns(grads, rows.inverse, [len(u) for u in rows.uniq])
        for i, (uniq, summed) in enumerate(zip(rows.uniq, sums, strict=True)):
            if not self.caches:
                push_ids.append(uniq)
                push_grads.append(summed)
                continue
            cache = self.caches[i]
            slots = cache.slot_of[uniq]
            held = slots >= 0
            cache.add_grads(slots[held], summed[held])
            gone_ids, gone_grads = cache.expire(step, flush=sync)
            push_ids.append(torch.cat([uniq[~held], gone_ids]))
            push_grads.append(torch.cat([summed[~held], gone_grads]))
        return self._send(push_ids, push_grads, step, next_ids, loss, dense_grad, routes=rows.routes)

    def _send(
        self,
        push_ids: list[torch.Tensor],
        push_grads: list[torch.Tensor],
        clock: int,
        next_ids: tuple[torch.Tensor, torch.Tensor] | None,
        loss: float,
        dense_grad: torch.Tensor | None,
        count: bool = True,
        routes: Routes | None = None,
    ) -> InFlight:
        step = (clock, self.rank, self.trainers, loss)
        self.seq += 1
        if next_ids is None:
            pull = [torch.empty(0, dtype=torch.int64) for _ in self.group.tables]
            pending = self.group.exchange(push_ids, push_grads, pull, step, dense_grad, self.epoch, routes, self.seq)
            return InFlight(self, pending, clock, None)
        mine, every = next_ids
        uniq, inverse = unique_columns(mine, self.offsets)
        pull, held_at = [], []
        for i, u in enumerate(uniq):
            if self.caches:
                if count:
                    self.caches[i].count(torch.unique(every[:, i]), clock + 1)
                held, slots = self.caches[i].split(u)
                held_at.append((held, slots))
                pull.append(u[~held])
            else:
                pull.append(u)
        pending = self.group.exchange(push_ids, push_grads, pull, step, dense_grad, self.epoch, routes, self.seq)
        return InFlight(self, pending, clock, (uniq, inverse, pull, held_at))

    def roll_back(self, epoch: int) -> None:
        """Forget every cached row (the servers are back at a checkpoint, where the caches were empty)."""
        self.epoch, self.seq = epoch, 0
        for c in self.caches:
            c.clear()

    def state(self) -> dict[str, Any]:
        """What a resume needs to choose the same hot rows (the cache is empty at every checkpoint)."""
        return {"counts": [c.counts.clone() for c in self.caches], "hot": [c.hot.clone() for c in self.caches]}

    def load_state(self, state: dict[str, Any]) -> None:
        for c, counts, hot in zip(self.caches, state["counts"], state["hot"], strict=True):
            c.counts.copy_(counts)
            c.hot.copy_(hot)

    @property
    def hit_rate(self) -> float:
        reads = sum(c.reads for c in self.caches)
        return sum(c.hits for c in self.caches) / max(reads, 1)


class InFlight:
    """A step's messages on their way (:meth:`BspRows.send`): :meth:`wait` for the rows they read, the step's
    mean loss and its mean dense gradient."""

    def __init__(self, bsp: BspRows, pending: PendingStep, clock: int, reads: Any) -> None:
        self.bsp, self.pending, self.clock, self.reads = bsp, pending, clock, reads

    def wait(self) -> tuple[StepRows | None, float, torch.Tensor | None]:
        got, mean_loss, dense = self.pending.wait()
        if self.reads is None:
            return None, mean_loss, dense
        uniq, inverse, pull, held_at = self.reads
        caches, values = self.bsp.caches, []
        for i, u in enumerate(uniq):
            if not caches:
                values.append(got[i])
                continue
            held, slots = held_at[i]
            v = torch.empty(len(u), self.bsp.dim)
            v[held] = caches[i].values[slots]
            v[~held] = got[i]
            caches[i].admit(pull[i], got[i], self.clock + 1)
            values.append(v)
        return StepRows(uniq, inverse, values, None if caches else self.pending.routes), mean_loss, dense
