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
from disttrain.ps.client import Routes, TableGroup


@dataclass
class StepRows:
    """One step's distinct rows per table, where each sample's id is among them, and their values."""

    uniq: list[torch.Tensor]
    inverse: list[torch.Tensor]
    values: list[torch.Tensor]
    routes: Routes | None = None
    """Where ``uniq`` live (when all of them were pulled: no cache), for the push of their gradients."""

    def embeddings(self) -> torch.Tensor:
        """(batch, tables, dim) rows of the step's samples."""
        return torch.stack([v[inv] for v, inv in zip(self.values, self.inverse, strict=True)], dim=1)


class BspRows:
    """The rows a BSP trainer trains on: ``group``'s tables, ``caches`` (one per table; empty: no cache)."""

    def __init__(self, group: TableGroup, caches: list[RowCache], rank: int, trainers: int) -> None:
        self.group, self.caches, self.rank, self.trainers = group, caches, rank, trainers
        self.dim = group.tables[0].dim
        self.epoch = 0  # roll-backs so far (a spare server took a dead one's place)

    def first(self, step: int, ids: torch.Tensor, every_ids: torch.Tensor, resumed: bool) -> StepRows:
        """The rows ``ids`` of the run's first step ``step`` (an exchange that pushes nothing; ``every_ids``:
        every trainer's); ``resumed``: the loaded counts hold this step's reads (counted before the checkpoint)."""
        empty = [torch.empty(0, dtype=torch.int64) for _ in self.group.tables]
        grads = [torch.empty(0, self.dim) for _ in self.group.tables]
        rows, _, _ = self._exchange(empty, grads, step - 1, (ids, every_ids), 0.0, None, count=not resumed)
        return rows

    def step(
        self,
        step: int,
        rows: StepRows,
        grads: torch.Tensor,
        next_ids: tuple[torch.Tensor, torch.Tensor] | None,
        loss: float,
        dense_grad: torch.Tensor | None,
        sync: bool,
    ) -> tuple[StepRows | None, float, torch.Tensor | None]:
        """Push step ``step``'s ``grads`` ((batch, tables, dim), already divided by the trainers) of ``rows``,
        read the rows of ``next_ids`` (this trainer's ids of the next step, and every trainer's: all trainers
        count the same reads, so they keep the same hot rows; None: the last step). ``sync``: every cached
        row is pushed and dropped (a checkpoint, an evaluation or the end follows). The next step's rows, the
        mean loss and dense gradient."""
        push_ids, push_grads = [], []
        for i, (uniq, inv) in enumerate(zip(rows.uniq, rows.inverse, strict=True)):
            summed = torch.zeros(len(uniq), self.dim).index_add_(0, inv, grads[:, i])
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
        return self._exchange(push_ids, push_grads, step, next_ids, loss, dense_grad, routes=rows.routes)

    def _exchange(
        self,
        push_ids: list[torch.Tensor],
        push_grads: list[torch.Tensor],
        clock: int,
        next_ids: tuple[torch.Tensor, torch.Tensor] | None,
        loss: float,
        dense_grad: torch.Tensor | None,
        count: bool = True,
        routes: Routes | None = None,
    ) -> Any:
        if next_ids is None:
            pull = [torch.empty(0, dtype=torch.int64) for _ in self.group.tables]
            _, mean_loss, dense = self.group.exchange(
                push_ids, push_grads, pull, (clock, self.rank, self.trainers, loss), dense_grad, self.epoch, routes
            ).wait()
            return None, mean_loss, dense
        mine, every = next_ids
        uniq, inverse, pull, held_at = [], [], [], []
        for i in range(mine.shape[1]):
            u, inv = torch.unique(mine[:, i], return_inverse=True)
            uniq.append(u)
            inverse.append(inv)
            if self.caches:
                if count:
                    self.caches[i].count(torch.unique(every[:, i]), clock + 1)
                held, slots = self.caches[i].split(u)
                held_at.append((held, slots))
                pull.append(u[~held])
            else:
                pull.append(u)
        step = (clock, self.rank, self.trainers, loss)
        pending = self.group.exchange(push_ids, push_grads, pull, step, dense_grad, self.epoch, routes)
        got, mean_loss, dense = pending.wait()
        values = []
        for i, u in enumerate(uniq):
            if not self.caches:
                values.append(got[i])
                continue
            held, slots = held_at[i]
            v = torch.empty(len(u), self.dim)
            v[held] = self.caches[i].values[slots]
            v[~held] = got[i]
            self.caches[i].admit(pull[i], got[i], clock + 1)
            values.append(v)
        return StepRows(uniq, inverse, values, None if self.caches else pending.routes), mean_loss, dense

    def roll_back(self, epoch: int) -> None:
        """Forget every cached row (the servers are back at a checkpoint, where the caches were empty)."""
        self.epoch = epoch
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
