"""The loop around :meth:`Trainer.train_step`: resume, log, evaluate, checkpoint on schedule, recover from bad
steps (roll back, stop or go on), and the metrics record of each logged step.

:class:`FitLoop` owns one ``fit()``: the metrics sink, the console and the throughput window; the Trainer
owns the model, optimizer, data position and checkpoints it drives.
"""

from __future__ import annotations

import math
import signal
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist

from disttrain.checkpoint import CheckpointInfo
from disttrain.errors import HealthError, Preempted
from disttrain.health.events import log_event, restart_event
from disttrain.health.monitor import set_collective_timeout
from disttrain.health.signals import PREEMPT
from disttrain.train import metrics as M
from disttrain.train.optim import lr_lambda
from disttrain.train.profile import StepProfiler
from disttrain.utils.gc import GarbageCollection

if TYPE_CHECKING:
    from disttrain.train.trainer import Trainer


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


class FitLoop:
    """One ``Trainer.fit()``: steps to ``train.steps`` with logging, evaluation, checkpoints and recovery."""

    def __init__(self, trainer: Trainer, collector: GarbageCollection) -> None:
        self.t = trainer
        self.collector = collector
        cfg, env = trainer.cfg, trainer.env
        self.resumed = trainer.resume()
        self.res = FitResult(start_step=trainer.step)
        self.sink = M.MetricsSink(trainer.run_dir, env.is_main, cfg.metrics.tensorboard)
        self.console = M.Console(env.is_main, cfg.train.steps, trainer.step, cfg.metrics.progress)
        self.interval = cfg.checkpoint.interval if trainer.checkpoint else 0
        self.window_t, self.window_steps = time.perf_counter(), 0
        self.profiler: StepProfiler | None = None  # --metrics.profile START:END: torch.profiler over those steps
        if cfg.metrics.profile:
            cuda = env.device.type == "cuda"
            self.profiler = StepProfiler(cfg.metrics.profile, env.rank, trainer.run_dir, cuda, self.console.print)

    def run(self) -> FitResult:
        t, cfg = self.t, self.t.cfg
        self.announce()
        t.health.start()
        try:
            while t.step < cfg.train.steps:
                self.one_step()
                if t.stop_requested and t.step < cfg.train.steps:
                    self.preempted()
            t.health.phase("checkpoint")
            t.save_final()
        finally:
            t.health.close(finished=t.step >= cfg.train.steps)
            if self.profiler is not None:
                self.profiler.close()  # the run ended inside the window: export what was recorded
            self.console.close()
            self.sink.close()
        self.res.skipped_steps = t.skipped
        return self.res

    def preempted(self) -> None:
        """A rank got SIGTERM / SIGUSR1: every rank is past the same step; save it (synchronously, within the
        launcher's ``launch.preempt_grace_s``) and stop."""
        t = self.t
        t.health.phase("checkpoint")
        t.save_final("full")
        signum = PREEMPT.signum or signal.SIGTERM  # 0 here: another rank got the signal
        log_event(t.run_dir if t.env.is_main else None, "preempted", step=t.step, signal=signum)
        self.console.print(f"stopping after step {t.step} (signal {signum}): checkpoint saved")
        raise Preempted(t.step, signum, t.checkpoint is not None)

    def announce(self) -> None:
        """The opening lines: strategy, batch arithmetic, precision and peak; the model summary; a resume; a
        restart's cause."""
        from disttrain.train.summary import model_summary

        t, cfg, env, plan = self.t, self.t.cfg, self.t.env, self.t.plan
        tokens = f" ({plan.global_batch * t.tokens_per_sample:,} tokens/step)" if t.tokens_per_sample > 1 else ""
        self.console.print(
            f"strategy {t.dims.describe()} x {env.world_size} rank(s) on {env.device.type} | "
            f"global batch {plan.global_batch} = micro {plan.micro_batch} x accum "
            f"{plan.accum_steps} x dp {plan.dp_size}{tokens} | {cfg.precision.dtype} | "
            f"peak {t.peak:.2f} TFLOP/s/rank ({t.peak_source})"
        )
        if t.job.auto:
            self.console.print(f"strategy {t.dims.strategy}: {t.job.reason}")
        if self.console.enabled:
            self.console.print(model_summary(t.model.inner, env.world_size))
        resumed = self.resumed
        if resumed is not None:
            self.console.print(f"resumed from {resumed.path} (step {resumed.step}, sample {t.loader.position})")
        if env.is_main and (restart := restart_event(t.run_dir, resumed.step if resumed else None, env.world_size)):
            self.console.print(f"restart {restart['attempt']}: previous attempt ended by {restart['cause']}")

    def one_step(self) -> None:
        t, cfg, res = self.t, self.t.cfg, self.res
        if self.profiler is not None:
            self.profiler.before_step(t.step + 1)
        t0 = time.perf_counter()
        lr = t.optimizer.param_groups[0]["lr"]
        loss, gnorm, finite = t.train_step()
        dt = time.perf_counter() - t0
        if self.profiler is not None:
            self.window_t += self.profiler.after_step(t.step)  # exporting the trace is not training time
        self.collector.step(t.step)
        t.health.step_done(t.step, dt)
        if len(res.losses) == 0:  # past the start-up: collectives get the configured timeout
            set_collective_timeout(cfg.parallel.timeout_s)
        res.losses.append(loss)
        res.grad_norms.append(gnorm)
        self.window_steps += 1
        last = t.step == cfg.train.steps
        record = None
        if t.step % cfg.metrics.log_interval == 0 or last or not finite:
            elapsed = time.perf_counter() - self.window_t
            record = metrics_record(t, loss, gnorm, lr, dt, elapsed, self.window_steps, finite)
            self.window_t, self.window_steps = time.perf_counter(), 0
            res.tokens_per_s, res.mfu = record["tokens_per_s"], record["mfu"]
            res.peak_memory_bytes = record["peak_memory_bytes"]
        if (cfg.train.eval_interval and t.step % cfg.train.eval_interval == 0) or last:
            record = self.evaluate(record)
        if record is not None:
            self.sink.write(record)
        self.console.step(t.step, record if record and "loss" in record else None)
        if t.guard.exhausted:
            on_bad_steps(t, self.console)
            return
        if self.interval and t.step % self.interval == 0 and not last:
            assert t.checkpoint is not None
            t.health.phase("checkpoint")
            t_save = time.perf_counter()
            t.checkpoint.save(t.step, t.state())
            blocked = time.perf_counter() - t_save
            self.window_t += blocked  # kept in CheckpointManager.blocked_s
            log_event(t.run_dir if t.env.is_main else None, "checkpoint", step=t.step, blocked_s=blocked)

    def evaluate(self, record: dict[str, Any] | None) -> dict[str, Any] | None:
        t = self.t
        t.health.phase("eval")
        t_eval = time.perf_counter()
        val = t.evaluate()
        self.window_t += time.perf_counter() - t_eval  # throughput counts training time only
        if math.isnan(val):
            return record
        self.res.val_losses[t.step] = val
        self.console.print(f"step {t.step}: val loss {val:.4f}")
        return {**(record or {"step": t.step}), "val_loss": val}


def metrics_record(
    t: Trainer, loss: float, gnorm: float, lr: float, dt: float, elapsed: float, steps: int, finite: bool
) -> dict[str, Any]:
    """One line of ``metrics.jsonl``: the step's figures and the throughput over the last ``steps`` steps."""
    env = t.env
    samples = t.plan.global_batch * steps
    tokens_per_s = samples * t.tokens_per_sample / max(elapsed, 1e-9)
    flops_per_rank = samples * t.flops_per_sample / env.world_size / max(elapsed, 1e-9)
    mem = M.peak_memory_bytes(env.device)
    mems = [mem]
    if env.distributed:
        g = torch.zeros(env.world_size, dtype=torch.int64, device=t.comm_device())
        g[env.rank] = mem
        dist.all_reduce(g)
        mems = g.tolist()
    return {
        "step": t.step,
        "loss": loss,
        "grad_norm": gnorm,
        "lr": lr,
        "tokens_per_s": tokens_per_s,
        "tokens_per_s_per_rank": tokens_per_s / env.world_size,
        "mfu": flops_per_rank / (t.peak * 1e12),
        "step_time_s": elapsed / steps,
        "last_step_time_s": dt,
        "peak_memory_bytes": mems,
        "skipped_steps": t.skipped,
        "bad_steps": t.guard.bad_steps,
        "rollbacks": t.guard.rollbacks,
        "stragglers": t.health.stragglers,
        **{f"rank_{k}": v for k, v in t.health.rank_figures.items()},
        "nonfinite": not finite,
        "time": time.time(),
    }


def on_bad_steps(t: Trainer, console: M.Console) -> None:
    """``health.max_bad_steps`` bad steps in a row: roll back to the last checkpoint (skipping the data
    seen since, optionally lowering the LR), stop with a message, or go on (``health.on_bad_steps``)."""
    h, guard = t.cfg.health, t.guard
    what = f"{guard.consecutive} bad steps in a row (non-finite or spiking loss) up to step {t.step}"
    if h.on_bad_steps == "continue":
        log_event(t.run_dir if t.env.is_main else None, "bad_steps", step=t.step, count=guard.consecutive)
        guard.consecutive = 0
        return
    info, why = None, "health.on_bad_steps is stop"
    if h.on_bad_steps == "rollback":
        info, why = rollback_target(t)
    if info is None:
        log_event(t.run_dir if t.env.is_main else None, "stop", step=t.step, reason=f"{what}; {why}")
        raise HealthError(
            f"{what}; {why}. See loss and grad_norm in metrics.jsonl; try a lower --optim.lr or "
            "--optim.grad-clip, or --health.on-bad-steps rollback with checkpoints"
        )
    roll_back(t, info, what, console)


def rollback_target(t: Trainer) -> tuple[CheckpointInfo | None, str]:
    """The newest complete checkpoint, as rank 0 sees it once every rank's save is committed."""
    if t.checkpoint is None:
        return None, "no checkpoint manager to roll back with"
    if t.guard.rollbacks >= t.cfg.health.max_rollbacks:
        return None, f"health.max_rollbacks ({t.cfg.health.max_rollbacks}) reached"
    t.checkpoint.wait()
    found: list[Any] = [None]
    if t.env.distributed:
        dist.barrier()
    if t.env.is_main:
        found[0] = t.checkpoint.latest()
    if t.env.distributed:
        dist.broadcast_object_list(found, src=0)
    if found[0] is None:
        return None, "no complete checkpoint to roll back to yet (see --checkpoint.interval)"
    return found[0], ""


def roll_back(t: Trainer, info: CheckpointInfo, what: str, console: M.Console) -> None:
    """Load ``info``, keep the data position (the bad data is skipped), lower the LR if configured."""
    h, guard = t.cfg.health, t.guard
    t.health.phase("rollback")
    assert t.checkpoint is not None
    from_step, position = t.step, t.loader.position
    t.checkpoint.load(t.state(), info)
    t.loader.load_state_dict({"position": position, "seed": t.loader.seed})  # skip the bad data
    if h.rollback_lr_factor != 1.0:
        sched = t.scheduler
        sched.base_lrs = [b * h.rollback_lr_factor for b in sched.base_lrs]
        factor = lr_lambda(t.cfg)(sched.last_epoch)
        for group, base in zip(t.optimizer.param_groups, sched.base_lrs, strict=True):
            group["lr"] = base * factor
    guard.rollbacks += 1
    guard.reset()
    msg = f"{what}: rolled back to step {info.step} ({info.path.name}), data position kept at sample {position}"
    log_event(
        t.run_dir if t.env.is_main else None,
        "rollback",
        from_step=from_step,
        to_step=info.step,
        lr_factor=h.rollback_lr_factor,
        rollbacks=guard.rollbacks,
    )
    console.print(msg)
