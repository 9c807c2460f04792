"""What a run shows and records while it trains: the console, ``metrics.jsonl`` (and TensorBoard), the
throughput window, the step profiler, and :class:`FitResult`.

:class:`Progress` is one ``Trainer.train()``'s reporting component (torchtitan's metrics processor): the Trainer
hands it each step's figures; it owns the sinks and the window, never the model, data or checkpoints.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from disttrain.config import JobConfig
from disttrain.parallel.env import DistEnv
from disttrain.train import metrics as M
from disttrain.train.profile import StepProfiler


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


@dataclass(frozen=True)
class StepFigures:
    """One step's figures, as the Trainer measured them (global: the same on every rank)."""

    step: int
    loss: float
    grad_norm: float
    lr: float
    step_time_s: float
    finite: bool


@dataclass(frozen=True)
class Throughput:
    """What turns a window of steps into rates: samples per step, tokens and FLOPs per sample, the peak."""

    global_batch: int
    tokens_per_sample: int
    flops_per_sample: float
    peak_tflops: float


class Progress:
    """The console, the metrics sink, the throughput window and the profiler of one run."""

    def __init__(self, cfg: JobConfig, env: DistEnv, run_dir: Path | None, start_step: int) -> None:
        self.env = env
        self.sink = M.MetricsSink(run_dir, env.is_main, cfg.metrics.tensorboard)
        self.console = M.Console(env.is_main, cfg.train.steps, start_step, cfg.metrics.progress)
        self.log_interval = cfg.metrics.log_interval
        self.last_step = cfg.train.steps
        self.window_t, self.window_steps = time.perf_counter(), 0
        self.profiler: StepProfiler | None = None  # --metrics.profile START:END: torch.profiler over those steps
        if cfg.metrics.profile:
            cuda = env.device.type == "cuda"
            self.profiler = StepProfiler(cfg.metrics.profile, env.rank, run_dir, cuda, self.console.print)

    def print(self, line: str) -> None:
        self.console.print(line)

    def before_step(self, step: int) -> None:
        if self.profiler is not None:
            self.profiler.before_step(step)

    def after_step(self, step: int) -> None:
        self.window_steps += 1
        if self.profiler is not None:
            self.window_t += self.profiler.after_step(step)  # exporting the trace is not training time

    def pause(self, seconds: float) -> None:
        """Time that is not training (evaluation, a blocking save) leaves the throughput window."""
        self.window_t += seconds

    def due(self, fig: StepFigures) -> bool:
        """A metrics record is due after this step (every ``log_interval``, the last, a non-finite one)."""
        return fig.step % self.log_interval == 0 or fig.step == self.last_step or not fig.finite

    def record(
        self, fig: StepFigures, rate: Throughput, comm_device: torch.device, extra: dict[str, Any]
    ) -> dict[str, Any]:
        """One line of ``metrics.jsonl``: the step's figures, the throughput since the last record and the
        caller's ``extra`` figures (collective: every rank's peak memory is gathered)."""
        elapsed = time.perf_counter() - self.window_t
        steps = max(self.window_steps, 1)
        self.window_t, self.window_steps = time.perf_counter(), 0
        env = self.env
        samples = rate.global_batch * steps
        tokens_per_s = samples * rate.tokens_per_sample / max(elapsed, 1e-9)
        flops_per_rank = samples * rate.flops_per_sample / env.world_size / max(elapsed, 1e-9)
        return {
            "step": fig.step,
            "loss": fig.loss,
            "grad_norm": fig.grad_norm,
            "lr": fig.lr,
            "tokens_per_s": tokens_per_s,
            "tokens_per_s_per_rank": tokens_per_s / env.world_size,
            "mfu": flops_per_rank / (rate.peak_tflops * 1e12),
            "step_time_s": elapsed / steps,
            "last_step_time_s": fig.step_time_s,
            "peak_memory_bytes": self._peak_memory(comm_device),
            **extra,
            "nonfinite": not fig.finite,
            "time": time.time(),
        }

    def _peak_memory(self, comm_device: torch.device) -> list[int]:
        env = self.env
        mem = M.peak_memory_bytes(env.device)
        if not env.distributed:
            return [mem]
        g = torch.zeros(env.world_size, dtype=torch.int64, device=comm_device)
        g[env.rank] = mem
        dist.all_reduce(g)
        return [int(x) for x in g.tolist()]

    def write(self, step: int, record: dict[str, Any] | None) -> None:
        if record is not None:
            self.sink.write(record)
        self.console.step(step, record if record and "loss" in record else None)

    def close(self) -> None:
        if self.profiler is not None:
            self.profiler.close()  # the run ended inside the window: export what was recorded
        self.console.close()
        self.sink.close()
