"""What a training step costs and how well it uses the hardware: throughput, MFU, memory; and the sinks.

MFU = achieved FLOP/s per rank / peak FLOP/s of one device. The peak comes from ``metrics.peak_tflops``,
else a table of known GPUs (dense bf16), else a matmul measured here on this device and dtype (CPU).
"""

from __future__ import annotations

import json
import logging
import resource
import sys
from pathlib import Path
from typing import Any, TextIO

import torch
from torch import nn
from torch.func import functional_call
from torch.utils.flop_counter import FlopCounterMode

from disttrain.errors import ConfigError
from disttrain.models.outputs import logits_of
from disttrain.utils.peak import GPU_PEAK_TFLOPS, gpu_peak_tflops, measure_matmul_tflops, peak_tflops

__all__ = ["GPU_PEAK_TFLOPS", "gpu_peak_tflops", "measure_matmul_tflops", "peak_tflops"]


log = logging.getLogger("disttrain")


def flops_per_sample(model: nn.Module, sample_input: torch.Tensor) -> float:
    """Training FLOPs (forward + backward) of one sample: the model's ``flops_per_token()`` if it has one,
    else counted by FlopCounterMode on the plain model (on the meta device for a meta model: no compute)."""
    per_token = getattr(model, "flops_per_token", None)
    if callable(per_token) and not sample_input.is_floating_point():
        return float(per_token()) * sample_input.numel()
    device = next(model.parameters()).device
    x = sample_input.unsqueeze(0).to(device)
    # a meta model may hold real buffers (computed at build time): counted as meta stand-ins, not touched
    real = {n: b.to("meta") for n, b in model.named_buffers() if not b.is_meta} if device.type == "meta" else {}
    with FlopCounterMode(display=False) as counter:
        logits_of(functional_call(model, real, (x,))).float().sum().backward()
    for p in model.parameters():
        p.grad = None
    return float(counter.get_total_flops())


def peak_memory_bytes(device: torch.device) -> int:
    """Allocator peak on CUDA; process peak RSS on CPU."""
    if device.type == "cuda":
        return int(torch.cuda.max_memory_allocated(device))
    return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024


class MetricsSink:
    """Writes one JSON object per logged step to ``metrics.jsonl`` (rank 0 only) and, optionally, TensorBoard."""

    def __init__(self, run_dir: Path | None, enabled: bool, tensorboard: bool = False) -> None:
        self.enabled = enabled and run_dir is not None
        self.file: TextIO | None = None
        self.tb: Any = None
        if self.enabled and run_dir is not None:
            self.file = open(run_dir / "metrics.jsonl", "a", buffering=1)  # noqa: SIM115 (closed in close())
            if tensorboard:
                try:
                    from torch.utils.tensorboard import SummaryWriter
                except ImportError:
                    raise ConfigError(
                        "metrics.tensorboard needs the tensorboard package: pip install 'disttrain[tensorboard]'"
                    ) from None

                self.tb = SummaryWriter(str(run_dir / "tensorboard"))

    def write(self, record: dict[str, Any]) -> None:
        if self.file is not None:
            self.file.write(json.dumps(record) + "\n")
        if self.tb is not None:  # the names of metrics.jsonl; a per-rank list becomes one tag per rank
            step = record.get("step", 0)
            for k, v in record.items():
                if k == "step" or isinstance(v, bool):
                    continue
                if isinstance(v, (int, float)):
                    self.tb.add_scalar(k, v, step)
                elif isinstance(v, list) and all(isinstance(x, (int, float)) for x in v):
                    for r, x in enumerate(v):
                        self.tb.add_scalar(f"{k}/rank{r}", x, step)

    def close(self) -> None:
        if self.file is not None:
            self.file.close()
        if self.tb is not None:
            self.tb.close()


class Console:
    """Rank 0's view of progress: a rich bar on a terminal, plain lines otherwise (or nothing)."""

    def __init__(self, enabled: bool, total: int, start: int, mode: str = "auto", stream: TextIO | None = None):
        self.logs = enabled
        """Every line also goes to the ``disttrain`` log (``logs/rank0.log`` under ``disttrain run``), shown or not."""
        self.enabled = enabled and mode != "off"
        self.stream = stream or sys.stdout
        self.total = total
        self.bar: Any = None
        use_bar = mode == "bar" or (mode == "auto" and self.stream.isatty())
        if self.enabled and use_bar:
            from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

            self.bar = Progress(
                TextColumn("[bold]train"),
                BarColumn(),
                MofNCompleteColumn(),
                TextColumn("{task.fields[info]}"),
                TextColumn("ETA"),
                TimeRemainingColumn(),
            )
            self.task = self.bar.add_task("train", total=total, completed=start, info="")
            self.bar.start()

    def step(self, step: int, record: dict[str, Any] | None) -> None:
        line = None if record is None else self.line(step, record)
        if line is not None and self.logs:
            log.info(line)
        if not self.enabled:
            return
        if self.bar is None:
            if line is not None:
                print(line, file=self.stream, flush=True)
        elif record is not None:
            info = f"loss {record['loss']:.4f} | {record['tokens_per_s']:,.0f} tok/s | mfu {record['mfu'] * 100:.1f}%"
            self.bar.update(self.task, completed=step, info=info)
        else:
            self.bar.update(self.task, completed=step)

    def line(self, step: int, record: dict[str, Any]) -> str:
        """One step's plain line."""
        return (
            f"step {step:>6}/{self.total} | loss {record['loss']:.4f} | gnorm {record['grad_norm']:.3f} | "
            f"lr {record['lr']:.2e} | {record['tokens_per_s']:,.0f} tok/s | mfu {record['mfu'] * 100:.1f}% | "
            f"{record['step_time_s'] * 1000:.0f} ms/step"
        )

    def print(self, msg: str) -> None:
        if self.logs:
            log.info(msg)
        if not self.enabled:
            return
        if self.bar is not None:
            self.bar.console.print(msg)
        else:
            print(msg, file=self.stream, flush=True)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.stop()
            self.bar = None
