"""The training loop: accumulation with sync on the last micro-step only, clipping with the global grad
norm, a non-finite guard, warmup + cosine LR, periodic evaluation, metrics.

``Trainer(model, dataset, config=...)`` takes a plain ``nn.Module`` (or one built on the meta device) and
a map-style dataset of ``(input, target)`` pairs; it joins the process group torchrun set up (or runs
alone), applies the configured strategy through :func:`disttrain.parallelize`, and runs the loop. Given a
:class:`~disttrain.checkpoint.CheckpointManager`, it resumes from and saves checkpoints of its whole state.
"""

from __future__ import annotations

import dataclasses
import json
import math
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.checkpoint.stateful import Stateful
from torch.utils.data import Dataset

from disttrain.checkpoint.manager import CheckpointInfo, CheckpointManager, ModelOptimState, export_live_model
from disttrain.config import DTYPES, JobConfig, resolve_batch
from disttrain.data.loader import GlobalBatchLoader, eval_batches
from disttrain.dist.env import DistEnv, init_distributed, resolve_precision, seed_everything
from disttrain.dist.mesh import ParallelDims
from disttrain.dist.strategy import Parallelized, parallelize
from disttrain.errors import HealthError
from disttrain.health.events import log_event, restart_event
from disttrain.health.guard import StepGuard
from disttrain.health.monitor import HealthMonitor, set_collective_timeout
from disttrain.plan.estimate import auto_strategy
from disttrain.train import metrics as M
from disttrain.train.loss import LossFn, cross_entropy
from disttrain.train.optim import build_optimizer, lr_lambda, make_grad_scaler
from disttrain.utils.faults import fault_point
from disttrain.utils.gc import GarbageCollection


@dataclass
class FitResult:
    """What a run produced (identical on every rank)."""

    start_step: int = 0
    """The step training started from (> 0 after a resume); ``losses[i]`` is step start_step + i + 1."""
    losses: list[float] = field(default_factory=list)
    grad_norms: list[float] = field(default_factory=list)
    val_losses: dict[int, float] = field(default_factory=dict)
    skipped_steps: int = 0
    tokens_per_s: float = 0.0
    mfu: float = 0.0
    peak_memory_bytes: list[int] = field(default_factory=list)


class Trainer:
    """Runs the built-in loop on any model + dataset + loss."""

    def __init__(
        self,
        model: nn.Module,
        train_data: Dataset[Any],
        config: JobConfig | None = None,
        *,
        loss_fn: LossFn = cross_entropy,
        val_data: Dataset[Any] | None = None,
        run_dir: str | Path | None = None,
        env: DistEnv | None = None,
        checkpoint: CheckpointManager | None = None,
        dims: ParallelDims | None = None,
    ) -> None:
        self.cfg = cfg = config or JobConfig()
        # collectives get the long start-up timeout until the first step is done (then parallel.timeout_s)
        self.env = env or init_distributed(
            cfg.parallel.device, max(cfg.parallel.timeout_s, cfg.health.startup_timeout_s)
        )
        self.cfg = cfg = dataclasses.replace(cfg, precision=resolve_precision(cfg.precision, self.env.device.type))
        self.run_dir = Path(run_dir) if run_dir is not None else None
        self.loss_fn = loss_fn
        self.checkpoint = checkpoint
        if cfg.train.deterministic:
            torch.use_deterministic_algorithms(True)
        if "anomaly" in cfg.health.debug_presets:
            torch.autograd.set_detect_anomaly(True)  # names the op that produced a NaN in backward (slow)
        seed_everything(cfg.train.seed)
        self.strategy_reason = "forced by parallel.strategy"
        self.dims = dims or self._choose_dims(model, train_data, loss_fn)
        self.plan = resolve_batch(cfg.train, self.dims.dp_size)
        dp_rank = self.env.rank
        self.loader = GlobalBatchLoader(
            train_data, self.plan.micro_batch, self.plan.accum_steps, dp_rank, self.dims.dp_size, cfg.train.seed
        )
        sample_x = self.loader.dataset[0][0]
        self.tokens_per_sample = sample_x.numel() if not sample_x.is_floating_point() else 1
        self.flops_per_sample = M.flops_per_sample(model, sample_x)  # before sharding: the whole model's
        self.model: Parallelized = parallelize(
            model, cfg.parallel, cfg.precision, dims=self.dims, device=self.env.device
        )
        self.optimizer = build_optimizer(self.model.module, cfg)
        self._app_state = ModelOptimState(self.model.module, self.optimizer)  # one for the job: it keeps a cache
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(self.optimizer, lr_lambda(cfg))
        self.val = (
            eval_batches(val_data, self.plan.micro_batch, cfg.train.eval_batches, dp_rank, self.dims.dp_size)
            if val_data is not None
            else None
        )
        self.scaler = make_grad_scaler(cfg.precision.dtype, self.dims, self.env.device)
        self.step = 0
        self.skipped = 0
        dtype = DTYPES[cfg.precision.dtype]
        self.peak, self.peak_source = M.peak_tflops(self.env.device, dtype, cfg.metrics.peak_tflops)
        self.health = HealthMonitor(
            cfg.health, self.env.rank, self.env.world_size, self.run_dir, cfg.parallel.timeout_s
        )
        self.guard = StepGuard(cfg.health)

    def _choose_dims(self, model: nn.Module, train_data: Dataset[Any], loss_fn: LossFn) -> ParallelDims:
        """The layout when the caller gave none: ``auto`` from the memory plan over several ranks."""
        cfg, env = self.cfg, self.env
        strategy = None
        if cfg.parallel.strategy == "auto" and env.world_size > 1:
            strategy, self.strategy_reason = auto_strategy(
                model, train_data[0], cfg, env.world_size, env.local_world_size, loss_fn
            )
        return ParallelDims.from_config(cfg.parallel, env.world_size, env.local_world_size, strategy)

    # -- one step -------------------------------------------------------------------------------
    def _to_device(self, batch: Any) -> Any:
        if isinstance(batch, torch.Tensor):
            return batch.to(self.env.device, non_blocking=True)
        if isinstance(batch, (tuple, list)):
            return type(batch)(self._to_device(b) for b in batch)
        if isinstance(batch, dict):
            return {k: self._to_device(v) for k, v in batch.items()}
        return batch

    def _all_reduce_mean(self, values: list[float]) -> list[float]:
        t = torch.tensor(values, dtype=torch.float64, device=self._comm_device())
        if self.env.distributed:
            dist.all_reduce(t)
            t /= self.env.world_size
        return t.tolist()

    def _comm_device(self) -> torch.device:
        return self.env.device if self.env.device.type == "cuda" else torch.device("cpu")

    def train_step(self) -> tuple[float, float, bool]:
        """One optimizer step over ``accum_steps`` micro-batches: (mean loss, grad norm, stepped?)."""
        health = self.health
        health.phase("data")
        fault_point("step", self.step + 1, self.env.rank)  # tests: DISTTRAIN_FAULT=step:<k>:<rank>
        micro = self.loader.next_step()
        n = len(micro)
        loss_sum = torch.zeros((), device=self.env.device)
        for i, batch in enumerate(micro):
            x, y = self._to_device(batch)
            health.phase("forward")
            with self.model.sync(i == n - 1):
                with self.model.autocast():
                    out = self.model(x)
                loss = self.loss_fn(out, y)
                if i == 0:
                    health.inject_faults(self.step + 1)  # tests: DISTTRAIN_FAULT=hang|slow:<k>:<rank>
                    if health.nan_fault(self.step + 1):  # tests: DISTTRAIN_FAULT=nan:<k>:<rank>
                        loss = loss * float("nan")
                scaled = loss / n
                health.phase("backward")
                (self.scaler.scale(scaled) if self.scaler else scaled).backward()
            loss_sum += loss.detach().float()
        health.phase("optimizer")
        if self.scaler:
            self.scaler.unscale_(self.optimizer)  # clip and measure true gradients
        grad_norm = self.model.clip_grad_norm_(self.cfg.optim.grad_clip)
        (loss_mean,) = self._all_reduce_mean([float(loss_sum) / n])
        # Both figures are global (all-reduced), so every rank takes the same decision.
        bad = self.guard.check(loss_mean, grad_norm)  # None | "nonfinite" | "spike"
        skip = bad == "spike" or (bad == "nonfinite" and self.cfg.train.skip_nonfinite)
        if self.checkpoint is not None:
            self.checkpoint.wait_for_staging()  # an async save may still be copying the state it saves
        if not skip:
            if self.scaler:
                self.scaler.step(self.optimizer)
            else:
                self.optimizer.step()
        else:
            self.skipped += 1
        self.guard.record(bad if skip else None, loss_mean)
        if self.scaler:
            self.scaler.update()  # an fp16 overflow lowers the scale for the next step
        self.optimizer.zero_grad(set_to_none=True)
        self.scheduler.step()
        self.step += 1
        return loss_mean, grad_norm, bad is None

    @torch.no_grad()
    def evaluate(self) -> float:
        """Mean loss over the fixed validation batches, averaged over ranks."""
        if not self.val:
            return float("nan")
        self.model.module.eval()
        total = 0.0
        for batch in self.val:
            x, y = self._to_device(batch)
            with self.model.autocast():
                out = self.model(x)
            total += float(self.loss_fn(out, y))
        self.model.module.train()
        (mean,) = self._all_reduce_mean([total / len(self.val)])
        return mean

    # -- checkpoints ------------------------------------------------------------------------------
    def state(self) -> dict[str, Any]:
        """Everything an exact resume needs, as DCP Stateful objects."""
        return {"app": self._app_state, "train": _LoopState(self)}

    def resume(self) -> CheckpointInfo | None:
        """Load the checkpoint ``checkpoint.resume`` names (auto: the newest complete one), if any."""
        if self.checkpoint is None:
            return None
        info = self.checkpoint.resolve(self.cfg.checkpoint.resume)
        if info is not None:
            self.checkpoint.load(self.state(), info)
        return info

    def _save_final(self) -> None:
        ck, mode = self.checkpoint, self.cfg.checkpoint.save_final
        if ck is None:
            return
        if mode == "full" and ck.last_saved_step != self.step:
            ck.save(self.step, self.state())
        elif mode == "model_only" and self.run_dir is not None:
            export_live_model(self.model.module, self.run_dir / "model.safetensors", self.cfg.checkpoint.export_dtype)
        ck.close()

    # -- the loop ---------------------------------------------------------------------------------
    def fit(self) -> FitResult:
        """Train to ``train.steps`` (resuming first if a checkpoint says so); the collector runs on schedule."""
        with GarbageCollection(self.cfg.train.gc_interval) as collector:
            return self._fit(collector)

    def _fit(self, collector: GarbageCollection) -> FitResult:
        cfg, env = self.cfg, self.env
        resumed = self.resume()
        res = FitResult(start_step=self.step)
        sink = M.MetricsSink(self.run_dir, env.is_main, cfg.metrics.tensorboard)
        console = M.Console(env.is_main, cfg.train.steps, self.step, cfg.metrics.progress)
        console.print(
            f"strategy {self.dims.describe()} x {env.world_size} rank(s) on {env.device.type} | "
            f"global batch {self.plan.global_batch} = micro {self.plan.micro_batch} x accum "
            f"{self.plan.accum_steps} x dp {self.plan.dp_size} | {cfg.precision.dtype} | "
            f"peak {self.peak:.2f} TFLOP/s/rank ({self.peak_source})"
        )
        if cfg.parallel.strategy == "auto":
            console.print(f"strategy {self.dims.strategy}: {self.strategy_reason}")
        if resumed is not None:
            console.print(f"resumed from {resumed.path} (step {resumed.step}, sample {self.loader.position})")
        if env.is_main and (restart := restart_event(self.run_dir, resumed.step if resumed else None, env.world_size)):
            console.print(f"restart {restart['attempt']}: previous attempt ended by {restart['cause']}")
        interval = cfg.checkpoint.interval if self.checkpoint else 0
        window_t, window_steps = time.perf_counter(), 0
        self.health.start()
        try:
            while self.step < cfg.train.steps:
                t0 = time.perf_counter()
                lr = self.optimizer.param_groups[0]["lr"]
                loss, gnorm, finite = self.train_step()
                dt = time.perf_counter() - t0
                collector.step(self.step)
                self.health.step_done(self.step, dt)
                if len(res.losses) == 0:  # past the start-up: collectives get the configured timeout
                    set_collective_timeout(cfg.parallel.timeout_s)
                res.losses.append(loss)
                res.grad_norms.append(gnorm)
                window_steps += 1
                last = self.step == cfg.train.steps
                record = None
                if self.step % cfg.metrics.log_interval == 0 or last or not finite:
                    elapsed = time.perf_counter() - window_t
                    record = self._record(loss, gnorm, lr, dt, elapsed, window_steps, finite)
                    window_t, window_steps = time.perf_counter(), 0
                    res.tokens_per_s, res.mfu = record["tokens_per_s"], record["mfu"]
                    res.peak_memory_bytes = record["peak_memory_bytes"]
                if (cfg.train.eval_interval and self.step % cfg.train.eval_interval == 0) or last:
                    self.health.phase("eval")
                    t_eval = time.perf_counter()
                    val = self.evaluate()
                    window_t += time.perf_counter() - t_eval  # throughput counts training time only
                    if not math.isnan(val):
                        res.val_losses[self.step] = val
                        record = {**(record or {"step": self.step}), "val_loss": val}
                        console.print(f"step {self.step}: val loss {val:.4f}")
                if record is not None:
                    sink.write(record)
                console.step(self.step, record if record and "loss" in record else None)
                if self.guard.exhausted:
                    self._on_bad_steps(console)
                    continue
                if interval and self.step % interval == 0 and not last:
                    assert self.checkpoint is not None
                    self.health.phase("checkpoint")
                    t_save = time.perf_counter()
                    self.checkpoint.save(self.step, self.state())
                    window_t += time.perf_counter() - t_save  # kept in CheckpointManager.blocked_s
            self.health.phase("checkpoint")
            self._save_final()
        finally:
            self.health.close(finished=self.step >= cfg.train.steps)
            console.close()
            sink.close()
        res.skipped_steps = self.skipped
        return res

    def _on_bad_steps(self, console: M.Console) -> None:
        """``health.max_bad_steps`` bad steps in a row: roll back to the last checkpoint (skipping the data
        seen since, optionally lowering the LR), stop with a message, or go on (``health.on_bad_steps``)."""
        h, guard = self.cfg.health, self.guard
        what = f"{guard.consecutive} bad steps in a row (non-finite or spiking loss) up to step {self.step}"
        if h.on_bad_steps == "continue":
            log_event(self.run_dir if self.env.is_main else None, "bad_steps", step=self.step, count=guard.consecutive)
            guard.consecutive = 0
            return
        info, why = None, "health.on_bad_steps is stop"
        if h.on_bad_steps == "rollback":
            info, why = self._rollback_target()
        if info is None:
            log_event(self.run_dir if self.env.is_main else None, "stop", step=self.step, reason=f"{what}; {why}")
            raise HealthError(
                f"{what}; {why}. See loss and grad_norm in metrics.jsonl; try a lower --optim.lr or "
                "--optim.grad-clip, or --health.on-bad-steps rollback with checkpoints"
            )
        self.health.phase("rollback")
        assert self.checkpoint is not None
        from_step, position = self.step, self.loader.position
        self.checkpoint.load(self.state(), info)
        self.loader.load_state_dict({"position": position, "seed": self.loader.seed})  # skip the bad data
        if h.rollback_lr_factor != 1.0:
            sched = self.scheduler
            sched.base_lrs = [b * h.rollback_lr_factor for b in sched.base_lrs]
            factor = lr_lambda(self.cfg)(sched.last_epoch)
            for group, base in zip(self.optimizer.param_groups, sched.base_lrs, strict=True):
                group["lr"] = base * factor
        guard.rollbacks += 1
        guard.reset()
        msg = f"{what}: rolled back to step {info.step} ({info.path.name}), data position kept at sample {position}"
        log_event(
            self.run_dir if self.env.is_main else None,
            "rollback",
            from_step=from_step,
            to_step=info.step,
            lr_factor=h.rollback_lr_factor,
            rollbacks=guard.rollbacks,
        )
        console.print(msg)

    def _rollback_target(self) -> tuple[CheckpointInfo | None, str]:
        """The newest complete checkpoint, as rank 0 sees it once every rank's save is committed."""
        if self.checkpoint is None:
            return None, "no checkpoint manager to roll back with"
        if self.guard.rollbacks >= self.cfg.health.max_rollbacks:
            return None, f"health.max_rollbacks ({self.cfg.health.max_rollbacks}) reached"
        self.checkpoint.wait()
        found: list[Any] = [None]
        if self.env.distributed:
            dist.barrier()
        if self.env.is_main:
            found[0] = self.checkpoint.latest()
        if self.env.distributed:
            dist.broadcast_object_list(found, src=0)
        if found[0] is None:
            return None, "no complete checkpoint to roll back to yet (see --checkpoint.interval)"
        return found[0], ""

    def _record(
        self, loss: float, gnorm: float, lr: float, dt: float, elapsed: float, steps: int, finite: bool
    ) -> dict[str, Any]:
        env = self.env
        samples = self.plan.global_batch * steps
        tokens_per_s = samples * self.tokens_per_sample / max(elapsed, 1e-9)
        flops_per_rank = samples * self.flops_per_sample / env.world_size / max(elapsed, 1e-9)
        mem = M.peak_memory_bytes(env.device)
        mems = [mem]
        if env.distributed:
            t = torch.zeros(env.world_size, dtype=torch.int64, device=self._comm_device())
            t[env.rank] = mem
            dist.all_reduce(t)
            mems = t.tolist()
        return {
            "step": self.step,
            "loss": loss,
            "grad_norm": gnorm,
            "lr": lr,
            "tokens_per_s": tokens_per_s,
            "tokens_per_s_per_rank": tokens_per_s / env.world_size,
            "mfu": flops_per_rank / (self.peak * 1e12),
            "step_time_s": elapsed / steps,
            "last_step_time_s": dt,
            "peak_memory_bytes": mems,
            "skipped_steps": self.skipped,
            "bad_steps": self.guard.bad_steps,
            "rollbacks": self.guard.rollbacks,
            "stragglers": self.health.stragglers,
            **{f"rank_{k}": v for k, v in self.health.rank_figures.items()},
            "nonfinite": not finite,
            "time": time.time(),
        }


class _LoopState(Stateful):
    """The loop's own state: step, skipped steps, global data position, LR schedule, loss scale."""

    def __init__(self, trainer: Trainer) -> None:
        self.t = trainer

    def state_dict(self) -> dict[str, Any]:
        t = self.t
        extra = {"scheduler": t.scheduler.state_dict(), "scaler": t.scaler.state_dict() if t.scaler else None}
        return {"step": t.step, "skipped": t.skipped, "position": t.loader.position, "extra": json.dumps(extra)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        t = self.t
        t.step, t.skipped = int(state["step"]), int(state["skipped"])
        t.loader.load_state_dict({"position": int(state["position"]), "seed": t.loader.seed})
        extra = json.loads(state["extra"])
        t.scheduler.load_state_dict(extra["scheduler"])
        if t.scaler is not None and extra["scaler"] is not None:
            t.scaler.load_state_dict(extra["scaler"])
