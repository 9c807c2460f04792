"""A trainer's cache of one table's hot rows, with bounded staleness (HET, VLDB 2022).

Click ids are Zipf-skewed: a few thousand rows take most lookups. A row the trainer reads often is kept
after its pull and read from here for ``staleness`` more steps; the gradients it gets meanwhile are summed
here and pushed once, when its window ends (or at a sync point: checkpoints, evaluations, the last step),
then it is pulled fresh the next time it is needed. So a cached row is at most ``staleness`` steps behind
the servers, and each trainer's own updates to it reach the servers at most ``staleness`` steps late.
``staleness`` 0: every row is pushed at the step it was read and pulled again for the next one, which is
exactly BSP without a cache.

Which rows are hot is learned from the trainer's own reads: every distinct id of a batch counts once; the
``capacity`` most counted rows may be kept (the choice is refreshed at steps 1, 2, 4, ... 64, then every 64).
"""

from __future__ import annotations

import torch

REFRESH_EVERY = 64


class RowCache:
    """Rows of a ``rows`` x ``dim`` table kept by one trainer: at most ``capacity``, each for ``staleness`` + 1
    steps from its pull."""

    def __init__(self, rows: int, dim: int, capacity: int, staleness: int) -> None:
        self.capacity, self.staleness = min(capacity, rows), staleness
        self.counts = torch.zeros(rows, dtype=torch.int32)
        self.hot = torch.zeros(rows, dtype=torch.bool)
        self.slot_of = torch.full((rows,), -1, dtype=torch.int64)
        self.ids = torch.full((self.capacity,), -1, dtype=torch.int64)
        self.values = torch.zeros(self.capacity, dim)
        self.acc = torch.zeros(self.capacity, dim)
        self.pulled_at = torch.zeros(self.capacity, dtype=torch.int64)
        self.hits = self.reads = 0

    def count(self, uniq: torch.Tensor, step: int) -> None:
        """Step ``step`` reads the distinct rows ``uniq``; refresh which rows are hot when it is time."""
        self.counts.index_add_(0, uniq, torch.ones(len(uniq), dtype=torch.int32))
        if step + 1 in (1, 2, 4, 8, 16, 32) or (step + 1) % REFRESH_EVERY == 0:
            self.hot.zero_()
            top = torch.topk(self.counts, self.capacity).indices
            self.hot[top[self.counts[top] > 0]] = True

    def split(self, uniq: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Of the distinct rows ``uniq`` a step reads: (the mask of those held here, their slots)."""
        slots = self.slot_of[uniq]
        held = slots >= 0
        self.hits += int(held.sum())
        self.reads += len(uniq)
        return held, slots[held]

    def admit(self, ids: torch.Tensor, values: torch.Tensor, step: int) -> torch.Tensor:
        """Keep the hot ones of rows ``ids`` just pulled (read at ``step``) while there is room; the mask of
        ``ids`` kept."""
        want = self.hot[ids]
        free = (self.ids < 0).nonzero(as_tuple=True)[0]
        take = want.nonzero(as_tuple=True)[0][: len(free)]
        slots = free[: len(take)]
        kept = torch.zeros(len(ids), dtype=torch.bool)
        kept[take] = True
        self.ids[slots] = ids[take]
        self.slot_of[ids[take]] = slots
        self.values[slots] = values[take]
        self.acc[slots] = 0.0
        self.pulled_at[slots] = step
        return kept

    def add_grads(self, slots: torch.Tensor, grads: torch.Tensor) -> None:
        self.acc.index_add_(0, slots, grads)

    def expire(self, step: int, flush: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
        """After step ``step``: the rows whose window ends (all of them if ``flush``) leave the cache; their
        (ids, summed gradients) to push."""
        live = self.ids >= 0
        ending = live if flush else live & (self.pulled_at + self.staleness <= step)
        slots = ending.nonzero(as_tuple=True)[0]
        ids, grads = self.ids[slots], self.acc[slots]
        self.slot_of[ids] = -1
        self.ids[slots] = -1
        return ids, grads

    def clear(self) -> None:
        """Hold no row (their values and gradients are dropped; the counts stay)."""
        held = self.ids[self.ids >= 0]
        self.slot_of[held] = -1
        self.ids.fill_(-1)

    @property
    def hit_rate(self) -> float:
        return self.hits / max(self.reads, 1)
