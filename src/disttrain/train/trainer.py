"""The Trainer, shaped like torchtitan's ``train.py``: :meth:`~Trainer.forward_backward_step` (one step's
micro-batches, gradients synchronised on the last only), :meth:`~Trainer.train_step` (clip by the global grad
norm, the non-finite guard, the optimizer and LR schedule) and :meth:`~Trainer.train` (resume, log, evaluate,
checkpoint on schedule, recover from bad steps, stop cleanly on preemption).

``Trainer(model, dataset, config=...)`` takes a plain ``nn.Module`` (or one built on the meta device) and
a map-style dataset of ``(input, target)`` pairs; it joins the process group torchrun set up (or runs
alone), applies the configured strategy through :func:`disttrain.parallelize`, and runs the loop. Given a
:class:`~disttrain.checkpoint.CheckpointManager`, it resumes from and saves checkpoints of its whole state.
"""

from __future__ import annotations

import contextlib
import json
import math
import signal
import time
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.checkpoint.stateful import Stateful
from torch.utils.data import Dataset

from disttrain.checkpoint import CheckpointInfo, CheckpointManager, ModelOptimState, export_live_model
from disttrain.checkpoint.pretrained import load_pretrained
from disttrain.config import DTYPES, JobConfig, ResolvedJob
from disttrain.data.loader import GlobalBatchLoader, eval_batches, to_device
from disttrain.errors import HealthError, Preempted
from disttrain.health.events import log_event, restart_event
from disttrain.health.guard import StepGuard
from disttrain.health.monitor import HealthMonitor, set_collective_timeout
from disttrain.health.signals import PREEMPT
from disttrain.parallel.env import DistEnv, init_distributed, seed_everything
from disttrain.parallel.families import family_of
from disttrain.parallel.parallelize import Parallelized, parallelize
from disttrain.parallel.stages import plan_for_model
from disttrain.parallel.strategies import dims_of
from disttrain.parallel.tp import local_value
from disttrain.plan.choose import resolve_here
from disttrain.plan.machine import cached_peak_tflops
from disttrain.train import metrics as M
from disttrain.train.loss import LossFn, Objective, cross_entropy
from disttrain.train.optim import build_optimizer, lr_lambda, make_grad_scaler, warmup_warning
from disttrain.train.progress import FitResult, Progress, StepFigures, Throughput
from disttrain.utils import hooks
from disttrain.utils.gc import GarbageCollection

if TYPE_CHECKING:
    from disttrain.parallel.pipeline import Pipeline
    from disttrain.parallel.pipeline_layout import PipelineLayout


def _peak(device: torch.device, cfg: JobConfig) -> tuple[float, str]:
    """(peak TFLOP/s of one rank, where it comes from) for MFU: ``metrics.peak_tflops``; on a CPU the one-thread
    peak ``disttrain doctor`` cached (the plan's figure) times this rank's threads; else the table or a
    measurement (:func:`disttrain.utils.peak.peak_tflops`)."""
    cached = cached_peak_tflops("cpu", cfg.precision.dtype) if device.type == "cpu" else None
    if cached and not cfg.metrics.peak_tflops:
        threads = torch.get_num_threads()
        return cached * threads, f"doctor's cached one-thread peak x {threads} thread(s)"
    return M.peak_tflops(device, DTYPES[cfg.precision.dtype], cfg.metrics.peak_tflops)


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
        job: ResolvedJob | None = None,
    ) -> None:
        cfg = job.config if job is not None else config or JobConfig()
        # collectives get the long start-up timeout until the first step is done (then parallel.timeout_s)
        self.env = env or init_distributed(
            cfg.parallel.device, max(cfg.parallel.timeout_s, cfg.health.startup_timeout_s)
        )
        self.run_dir = Path(run_dir) if run_dir is not None else None
        self.objective = Objective.from_config(cfg.model, model, loss_fn)
        self.loss_fn = self.objective.loss_fn
        self.checkpoint = checkpoint
        self._set_global_modes(cfg)
        # the job as it runs: resolved by `disttrain run`'s parent, or here for the Python API
        self.job = job or resolve_here(
            model,
            train_data[0],
            cfg,
            self.env.world_size,
            self.env.local_world_size,
            self.env.device.type,
            loss_fn,
        )
        self.cfg = cfg = self.job.config
        self.dims = dims_of(self.job)
        self.plan = self.job.batch
        dp_rank = self.dims.dp_rank(self.env.rank)  # the ranks of one tensor-parallel group read the same batch
        self.loader = GlobalBatchLoader(
            train_data, self.plan.micro_batch, self.plan.accum_steps, dp_rank, self.dims.dp_size, cfg.train.seed
        )
        sample_x = self.loader.dataset[0][0]
        self.tokens_per_sample = sample_x.numel() if not sample_x.is_floating_point() else 1
        self.flops_per_sample = M.flops_per_sample(model, sample_x)  # before sharding: the whole model's
        watch = getattr(train_data, "pace_watch", None)  # raw files: does the loader or the model set the pace?
        self.pace_watch = watch(self.plan.global_batch * self.tokens_per_sample) if callable(watch) else None
        # loss parallel needs our cross-entropy (torch's over vocabulary shards); any other loss gets full logits
        parallel = cfg.parallel if self.loss_fn is cross_entropy else replace(cfg.parallel, loss_parallel=False)
        layout = None
        if self.dims.pp > 1:  # the stages are cut from the whole model, before any other step
            layout = plan_for_model(model, family_of(model).name, parallel, self.plan.micro_batch)
        self.model: Parallelized = parallelize(
            model,
            parallel,
            cfg.precision,
            dims=self.dims,
            device=self.env.device,
            tp_plan=cfg.model.tp_plan,
            pipeline=layout,
        )
        if cfg.model.weights:
            load_pretrained(self.model.inner, cfg.model.weights)  # each rank reads only its own slices
        self.optimizer = build_optimizer(self.model.module, cfg)
        self._app_state = ModelOptimState(self.model.module, self.optimizer)  # one for the job: it keeps a cache
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(self.optimizer, lr_lambda(cfg))
        self.pipeline = self._build_pipeline(layout)
        self.val = (
            eval_batches(val_data, self.plan.micro_batch, cfg.train.eval_batches, dp_rank, self.dims.dp_size)
            if val_data is not None
            else None
        )
        self.scaler = make_grad_scaler(cfg.precision.dtype, self.dims, self.env.device)
        self.step = 0
        self.skipped = 0
        self.stop_requested = False
        """A rank got SIGTERM/SIGUSR1 (preemption): known to every rank through the step's loss all-reduce."""
        self.peak, self.peak_source = _peak(self.env.device, cfg)
        self.health = HealthMonitor(
            cfg.health, self.env.rank, self.env.world_size, self.run_dir, cfg.parallel.timeout_s
        )
        self.guard = StepGuard(cfg.health)

    def _set_global_modes(self, cfg: JobConfig) -> None:
        """Determinism, anomaly detection and seeds: process-wide settings the job asks for."""
        if cfg.train.deterministic:
            torch.use_deterministic_algorithms(True)
        if "anomaly" in cfg.health.debug_presets:
            torch.autograd.set_detect_anomaly(True)  # names the op that produced a NaN in backward (slow)
        seed_everything(cfg.train.seed)

    def _build_pipeline(self, layout: PipelineLayout | None) -> Pipeline | None:
        """The schedule over this rank's stages (pp > 1): each pipeline micro-batch's loss divided by the pieces
        of the step (accumulation steps x pipeline micro-batches), so the summed gradients are the step's mean, as
        without a pipeline."""
        if layout is None:
            return None
        from disttrain.parallel.pipeline import build_pipeline  # (torch.distributed.pipelining: only for pp > 1)

        pieces = self.plan.accum_steps * layout.microbatches

        def loss(out: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
            return self.loss_fn(out, y) / pieces

        group = self.dims.pp_mesh(self.env.device.type).get_group()
        pp_rank = self.dims.pp_rank(self.env.rank)
        return build_pipeline(self.model.stages, layout, pp_rank, group, self.env.device, loss)

    def _loss_share(self, loss: float) -> float:
        """This rank's part of the step's loss for the mean over every rank: under a pipeline only the ranks
        holding the last stage have one (pp x theirs, so the mean over all ranks is the mean over theirs)."""
        if self.pipeline is None:
            return loss
        return loss * self.dims.pp if self.pipeline.has_last else 0.0

    # -- one step -------------------------------------------------------------------------------
    def _all_reduce_mean(self, values: list[float]) -> list[float]:
        t = torch.tensor(values, dtype=torch.float64, device=self.comm_device())
        if self.env.distributed:
            dist.all_reduce(t)
            t /= self.env.world_size
        return t.tolist()

    def comm_device(self) -> torch.device:
        return self.env.device if self.env.device.type == "cuda" else torch.device("cpu")

    def forward_backward_step(
        self,
        micro_batches: Sequence[Any],
        *,
        around_forward: Callable[[int], AbstractContextManager[Any]] | None = None,
        after_backward: Callable[[int], None] | None = None,
    ) -> torch.Tensor:
        """Forward and backward over one step's micro-batches, gradients synchronised on the last one only
        (``loss / n`` each, so the gradients are the mean over the step); the sum of their unscaled losses.

        ``around_forward(i)`` wraps micro-step i's forward and loss (e.g. to count saved tensors);
        ``after_backward(i)`` runs after its backward (e.g. to look at the gradients)."""
        n = len(micro_batches)
        if self.pipeline is not None:
            return self._pipeline_steps(micro_batches)
        loss_sum = torch.zeros((), device=self.env.device)
        for i, batch in enumerate(micro_batches):
            x, y = to_device(batch, self.env.device)
            self.health.phase("forward")
            with self.model.sync(i == n - 1), self.model.loss_parallel():
                with around_forward(i) if around_forward else contextlib.nullcontext():
                    with self.model.autocast():
                        out = self.model(x, **self.objective.call_kwargs(x, y))
                    loss = self.loss_fn(out, y)
                    del out  # the logits (B x T x vocab) are not needed in backward: freed before it, not after
                if i == 0:
                    loss = hooks.apply("loss", loss, self.step + 1, self.env.rank)
                scaled = loss / n
                self.health.phase("backward")
                (self.scaler.scale(scaled) if self.scaler else scaled).backward()
            loss_sum += local_value(loss.detach().float())
            if after_backward is not None:
                after_backward(i)
        return loss_sum

    forward_backward = forward_backward_step
    """The name the Python API has always had."""

    def _pipeline_steps(self, micro_batches: Sequence[Any]) -> torch.Tensor:
        """Each micro-batch through the pipeline's schedule, forward and backward (the schedule cuts it into
        its micro-batches); the sum of the micro-batches' mean losses where this rank holds the last stage."""
        assert self.pipeline is not None
        loss_sum = torch.zeros((), device=self.env.device)
        for batch in micro_batches:
            x, y = to_device(batch, self.env.device)
            self.health.phase("forward")  # the schedule interleaves forward and backward: one phase for both
            with self.model.autocast(), self.model.loss_parallel():
                losses = self.pipeline.step(x, y)
            if losses:  # each divided by the step's pieces (the pipeline's loss): their sum x accum is the mean
                loss_sum += torch.stack([v.detach().float() for v in losses]).sum() * self.plan.accum_steps
        return loss_sum

    def train_step(self) -> tuple[float, float, bool]:
        """One optimizer step over ``accum_steps`` micro-batches: (mean loss, grad norm, stepped?)."""
        self.health.phase("data")
        hooks.fire("step_start", self.step + 1, self.env.rank)
        micro = self.loader.next_step()
        loss_sum = self.forward_backward_step(micro)
        n = len(micro)
        self.health.phase("optimizer")
        if self.scaler:
            self.scaler.unscale_(self.optimizer)  # clip and measure true gradients
        grad_norm = self.model.clip_grad_norm_(self.cfg.optim.grad_clip)
        # the step's one all-reduce also carries the stop signals, so every rank stops after the same step
        loss_mean, stop = self._all_reduce_mean([self._loss_share(float(loss_sum) / n), float(PREEMPT.requested)])
        self.stop_requested = stop > 0
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
            x, y = to_device(batch, self.env.device)
            if self.pipeline is not None:
                with self.model.autocast(), self.model.loss_parallel():
                    loss = self.pipeline.forward_loss(x, y, self.loss_fn)
                total += float(local_value(loss)) if loss is not None else 0.0
                continue
            with self.model.autocast():
                out = self.model(x, **self.objective.call_kwargs(x, y))
            with self.model.loss_parallel():
                total += float(local_value(self.loss_fn(out, y)))
        self.model.module.train()
        (mean,) = self._all_reduce_mean([self._loss_share(total / len(self.val))])
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

    def save_final(self, mode: str | None = None) -> None:
        """The end of training (``checkpoint.save_final``), or ``mode="full"`` for a preemption: saved and
        committed before this returns."""
        ck, mode = self.checkpoint, mode or self.cfg.checkpoint.save_final
        if ck is None:
            return
        if mode == "full" and ck.last_saved_step != self.step:
            t_save = time.perf_counter()
            ck.save(self.step, self.state())
            ck.wait()  # the end: training waits for the commit, so all of it is time blocked
            blocked = time.perf_counter() - t_save
            log_event(
                self.run_dir if self.env.is_main else None, "checkpoint", step=self.step, blocked_s=blocked, final=True
            )
        elif mode == "model_only" and self.run_dir is not None:
            export_live_model(self.model.module, self.run_dir / "model.safetensors", self.cfg.checkpoint.export_dtype)
        ck.close()

    # -- the loop ---------------------------------------------------------------------------------
    def train(self) -> FitResult:
        """Train to ``train.steps``, resuming first if a checkpoint says so: log, evaluate and checkpoint on
        schedule, recover from bad steps, stop cleanly on preemption; the collector runs on schedule."""
        cfg = self.cfg
        resumed = self.resume()
        result = FitResult(start_step=self.step)
        progress = Progress(cfg, self.env, self.run_dir, self.step)
        with GarbageCollection(cfg.train.gc_interval) as collector:
            self._announce(progress, resumed)
            self.health.start()
            try:
                while self.step < cfg.train.steps:
                    self._one_step(progress, collector, result)
                    if self.stop_requested and self.step < cfg.train.steps:
                        self._preempted(progress)
                self.health.phase("checkpoint")
                self.save_final()
            finally:
                self.health.close(finished=self.step >= cfg.train.steps)
                progress.close()
        result.skipped_steps = self.skipped
        return result

    def fit(self) -> FitResult:
        """:meth:`train` (the name the Python API has always had)."""
        return self.train()

    def _one_step(self, progress: Progress, collector: GarbageCollection, result: FitResult) -> None:
        """One optimizer step and what follows it: metrics, evaluation, bad-step recovery, a checkpoint."""
        progress.before_step(self.step + 1)
        t0 = time.perf_counter()
        lr = self.optimizer.param_groups[0]["lr"]
        loss, gnorm, finite = self.train_step()
        fig = StepFigures(self.step, loss, gnorm, lr, time.perf_counter() - t0, finite)
        progress.after_step(self.step)
        collector.step(self.step)
        self.health.step_done(self.step, fig.step_time_s)
        if not result.losses:  # past the start-up: collectives get the configured timeout
            set_collective_timeout(self.cfg.parallel.timeout_s)
        result.losses.append(loss)
        result.grad_norms.append(gnorm)
        record = self._record(progress, fig, result) if progress.due(fig) else None
        last = self.step == self.cfg.train.steps
        if (self.cfg.train.eval_interval and self.step % self.cfg.train.eval_interval == 0) or last:
            record = self._evaluate_into(progress, record, result)
        progress.write(self.step, record)
        if self.pace_watch is not None and (line := self.pace_watch.step_done()):
            progress.print(line)
        if self.guard.exhausted:
            self._on_bad_steps(progress)
            return
        interval = self.cfg.checkpoint.interval if self.checkpoint else 0
        if interval and self.step % interval == 0 and not last:
            self._save_on_schedule(progress)

    def _record(self, progress: Progress, fig: StepFigures, result: FitResult) -> dict[str, Any]:
        rate = Throughput(self.plan.global_batch, self.tokens_per_sample, self.flops_per_sample, self.peak)
        extra = {
            "skipped_steps": self.skipped,
            "bad_steps": self.guard.bad_steps,
            "rollbacks": self.guard.rollbacks,
            "stragglers": self.health.stragglers,
            **{f"rank_{k}": v for k, v in self.health.rank_figures.items()},
        }
        record = progress.record(fig, rate, self.comm_device(), extra)
        result.tokens_per_s, result.mfu = record["tokens_per_s"], record["mfu"]
        result.peak_memory_bytes = record["peak_memory_bytes"]
        return record

    def _evaluate_into(
        self, progress: Progress, record: dict[str, Any] | None, result: FitResult
    ) -> dict[str, Any] | None:
        self.health.phase("eval")
        t_eval = time.perf_counter()
        val = self.evaluate()
        progress.pause(time.perf_counter() - t_eval)  # throughput counts training time only
        if math.isnan(val):
            return record
        result.val_losses[self.step] = val
        progress.print(f"step {self.step}: val loss {val:.4f}")
        return {**(record or {"step": self.step}), "val_loss": val}

    def _save_on_schedule(self, progress: Progress) -> None:
        assert self.checkpoint is not None
        self.health.phase("checkpoint")
        t_save = time.perf_counter()
        self.checkpoint.save(self.step, self.state())
        blocked = time.perf_counter() - t_save
        progress.pause(blocked)  # kept in CheckpointManager.blocked_s
        log_event(self.run_dir if self.env.is_main else None, "checkpoint", step=self.step, blocked_s=blocked)

    def _preempted(self, progress: Progress) -> None:
        """A rank got SIGTERM / SIGUSR1: every rank is past the same step; save it (synchronously, within the
        launcher's ``launch.preempt_grace_s``) and stop."""
        self.health.phase("checkpoint")
        self.save_final("full")
        signum = PREEMPT.signum or signal.SIGTERM  # 0 here: another rank got the signal
        log_event(self.run_dir if self.env.is_main else None, "preempted", step=self.step, signal=signum)
        progress.print(f"stopping after step {self.step} (signal {signum}): checkpoint saved")
        raise Preempted(self.step, signum, self.checkpoint is not None)

    def _announce(self, progress: Progress, resumed: CheckpointInfo | None) -> None:
        """The opening lines: strategy, batch arithmetic, precision and peak; the model summary; a resume; a
        restart's cause."""
        from disttrain.train.summary import model_summary

        env, plan = self.env, self.plan
        tokens = f" ({plan.global_batch * self.tokens_per_sample:,} tokens/step)" if self.tokens_per_sample > 1 else ""
        progress.print(
            f"strategy {self.dims.describe()} x {env.world_size} rank(s) on {env.device.type} | "
            f"global batch {plan.global_batch} = micro {plan.micro_batch} x accum "
            f"{plan.accum_steps} x dp {plan.dp_size}{tokens} | {self.cfg.precision.dtype} | "
            f"peak {self.peak:.2f} TFLOP/s/rank ({self.peak_source})"
        )
        if self.job.auto:
            progress.print(f"strategy {self.dims.strategy}: {self.job.reason}")
        if warning := warmup_warning(self.cfg):
            progress.print(warning)
        if progress.console.enabled:
            summary = model_summary(self.model.inner, env.world_size // self.dims.pp, self.dims.tp)
            if self.pipeline is not None:  # this rank's part: the stages it holds
                summary = summary.replace("model ", "this pipeline rank's part of the model ", 1)
                summary += f"\npipeline: {self.pipeline.layout.describe()}; this rank holds stage(s) "
                summary += ", ".join(str(s) for s in self.pipeline.layout.stages_of(self.dims.pp_rank(env.rank)))
            progress.print(summary)
        if resumed is not None:
            progress.print(f"resumed from {resumed.path} (step {resumed.step}, sample {self.loader.position})")
        if env.is_main and (restart := restart_event(self.run_dir, resumed.step if resumed else None, env.world_size)):
            progress.print(f"restart {restart['attempt']}: previous attempt ended by {restart['cause']}")

    # -- recovery from bad steps ------------------------------------------------------------------
    def _on_bad_steps(self, progress: Progress) -> None:
        """``health.max_bad_steps`` bad steps in a row: roll back to the last checkpoint (skipping the data
        seen since, optionally lowering the LR), stop with a message, or go on (``health.on_bad_steps``)."""
        h, guard = self.cfg.health, self.guard
        what = f"{guard.consecutive} bad steps in a row (non-finite or spiking loss) up to step {self.step}"
        events_dir = self.run_dir if self.env.is_main else None
        if h.on_bad_steps == "continue":
            log_event(events_dir, "bad_steps", step=self.step, count=guard.consecutive)
            guard.consecutive = 0
            return
        info, why = None, "health.on_bad_steps is stop"
        if h.on_bad_steps == "rollback":
            info, why = self._rollback_target()
        if info is None:
            log_event(events_dir, "stop", step=self.step, reason=f"{what}; {why}")
            raise HealthError(
                f"{what}; {why}. See loss and grad_norm in metrics.jsonl; try a lower --optim.lr or "
                "--optim.grad-clip, or --health.on-bad-steps rollback with checkpoints"
            )
        self._roll_back(info, what, progress)

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

    def _roll_back(self, info: CheckpointInfo, what: str, progress: Progress) -> None:
        """Load ``info``, keep the data position (the bad data is skipped), lower the LR if configured."""
        h, guard = self.cfg.health, self.guard
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
        log_event(
            self.run_dir if self.env.is_main else None,
            "rollback",
            from_step=from_step,
            to_step=info.step,
            lr_factor=h.rollback_lr_factor,
            rollbacks=guard.rollbacks,
        )
        progress.print(
            f"{what}: rolled back to step {info.step} ({info.path.name}), data position kept at sample {position}"
        )


class _LoopState(Stateful):
    """The loop's own state: step, skipped steps, global data position, LR schedule, loss scale."""

    def __init__(self, trainer: Trainer) -> None:
        self.t = trainer

    def state_dict(self) -> dict[str, Any]:
        t = self.t
        extra = {
            "scheduler": t.scheduler.state_dict(),
            "scaler": t.scaler.state_dict() if t.scaler else None,
            "guard": t.guard.state_dict(),  # the spike guard's window: a resumed job judges steps alike
        }
        return {"step": t.step, "skipped": t.skipped, "position": t.loader.position, "extra": json.dumps(extra)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        t = self.t
        t.step, t.skipped = int(state["step"]), int(state["skipped"])
        t.loader.load_state_dict({"position": int(state["position"]), "seed": t.loader.seed})
        extra = json.loads(state["extra"])
        t.scheduler.load_state_dict(extra["scheduler"])
        if t.scaler is not None and extra["scaler"] is not None:
            t.scaler.load_state_dict(extra["scaler"])
        if "guard" in extra:  # (checkpoints from before it was saved: an empty window, as then)
            t.guard.load_state_dict(extra["guard"])
