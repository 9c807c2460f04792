"""One trainer's loop: pull the rows its batch needs, forward the dense part, push the rows' gradients.

Every global batch of ``batch x trainers`` samples is drawn from the step's own generator and split by
trainer, so BSP over T trainers sees the same data as one trainer with the combined batch, and equals it:
each trainer pushes ``grad / T`` (its share of the global mean), the servers apply a step's pushes as one
update, and DDP averages the dense gradients over the trainers' process group.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from disttrain.ps.clicks import ClickLog, auc
from disttrain.ps.client import TableClient
from disttrain.ps.config import PSConfig
from disttrain.ps.model import DenseArch


@dataclass
class PSResult:
    losses: list[float] = field(default_factory=list)
    evals: list[dict[str, float]] = field(default_factory=list)
    samples_per_s: float = 0.0
    bytes_per_step: float = 0.0


class PSTrainer:
    """Trainer ``rank`` of ``cfg.trainers``; ``group``: the trainers' process group is the default one (None:
    a lone trainer)."""

    def __init__(self, cfg: PSConfig, rank: int, servers: list[str], group: Any = None) -> None:
        self.cfg, self.rank, self.group = cfg, rank, group
        self.log = ClickLog(list(cfg.tables), cfg.n_dense, seed=cfg.seed)
        self.tables = [TableClient(f"t{i}", rows, cfg.dim, servers, cfg.sharding) for i, rows in enumerate(cfg.tables)]
        torch.manual_seed(cfg.seed)
        model = DenseArch(cfg.n_dense, len(cfg.tables), cfg.dim, cfg.hidden)
        self.model: nn.Module = nn.parallel.DistributedDataParallel(model) if group else model
        self.opt = torch.optim.Adam(self.model.parameters(), lr=cfg.dense_lr)
        self.eval_batch = self.log.batch(cfg.eval_samples, torch.Generator().manual_seed(cfg.seed + 999_983))

    def create_tables(self) -> None:
        for t in self.tables:
            t.create(optimizer=self.cfg.optimizer, lr=self.cfg.lr, seed=self.cfg.seed + 17)

    def my_batch(self, step: int) -> Any:
        cfg = self.cfg
        b = self.log.batch(cfg.batch * cfg.trainers, torch.Generator().manual_seed(cfg.seed * 100_003 + step))
        part = slice(self.rank * cfg.batch, (self.rank + 1) * cfg.batch)
        b.dense, b.ids, b.label = b.dense[part], b.ids[part], b.label[part]
        return b

    def lookup(self, ids: torch.Tensor) -> torch.Tensor:
        return torch.stack([t.pull(ids[:, i]) for i, t in enumerate(self.tables)], dim=1)

    def step(self, step: int) -> float:
        cfg = self.cfg
        b = self.my_batch(step)
        embs = self.lookup(b.ids).requires_grad_()
        loss = F.binary_cross_entropy_with_logits(self.model(b.dense, embs), b.label)
        self.opt.zero_grad(set_to_none=True)
        loss.backward()
        assert embs.grad is not None
        together = (step, self.rank, cfg.trainers) if cfg.mode == "bsp" else None
        for i, t in enumerate(self.tables):
            t.push(b.ids[:, i], embs.grad[:, i] / cfg.trainers, together)
        self.opt.step()
        return self._mean(float(loss.detach()))

    def _mean(self, x: float) -> float:
        if self.group is None:
            return x
        t = torch.tensor([x], dtype=torch.float64)
        dist.all_reduce(t)
        return float(t) / self.cfg.trainers

    @torch.no_grad()
    def evaluate(self) -> dict[str, float]:
        b = self.eval_batch
        logits = torch.cat([self.model(b.dense[i : i + 4096], self.lookup(b.ids[i : i + 4096]))
                            for i in range(0, len(b.label), 4096)])  # fmt: skip
        return {"auc": auc(logits, b.label), "logloss": float(F.binary_cross_entropy_with_logits(logits, b.label)),
                "ceiling_auc": auc(self.log.logits(b.dense, b.ids), b.label)}  # fmt: skip

    def fit(self, on_step: Any = None) -> PSResult:
        cfg, res = self.cfg, PSResult()
        t0 = time.perf_counter()
        for step in range(cfg.steps):
            res.losses.append(self.step(step))
            last = step + 1 == cfg.steps
            if self.rank == 0 and ((cfg.eval_every and (step + 1) % cfg.eval_every == 0) or last):
                res.evals.append({"step": step + 1, **self.evaluate()})
            if on_step is not None:
                on_step(step + 1, res)
        res.samples_per_s = cfg.steps * cfg.batch * cfg.trainers / (time.perf_counter() - t0)
        res.bytes_per_step = sum(t.bytes_moved for t in self.tables) / cfg.steps
        return res
