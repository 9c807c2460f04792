"""The training loop: accumulation with sync on the last micro-step only, clipping with the global grad
norm, a non-finite guard, warmup + cosine LR, periodic evaluation, metrics.

``Trainer(model, dataset, config=...)`` takes a plain ``nn.Module`` (or one built on the meta device) and
a map-style dataset of ``(input, target)`` pairs; it joins the process group torchrun set up (or runs
alone), applies the configured strategy through :func:`disttrain.parallelize`, and runs the loop. Given a
:class:`~disttrain.checkpoint.CheckpointManager`, it resumes from and saves checkpoints of its whole state.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.checkpoint.stateful import Stateful
from torch.utils.data import Dataset

from disttrain.checkpoint import CheckpointInfo, CheckpointManager, ModelOptimState, export_live_model
from disttrain.checkpoint.pretrained import load_pretrained
from disttrain.config import DTYPES, JobConfig, resolve_batch
from disttrain.data.loader import GlobalBatchLoader, eval_batches, to_device
from disttrain.health.guard import StepGuard
from disttrain.health.monitor import HealthMonitor
from disttrain.health.signals import PREEMPT
from disttrain.parallel.env import DistEnv, init_distributed, resolve_precision, seed_everything
from disttrain.parallel.mesh import ParallelDims
from disttrain.parallel.strategy import Parallelized, parallelize
from disttrain.plan.choose import auto_strategy
from disttrain.train import metrics as M
from disttrain.train.loop import FitLoop, FitResult
from disttrain.train.loss import LossFn, Objective, cross_entropy
from disttrain.train.optim import build_optimizer, lr_lambda, make_grad_scaler
from disttrain.utils import hooks
from disttrain.utils.gc import GarbageCollection


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
        self.objective = Objective.from_config(cfg.model, model, loss_fn)
        self.loss_fn = self.objective.loss_fn
        self.checkpoint = checkpoint
        self._set_global_modes()
        self.strategy_reason = "forced by parallel.strategy"
        self.dims = dims or self._choose_dims(model, train_data, loss_fn)
        cfg = self.cfg  # auto may have resolved parallel settings from the plan
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
        if cfg.model.weights:
            load_pretrained(self.model.inner, cfg.model.weights)  # each rank reads only its own slices
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
        self.stop_requested = False
        """A rank got SIGTERM/SIGUSR1 (preemption): known to every rank through the step's loss all-reduce."""
        self.peak, self.peak_source = M.peak_tflops(
            self.env.device, DTYPES[cfg.precision.dtype], cfg.metrics.peak_tflops
        )
        self.health = HealthMonitor(
            cfg.health, self.env.rank, self.env.world_size, self.run_dir, cfg.parallel.timeout_s
        )
        self.guard = StepGuard(cfg.health)

    def _set_global_modes(self) -> None:
        """Determinism, anomaly detection and seeds: process-wide settings the job asks for."""
        cfg = self.cfg
        if cfg.train.deterministic:
            torch.use_deterministic_algorithms(True)
        if "anomaly" in cfg.health.debug_presets:
            torch.autograd.set_detect_anomaly(True)  # names the op that produced a NaN in backward (slow)
        seed_everything(cfg.train.seed)

    def _choose_dims(self, model: nn.Module, train_data: Dataset[Any], loss_fn: LossFn) -> ParallelDims:
        """The layout when the caller gave none: ``auto`` from the memory plan over several ranks."""
        cfg, env = self.cfg, self.env
        strategy = None
        if cfg.parallel.strategy == "auto" and env.world_size > 1:
            strategy, self.strategy_reason, tuned = auto_strategy(
                model, train_data[0], cfg, env.world_size, env.local_world_size, loss_fn
            )
            self.cfg = dataclasses.replace(cfg, parallel=dataclasses.replace(cfg.parallel, **tuned))
        return ParallelDims.from_config(cfg.parallel, env.world_size, env.local_world_size, strategy)

    # -- one step -------------------------------------------------------------------------------
    def _all_reduce_mean(self, values: list[float]) -> list[float]:
        t = torch.tensor(values, dtype=torch.float64, device=self.comm_device())
        if self.env.distributed:
            dist.all_reduce(t)
            t /= self.env.world_size
        return t.tolist()

    def comm_device(self) -> torch.device:
        return self.env.device if self.env.device.type == "cuda" else torch.device("cpu")

    def forward_backward(
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
        loss_sum = torch.zeros((), device=self.env.device)
        for i, batch in enumerate(micro_batches):
            x, y = to_device(batch, self.env.device)
            self.health.phase("forward")
            with self.model.sync(i == n - 1):
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
            loss_sum += loss.detach().float()
            if after_backward is not None:
                after_backward(i)
        return loss_sum

    def train_step(self) -> tuple[float, float, bool]:
        """One optimizer step over ``accum_steps`` micro-batches: (mean loss, grad norm, stepped?)."""
        self.health.phase("data")
        hooks.fire("step_start", self.step + 1, self.env.rank)
        micro = self.loader.next_step()
        loss_sum = self.forward_backward(micro)
        n = len(micro)
        self.health.phase("optimizer")
        if self.scaler:
            self.scaler.unscale_(self.optimizer)  # clip and measure true gradients
        grad_norm = self.model.clip_grad_norm_(self.cfg.optim.grad_clip)
        # the step's one all-reduce also carries the stop signals, so every rank stops after the same step
        loss_mean, stop = self._all_reduce_mean([float(loss_sum) / n, float(PREEMPT.requested)])
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
            with self.model.autocast():
                out = self.model(x, **self.objective.call_kwargs(x, y))
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

    def save_final(self, mode: str | None = None) -> None:
        """The end of training (``checkpoint.save_final``), or ``mode="full"`` for a preemption: saved and
        committed before this returns."""
        ck, mode = self.checkpoint, mode or self.cfg.checkpoint.save_final
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
            return FitLoop(self, collector).run()


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
