"""A resumable, reshardable distributed batch loader keyed by a *global* sample position.

Step s consumes the global samples [s*G, (s+1)*G) of a seeded per-epoch permutation (G = global batch).
Within a step, micro-batch m of data-parallel rank r holds positions ``(m*dp + r)*mb ... + mb``.
A dataset with an ``at_positions(positions, seed)`` method (raw files tokenized on the fly) orders its samples
itself, by the same global positions. The position is independent of the world size, so a job can stop
at 4 ranks and resume at 2 over exactly the samples it has not seen yet; and any split of the global
batch averages to the same loss as one process taking it whole.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch.utils.data import Dataset

from disttrain.data.permutation import TABLE_LIMIT, Feistel


def collate(items: Sequence[Any]) -> Any:
    """Stack a list of samples: tensors, tuples/lists of tensors, or dicts of tensors."""
    first = items[0]
    if isinstance(first, torch.Tensor):
        return torch.stack(list(items))
    if isinstance(first, (tuple, list)):
        return type(first)(collate([it[i] for it in items]) for i in range(len(first)))
    if isinstance(first, dict):
        return {k: collate([it[k] for it in items]) for k in first}
    if isinstance(first, (int, float)):
        return torch.tensor(items)
    raise TypeError(
        f"cannot batch samples of type {type(first).__name__}; a dataset item must be a tensor, "
        "a tuple/list of tensors or a dict of tensors"
    )


class GlobalBatchLoader:
    """Yields this rank's micro-batches for each optimizer step; ``state_dict`` is the global position."""

    def __init__(
        self,
        dataset: Dataset[Any],
        micro_batch: int,
        accum_steps: int,
        dp_rank: int = 0,
        dp_size: int = 1,
        seed: int = 0,
        shuffle: bool = True,
    ) -> None:
        self.dataset = dataset
        self.n = len(dataset)  # type: ignore[arg-type]
        # a dataset that orders itself (raw files tokenized on the fly) maps positions to samples on its own
        self._at_positions = getattr(dataset, "at_positions", None)
        self.micro_batch = micro_batch
        self.accum_steps = accum_steps
        self.dp_rank = dp_rank
        self.dp_size = dp_size
        self.seed = seed
        self.shuffle = shuffle
        self.global_batch = micro_batch * accum_steps * dp_size
        if self._at_positions is None and self.n < self.global_batch:
            raise ValueError(
                f"the dataset has {self.n} samples, fewer than one global batch ({self.global_batch}); "
                "lower --train.global_batch or use more data"
            )
        self.position = 0  # global samples consumed
        self._epoch = -1
        self._perm: torch.Tensor | Feistel | None = None

    def _index(self, pos: int) -> int:
        epoch, offset = divmod(pos, self.n)
        if not self.shuffle:
            return offset
        if epoch != self._epoch:
            key = self.seed * 7919 + epoch
            if self.n > TABLE_LIMIT:  # O(1) memory: RSS does not grow with the corpus
                self._perm = Feistel(self.n, key)
            else:
                self._perm = torch.randperm(self.n, generator=torch.Generator().manual_seed(key))
            self._epoch = epoch
        assert self._perm is not None
        return int(self._perm(offset) if isinstance(self._perm, Feistel) else self._perm[offset])

    def _samples(self, positions: list[int]) -> list[Any]:
        if self._at_positions is not None:
            return list(self._at_positions(positions, self.seed))
        return [self.dataset[self._index(p)] for p in positions]

    def micro_batch_positions(self, step_start: int, m: int) -> list[int]:
        base = step_start + (m * self.dp_size + self.dp_rank) * self.micro_batch
        return list(range(base, base + self.micro_batch))

    def next_step(self) -> list[Any]:
        """The ``accum_steps`` micro-batches of this rank for the next optimizer step."""
        start = self.position
        out = [collate(self._samples(self.micro_batch_positions(start, m))) for m in range(self.accum_steps)]
        self.position += self.global_batch
        return out

    def state_dict(self) -> dict[str, int]:
        return {"position": self.position, "seed": self.seed}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.position = int(state["position"])
        self.seed = int(state.get("seed", self.seed))
        self._epoch = -1


def eval_batches(dataset: Dataset[Any], micro_batch: int, n_batches: int, dp_rank: int, dp_size: int) -> list[Any]:
    """A fixed, evenly spread evaluation set, split across data-parallel ranks (same at every eval)."""
    n = len(dataset)  # type: ignore[arg-type]
    total = micro_batch * n_batches * dp_size
    stride = max(n // total, 1)
    idx = [(i * stride) % n for i in range(total)]
    mine = idx[dp_rank::dp_size]
    return [collate([dataset[i] for i in mine[b * micro_batch : (b + 1) * micro_batch]]) for b in range(n_batches)]


def to_device(batch: Any, device: torch.device) -> Any:
    """``batch`` (a tensor, or tuples / lists / dicts of them) moved to ``device``; other leaves as they are."""
    if isinstance(batch, torch.Tensor):
        return batch.to(device, non_blocking=True)
    if isinstance(batch, (tuple, list)):
        return type(batch)(to_device(b, device) for b in batch)
    if isinstance(batch, dict):
        return {k: to_device(v, device) for k, v in batch.items()}
    return batch
