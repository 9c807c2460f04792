"""One trainer's loop: pull the rows its batch needs, forward the dense part, push the rows' gradients.

Every global batch of ``batch x trainers`` samples is drawn from the step's own generator and split by
trainer, so BSP over T trainers sees the same data as one trainer with the combined batch, and equals it:
each trainer pushes ``grad / T`` (its share of the global mean), the servers apply a step's pushes as one
update, and DDP averages the dense gradients over the trainers' process group.
"""

from __future__ import annotations

import functools
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.utils import parameters_to_vector, vector_to_parameters

from disttrain.errors import RpcError
from disttrain.health.events import log_event
from disttrain.health.monitor import HealthMonitor
from disttrain.ps import checkpoint as ps_checkpoint
from disttrain.ps import server, takeover
from disttrain.ps.bsp_loop import BspLoop
from disttrain.ps.bsp_step import BspRows, StepRows
from disttrain.ps.cache import RowCache
from disttrain.ps.clicks import Batch, ClickLog, CriteoFile, auc
from disttrain.ps.client import TableClient, TableGroup
from disttrain.ps.config import PSJobConfig
from disttrain.ps.model import DenseArch
from disttrain.rpc import transport
from disttrain.utils import hooks

LOST_KEY = "ps/lost/{rank}"
"""Set in the job's store by the launcher when trainer ``rank`` died and the others go on (asp)."""


@dataclass
class PSResult:
    losses: list[float] = field(default_factory=list)
    evals: list[dict[str, float]] = field(default_factory=list)
    staleness: list[int] = field(default_factory=list)
    """ssp / asp: per step, how many steps this trainer was ahead of the slowest when it read."""
    samples_per_s: float = 0.0
    bytes_per_step: float = 0.0
    step_s: list[float] = field(default_factory=list)
    """Per step: seconds (reads, forward/backward, pushes, waits; not checkpoints or evaluations)."""
    step_cpu_s: list[float] = field(default_factory=list)
    """Per step: this process's CPU seconds over the same span, every thread (a colocated server's, RPC's):
    what the step costs the machine, whatever share of the cores a busy machine leaves it."""
    step_bytes: list[int] = field(default_factory=list)
    """Per step: bytes this trainer moved to and from the servers."""
    cache_hit_rate: float = 0.0
    """bsp with a cache: the share of distinct rows read that the cache served."""


class PSTrainer:
    """Trainer ``rank`` of ``cfg.ps.trainers``; ``group``: the trainers' process group is the default one (None:
    a lone trainer)."""

    def __init__(
        self,
        cfg: PSJobConfig,
        rank: int,
        servers: list[str],
        group: Any = None,
        run_dir: Path | None = None,
        health: HealthMonitor | None = None,
    ) -> None:
        self.cfg, self.train = cfg.ps, cfg.train  # the [ps] and [train] sections
        self.checkpoint_interval = cfg.checkpoint.interval
        self.rank, self.group, self.servers, self.run_dir = rank, group, servers, run_dir
        self.health = health
        self.start = 0
        self.staleness: list[int] = []
        ps, train = cfg.ps, cfg.train
        self.log: ClickLog | CriteoFile = (
            ClickLog(list(ps.tables), ps.n_dense, seed=train.seed)
            if ps.data_path is None
            else CriteoFile(ps.data_path, list(ps.tables), train.eval_samples)
        )
        sizes = self.log.tables
        self.tables = [TableClient(f"t{i}", rows, ps.dim, servers, ps.sharding) for i, rows in enumerate(sizes)]
        self.group_tables = TableGroup(self.tables)
        torch.manual_seed(train.seed)
        model = DenseArch(ps.n_dense, len(sizes), ps.dim, ps.hidden)
        self.dense_on_server, self.dense_where = ps.dense_on_server, ps.dense_where
        ddp = group is not None and self.dense_where == "ddp"
        self.model: nn.Module = nn.parallel.DistributedDataParallel(model) if ddp else model
        caches = [RowCache(rows, ps.dim, ps.cache_rows, ps.cache_staleness) for rows in sizes] if ps.caching else []
        self.bsp = BspRows(self.group_tables, caches, rank, ps.trainers) if ps.mode == "bsp" else None
        self.loop = BspLoop(self, self.bsp, ps.overlapped) if self.bsp is not None else None
        self.counts_loaded = False
        self.spares = [f"spare{i}" for i in range(ps.spare_servers)]
        self.lost: list[int] = []  # asp: trainers that died while the others went on
        self._lost_checked = 0.0
        self.opt = torch.optim.Adam(self.model.parameters(), lr=ps.dense_lr, fused=True)
        self.eval_batch = self.log.held_out(train.eval_samples, train.seed)

    def table_options(self) -> dict[str, Any]:
        return {"optimizer": self.cfg.optimizer, "lr": self.cfg.lr, "seed": self.train.seed + 17}

    def create_tables(self) -> None:
        for t in self.tables:
            t.create(**self.table_options())
        if self.dense_on_server:
            flat = parameters_to_vector(self.model.parameters()).detach()
            transport.call(self.servers[0], server.create_dense, flat, self.cfg.dense_lr)

    def global_batch(self, step: int) -> Batch:
        """Step ``step``'s samples of every trainer."""
        batch, trainers, seed = self.train.batch, self.cfg.trainers, self.train.seed
        return self.log.batch(batch * trainers, torch.Generator().manual_seed(seed * 100_003 + step))

    def my_part(self, b: Batch) -> Batch:
        part = slice(self.rank * self.train.batch, (self.rank + 1) * self.train.batch)
        return Batch(b.dense[part], b.ids[part], b.label[part])

    def my_batch(self, step: int) -> Batch:
        return self.my_part(self.global_batch(step))

    def lookup(self, ids: torch.Tensor) -> torch.Tensor:
        return self.group_tables.pull(ids)

    def notice_lost(self, at_once: bool = False) -> None:
        """asp, trainer 0: the trainers the launcher found dead (:data:`LOST_KEY` in the store) leave server 0's
        clocks and the watchdog, and the summary names them; looked for at most once a second (``at_once``:
        now)."""
        now = time.monotonic()
        if self.rank != 0 or not self.cfg.outlives_trainers or (now < self._lost_checked + 1.0 and not at_once):
            return
        self._lost_checked = now
        store = transport.store()
        for r in range(1, self.cfg.trainers):
            if r not in self.lost and store.check([LOST_KEY.format(rank=r)]):
                self.lost.append(r)
                transport.call(self.servers[0], server.retire, r)
                if self.health is not None:
                    self.health.leave_out(r)

    def wait_turn(self, step: int) -> int:
        """ssp: wait until the slowest trainer is at most ``staleness`` steps behind; how far behind it was."""
        cfg = self.cfg
        if cfg.mode == "bsp" or cfg.trainers == 1:
            return 0
        if cfg.mode == "ssp":
            slowest = transport.call(self.servers[0], server.wait_for_clock, step - cfg.staleness, cfg.trainers)
        else:
            slowest = transport.call(self.servers[0], server.tick, self.rank, step, cfg.trainers)
        return step - slowest

    def phase(self, name: str) -> None:
        if self.health is not None:
            self.health.phase(name)

    def step(self, step: int) -> list[tuple[int, float]]:
        """Step ``step``; the (step, loss) of the steps it completed (an overlapped BSP step completes the one
        before it)."""
        if self.loop is not None:
            return self.loop.step(step)
        cfg = self.cfg
        self.phase("data")
        self.notice_lost()
        self.staleness.append(self.wait_turn(step))
        hooks.fire("ps_step", step, self.rank)
        b = self.my_batch(step)
        self.phase("forward")  # pulls included
        if self.dense_on_server:
            vector_to_parameters(transport.call(self.servers[0], server.pull_dense), self.model.parameters())
        embs = self.lookup(b.ids).requires_grad_()
        loss = F.binary_cross_entropy_with_logits(self.model(b.dense, embs), b.label)
        self.phase("backward")
        self.opt.zero_grad(set_to_none=True)
        loss.backward()
        assert embs.grad is not None
        self.phase("optimizer")  # pushes included
        own = float(loss.detach())
        self.group_tables.push(b.ids, embs.grad / cfg.trainers, cfg.combine_pushes)
        if self.dense_on_server:
            self._push_dense(step)
        else:
            self.opt.step()
        if cfg.trainers > 1:  # ssp / asp (bsp steps are the loop's)
            transport.call(self.servers[0], server.tick, self.rank, step + 1, cfg.trainers)
        return [(step, own)]

    def forward_backward(self, b: Batch, rows: StepRows) -> tuple[torch.Tensor, torch.Tensor]:
        """The forward and backward of batch ``b`` on ``rows``: the rows (their ``.grad`` filled) and the loss."""
        if self.dense_on_server:
            vector_to_parameters(transport.call(self.servers[0], server.pull_dense), self.model.parameters())
        embs = rows.embeddings().requires_grad_()
        loss = F.binary_cross_entropy_with_logits(self.model(b.dense, embs), b.label)
        self.phase("backward")
        self.opt.zero_grad(set_to_none=True)
        loss.backward()
        return embs, loss

    def dense_grad(self) -> torch.Tensor | None:
        """The dense gradient a BSP step's message carries (``ps.dense trainers``)."""
        return self._flat_grad() if self.dense_where == "trainers" else None

    def apply_dense(self, step: int, mean: torch.Tensor | None) -> None:
        """The dense part's step ``step``: Adam on the trainers' mean gradient (``mean``, from the step's
        message), on DDP's, or pushed to server 0."""
        if mean is not None:
            self._set_grad(mean)
        if self.dense_on_server:
            self._push_dense(step)
        else:
            self.opt.step()

    def syncs_after(self, done: int) -> bool:
        """Every cached row reaches the servers after step ``done``: a checkpoint, an evaluation or the end."""
        every, evals = self.checkpoint_interval, self.train.eval_interval
        return done == self.train.steps or bool(every and done % every == 0) or bool(evals and done % evals == 0)

    def _flat_grad(self) -> torch.Tensor:
        params = list(self.model.parameters())
        return parameters_to_vector([p.grad if p.grad is not None else torch.zeros_like(p) for p in params])

    def _set_grad(self, flat: torch.Tensor) -> None:
        offset = 0
        for p in self.model.parameters():
            n = p.numel()
            p.grad = flat[offset : offset + n].view_as(p).clone()
            offset += n

    def _push_dense(self, step: int) -> None:
        grad = self._flat_grad()
        if self.cfg.mode == "bsp":
            transport.call(self.servers[0], server.push_dense_together, grad, step, self.rank, self.cfg.trainers)
        else:
            transport.call(self.servers[0], server.push_dense, grad)

    @functools.cached_property
    def ceiling_auc(self) -> float:
        """The generator's own AUC on the held-out samples (computed once)."""
        return self.log.ceiling(self.eval_batch)

    @torch.no_grad()
    def evaluate(self) -> dict[str, float]:
        """AUC and log-loss on the held-out samples, and the generator's own AUC on them (its ceiling)."""
        b = self.eval_batch
        if self.dense_on_server:
            vector_to_parameters(transport.call(self.servers[0], server.pull_dense), self.model.parameters())
        embs = self.lookup(b.ids)  # every held-out row in one call per server
        logits = torch.cat(
            [self.model(b.dense[i : i + 4096], embs[i : i + 4096]) for i in range(0, len(b.label), 4096)]
        )
        return {
            "auc": auc(logits, b.label),
            "logloss": float(F.binary_cross_entropy_with_logits(logits, b.label)),
            "ceiling_auc": self.ceiling_auc,
        }

    def state(self, step: int) -> dict[str, Any]:
        extra = {"cache": self.bsp.state()} if self.bsp is not None and self.bsp.caches else {}
        if self.dense_on_server:
            return {"dense_server": transport.call(self.servers[0], server.dense_state), "step": step, **extra}
        model = self.model.module if isinstance(self.model, nn.parallel.DistributedDataParallel) else self.model
        return {"model": model.state_dict(), "opt": self.opt.state_dict(), "step": step, **extra}

    def load_state(self, state: dict[str, Any]) -> None:
        """The dense part (rank 0 restores the server's copy when it lives there) and the data position."""
        self.start = int(state["step"])
        if isinstance(self.log, CriteoFile):
            self.log.seek(self.start, self.train.batch * self.cfg.trainers)
        if "cache" in state and self.bsp is not None and self.bsp.caches:
            self.bsp.load_state(state["cache"])
            self.counts_loaded = True
        if "dense_server" in state:
            if self.rank == 0:
                transport.call(self.servers[0], server.load_dense_state, state["dense_server"])
            return
        model = self.model.module if isinstance(self.model, nn.parallel.DistributedDataParallel) else self.model
        model.load_state_dict(state["model"])
        self.opt.load_state_dict(state["opt"])

    def fit(self, on_step: Any = None) -> PSResult:
        train, res = self.train, PSResult(staleness=self.staleness)
        t0, step = time.perf_counter(), self.start
        while step < train.steps:
            try:
                self._fit_step(step, res, on_step)
            except RpcError as e:
                step = self.take_over(e)
                continue
            step += 1
        done = max(train.steps - self.start, 1)
        res.samples_per_s = done * train.batch * self.cfg.trainers / (time.perf_counter() - t0)
        res.bytes_per_step = self.group_tables.bytes_moved / done
        res.cache_hit_rate = self.bsp.hit_rate if self.bsp is not None else 0.0
        return res

    def _fit_step(self, step: int, res: PSResult, on_step: Any) -> None:
        t, cpu, moved = time.perf_counter(), time.process_time(), self.group_tables.bytes_moved
        done = self.step(step)
        res.step_s.append(time.perf_counter() - t)
        res.step_cpu_s.append(time.process_time() - cpu)
        res.step_bytes.append(self.group_tables.bytes_moved - moved)
        if self.health is not None:
            self.health.step_done(step + 1, res.step_s[-1])
        for finished, loss in done:
            res.losses.append(loss)
            self._after(finished + 1, res, on_step)

    def _after(self, done: int, res: PSResult, on_step: Any) -> None:
        """Once ``done`` steps are complete: the checkpoint, evaluation and progress due then."""
        train, every = self.train, self.checkpoint_interval
        if self.rank == 0 and self.run_dir is not None and every and done % every == 0:
            self.phase("checkpoint")
            ps_checkpoint.save(self.run_dir, done, self.servers, self.state(done))
        if self.rank == 0 and ((train.eval_interval and done % train.eval_interval == 0) or done == train.steps):
            self.phase("eval")
            res.evals.append({"step": done, **self.evaluate()})
        if on_step is not None:
            on_step(done, res)

    def take_over(self, error: RpcError) -> int:
        """A server died (``ps.spare_servers``): a spare holds its shard, everyone is back at the newest
        checkpoint (:mod:`disttrain.ps.takeover`); the step to go on from. Without a spare: ``error``."""
        if self.bsp is None or self.run_dir is None or not self.cfg.spare_servers:
            raise error
        epoch = self.bsp.epoch + 1
        self.phase("takeover")
        if self.rank == 0:
            ckpt = takeover.hand_over(self.group_tables, self.spares, self.table_options(), self.run_dir, epoch)
        else:
            ckpt = takeover.wait_for_hand_over(self.group_tables, self.spares, epoch, self.cfg.rpc_timeout_s)
        self.servers = self.group_tables.servers
        self.bsp.roll_back(epoch)
        assert self.loop is not None
        self.loop.reset()
        self.load_state(ps_checkpoint.trainer_state(ckpt))
        if self.rank == 0:
            log_event(self.run_dir, "ps_server_replaced", servers=self.servers, step=self.start, cause=str(error)[:300])
            print(f"disttrain ps: {error}; shards now on {', '.join(self.servers)}, back at step {self.start}")
        return self.start
