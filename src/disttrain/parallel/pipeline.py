"""The pipeline at run time, on ``torch.distributed.pipelining``: this rank's stage modules (cut by
:mod:`disttrain.parallel.stages`, then parallelized) as ``PipelineStage`` objects, and the schedule that runs one
step's micro-batches through them (torch's, not ours). Imported only by a process that runs a pipeline.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.distributed as dist
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

    def step(self, x: torch.Tensor, y: torch.Tensor) -> list[torch.Tensor]:
        """One pass of the local micro-batch ``x`` (targets ``y``) through every stage, forward and backward;
        the per-micro-batch losses where this rank holds the last stage, else []."""
        losses: list[torch.Tensor] = []
        args = (x,) if self.has_first else ()
        target = y if self.has_last else None
        self.schedule.step(*args, target=target, losses=losses if self.has_last else None, return_outputs=False)
        return losses

    @torch.no_grad()
    def forward_loss(
        self, x: torch.Tensor, y: torch.Tensor, loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
    ) -> torch.Tensor | None:
        """``loss_fn`` of the whole model on ``x`` and ``y``, forward only, stage after stage (each stage's
        output sent to the next stage's rank): the loss where this rank holds the last stage, else None. For
        evaluation, where no schedule is needed (torch 2.13's ``eval()`` of the V-shaped schedules hangs)."""
        layout, me = self.layout, self.schedule_rank
        mine = dict(zip(layout.stages_of(me), self.modules, strict=True))
        hidden: torch.Tensor | None = x
        for stage in range(layout.stages):
            holder = layout.owner(stage)
            if holder != me:
                continue
            if stage > 0 and layout.owner(stage - 1) != me:
                hidden = _receive(self.group, layout.owner(stage - 1), x.device)
            assert hidden is not None
            hidden = mine[stage](hidden)
            if stage + 1 < layout.stages and layout.owner(stage + 1) != me:
                _send(hidden, self.group, layout.owner(stage + 1))
        return loss_fn(hidden, y) if self.has_last and hidden is not None else None

    @property
    def schedule_rank(self) -> int:
        return self.stages[0].group_rank

    @property
    def group(self) -> dist.ProcessGroup:
        group = self.stages[0].group
        assert group is not None
        return group


def _send(t: torch.Tensor, group: dist.ProcessGroup, to: int) -> None:
    peer = dist.get_global_rank(group, to)
    dist.send(torch.tensor(t.shape, dtype=torch.int64, device=t.device), peer, group=group)
    dist.send(t.float().contiguous(), peer, group=group)  # fp32 on the wire, whatever autocast made


def _receive(group: dist.ProcessGroup, source: int, device: torch.device) -> torch.Tensor:
    peer = dist.get_global_rank(group, source)
    shape = torch.zeros(3, dtype=torch.int64, device=device)  # (batch, time, width): a block's output
    dist.recv(shape, peer, group=group)
    out = torch.empty(tuple(shape.tolist()), dtype=torch.float32, device=device)
    dist.recv(out, peer, group=group)
    return out


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
