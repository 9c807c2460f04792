"""The pipeline at run time, on ``torch.distributed.pipelining``: this rank's stage modules (cut by
:mod:`disttrain.parallel.stages`, then parallelized) as ``PipelineStage`` objects, and the schedule that runs one
step's micro-batches through them (torch's, not ours). Imported only by a process that runs a pipeline.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import nn
from torch.distributed.pipelining import (
    PipelineStage,
    Schedule1F1B,
    ScheduleDualPipeV,
    ScheduleGPipe,
    ScheduleInterleaved1F1B,
    ScheduleInterleavedZeroBubble,
    ScheduleLoopedBFS,
    ScheduleZBVZeroBubble,
)
from torch.distributed.pipelining.schedules import _PipelineSchedule

from disttrain.parallel.pipeline_layout import MULTI_STAGE, PipelineLayout

_SCHEDULES: dict[str, Callable[..., _PipelineSchedule]] = {
    "gpipe": ScheduleGPipe,
    "1f1b": Schedule1F1B,
    "interleaved-1f1b": ScheduleInterleaved1F1B,
    "looped-bfs": ScheduleLoopedBFS,
    "interleaved-zb": ScheduleInterleavedZeroBubble,
    "zbv": ScheduleZBVZeroBubble,
    "dualpipev": ScheduleDualPipeV,
}


@dataclass
class Pipeline:
    """This rank's part of a pipeline: its stages (in schedule order), the schedule, and which ends it holds."""

    layout: PipelineLayout
    stages: list[PipelineStage]
    schedule: _PipelineSchedule
    modules: list[nn.Module]
    """This rank's stage modules (one per stage; the model itself where it holds one)."""

    @property
    def has_first(self) -> bool:
        return any(s.is_first for s in self.stages)

    @property
    def has_last(self) -> bool:
        return any(s.is_last for s in self.stages)

    def step(self, x: torch.Tensor, y: torch.Tensor, train: bool = True) -> list[torch.Tensor]:
        """One pass of the local micro-batch ``x`` (targets ``y``) through every stage, forward and backward
        (``train``) or forward only; the per-micro-batch losses where this rank holds the last stage, else []."""
        losses: list[torch.Tensor] = []
        args = (x,) if self.has_first else ()
        target = y if self.has_last else None
        run = self.schedule.step if train else self.schedule.eval
        run(*args, target=target, losses=losses if self.has_last else None, return_outputs=False)
        return losses


def build_pipeline(
    modules: list[nn.Module],
    layout: PipelineLayout,
    pp_rank: int,
    group: torch.distributed.ProcessGroup,
    device: torch.device,
    loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
) -> Pipeline:
    """The stages of ``modules`` (from :func:`~disttrain.parallel.stages.cut_model`, parallelized) and the
    layout's schedule over them. ``loss_fn`` is a pipeline micro-batch's loss as its backward should see it:
    the schedule does not rescale the gradients (torch's ``scale_grads`` divides the whole ``.grad`` by the
    micro-batch count at every step, so gradients accumulated over several steps would be divided again)."""
    ids = layout.stages_of(pp_rank)
    stages = [PipelineStage(m, s, layout.stages, device, group=group) for m, s in zip(modules, ids, strict=True)]
    cls = _SCHEDULES[layout.schedule]
    if layout.schedule in MULTI_STAGE:
        schedule = cls(stages, n_microbatches=layout.microbatches, loss_fn=loss_fn, scale_grads=False)
    else:
        schedule = cls(stages[0], n_microbatches=layout.microbatches, loss_fn=loss_fn, scale_grads=False)
    return Pipeline(layout, stages, schedule, modules)
