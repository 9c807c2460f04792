"""A BSP trainer's step, plain or overlapped (``ps.overlap``): which step's rows each message asks for, when
its answer is waited for, and when the dense part takes its Adam step.

Plain: the message of step t pushes t's gradients and reads t+1's rows, and the trainer waits for it before
step t+1: every read sees every update before it (exactly one process on the combined batch).

Overlapped: the message of step t is on its way while step t+1 computes. It reads the rows of step t+2, and
the trainer waits for it at the end of step t+1 (by then it has usually arrived); so each step reads rows
and trains dense weights that miss the previous step's update: a staleness bound of 1, the same on every
trainer. Checkpoints, evaluations and the end are sync points: the messages on their way are waited for, the
dense part catches up, and the next step reads its rows afresh, as a resumed run does, so resuming stays exact.
"""

from __future__ import annotations

from typing import Protocol

import torch

from disttrain.ps.bsp_step import BspRows, InFlight, StepRows
from disttrain.ps.clicks import Batch
from disttrain.ps.config import PSConfig, PSTrainConfig
from disttrain.utils import hooks


class BspTrainer(Protocol):
    """What a BSP step needs of its trainer (:class:`disttrain.ps.trainer.PSTrainer` has it): its sections and
    rank, the batches, the forward/backward and the dense part's update, the phase clock and the step's
    bookkeeping. The loop depends on this, never on the trainer's module."""

    cfg: PSConfig
    train: PSTrainConfig
    rank: int
    staleness: list[int]
    counts_loaded: bool

    def phase(self, name: str) -> None: ...
    def global_batch(self, step: int) -> Batch: ...
    def my_part(self, b: Batch) -> Batch: ...
    def syncs_after(self, done: int) -> bool: ...
    def forward_backward(self, b: Batch, rows: StepRows) -> tuple[torch.Tensor, torch.Tensor]: ...
    def dense_grad(self) -> torch.Tensor | None: ...
    def apply_dense(self, step: int, mean: torch.Tensor | None) -> None: ...


class BspLoop:
    """Trainer ``trainer``'s BSP steps on ``bsp``'s rows."""

    def __init__(self, trainer: BspTrainer, bsp: BspRows, overlap: bool) -> None:
        self.t, self.bsp, self.overlap = trainer, bsp, overlap
        self.rows: StepRows | None = None  # this step's rows (None: read them afresh)
        self.next_rows: StepRows | None = None  # overlapped: the next step's, when already read
        self.inflight: tuple[int, InFlight] | None = None  # overlapped: the last step's message
        self.ahead: dict[int, Batch] = {}  # samples drawn when their rows were asked for

    def reset(self) -> None:
        """Nothing read or on its way (a roll-back)."""
        self.rows = self.next_rows = self.inflight = None
        self.ahead = {}

    def _whole(self, step: int) -> Batch:
        return self.ahead.pop(step, None) or self.t.global_batch(step)

    def _ids(self, step: int) -> tuple[torch.Tensor, torch.Tensor]:
        """(this trainer's, every trainer's) ids of step ``step``, its samples kept for when it runs."""
        whole = self.ahead.get(step) or self.t.global_batch(step)
        self.ahead[step] = whole
        return self.t.my_part(whole).ids, whole.ids

    def step(self, step: int) -> list[tuple[int, float]]:
        """Step ``step``; the (step, mean loss) of the steps this completed (overlapped: usually the last one)."""
        t, bsp = self.t, self.bsp
        t.phase("data")
        t.staleness.append(int(self.overlap))
        hooks.fire("ps_step", step, t.rank)
        whole = self._whole(step)
        b = t.my_part(whole)
        t.phase("forward")  # a first read included
        if self.rows is None:
            self.rows = bsp.first(step, b.ids, whole.ids, resumed=t.counts_loaded)
            t.counts_loaded = False
            if self.overlap and not t.syncs_after(step + 1):
                self.next_rows = bsp.first(step + 1, *self._ids(step + 1), resumed=False)
        embs, loss = t.forward_backward(b, self.rows)
        t.phase("optimizer")  # the step's message included
        sync = t.syncs_after(step + 1)
        ahead = 1 if not self.overlap else 0 if sync else 2
        target = step + ahead
        asks = ahead > 0 and target < t.train.steps and not (ahead == 2 and t.syncs_after(step + 2))
        assert embs.grad is not None
        flight = bsp.send(
            step,
            self.rows,
            embs.grad / t.cfg.trainers,
            self._ids(target) if asks else None,
            float(loss.detach()),
            t.dense_grad(),
            sync,
        )
        if asks and target + 1 < t.train.steps and target + 1 not in self.ahead:
            self.ahead[target + 1] = t.global_batch(target + 1)  # drawn while the message travels
        done = []
        if self.inflight is not None:
            last, last_flight = self.inflight
            self.inflight = None
            self.next_rows, mean_loss, dense = last_flight.wait()
            t.apply_dense(last, dense)
            done.append((last, mean_loss))
        if ahead == 2:
            self.inflight = (step, flight)
            self.rows, self.next_rows = self.next_rows, None
            return done
        rows, mean_loss, dense = flight.wait()
        t.apply_dense(step, dense)
        self.rows, self.next_rows = rows, None
        return [*done, (step, mean_loss)]
