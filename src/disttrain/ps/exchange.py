"""BSP's one message per server and step (the server side): a trainer's pushes of step t, the rows it needs
for step t+1, its loss and (server 0) its dense gradient, answered once every trainer's step t is applied.

Before, a BSP step cost each trainer a pull and a push per server and an all-reduce of the dense gradient
among the trainers (three round trips, two of them barriers). Here the step's barrier is the one message:
the last trainer's arrival applies all pushes together (in trainer order, so the sums are the same every
run), averages the dense gradients (in trainer order, as DDP's all-reduce would), then every trainer gets
its next rows, read after the update (exactly what a pull after the barrier would read), the step's mean
loss and the mean dense gradient.
"""

from __future__ import annotations

import os
import threading
from dataclasses import dataclass

import torch
from torch.futures import Future

from disttrain.ps.server import arena, get_table, pull_many
from disttrain.rpc import transport
from disttrain.utils import hooks


@dataclass
class StepMessage:
    """One trainer's step ``clock`` for one server: pushes (``push_counts[i]`` local rows of table
    ``names[i]`` after each other), the rows to read after the update, its loss and its dense gradient."""

    names: list[str]
    push_rows: torch.Tensor
    push_grads: torch.Tensor
    push_counts: list[int]
    pull_rows: torch.Tensor
    pull_counts: list[int]
    clock: int
    trainer: int
    trainers: int
    loss: float
    dense_grad: torch.Tensor | None = None
    epoch: int = 0
    """How many times the job rolled back (a spare took a dead server's place): older messages are refused."""
    seq: int = 1
    """This trainer's messages to this server in this epoch, counted from 1."""


@dataclass
class StepAnswer:
    rows: torch.Tensor
    """The rows asked for, read after every trainer's pushes of the step were applied."""
    mean_loss: float
    dense_grad: torch.Tensor | None
    """The trainers' mean dense gradient (when they sent theirs)."""


_PENDING: dict[int, list[tuple[StepMessage, Future[StepAnswer]]]] = {}
_EARLY: dict[tuple[int, int], tuple[StepMessage, Future[StepAnswer]]] = {}
"""(trainer, seq) of messages that arrived before an earlier one of the same trainer (RPC's thread pool may
run two messages of one sender in either order; an overlapped trainer has two on the way)."""
_EXPECTED: dict[int, int] = {}
_LOCK = threading.Lock()
_EPOCH = [0]


@transport.async_execution
def exchange(msg: StepMessage) -> Future[StepAnswer]:
    """Answered when all ``msg.trainers`` messages of ``msg.clock`` have arrived and been applied. Each
    trainer's messages are taken in the order it sent them (``msg.seq``), so steps are applied in order."""
    fut: Future[StepAnswer] = Future()
    answers: list[tuple[Future[StepAnswer], StepAnswer]] = []
    with _LOCK:
        if msg.epoch != _EPOCH[0]:
            fut.set_exception(RolledBack(f"step {msg.clock} of epoch {msg.epoch}; this server is at {_EPOCH[0]}"))  # type: ignore[arg-type]
            return fut
        _EARLY[(msg.trainer, msg.seq)] = (msg, fut)
        while (msg.trainer, _EXPECTED.get(msg.trainer, 1)) in _EARLY:
            first, first_fut = _EARLY.pop((msg.trainer, _EXPECTED.get(msg.trainer, 1)))
            _EXPECTED[msg.trainer] = first.seq + 1
            pending = _PENDING.setdefault(first.clock, [])
            pending.append((first, first_fut))
            if len(pending) == first.trainers:  # applied under the lock: steps in order, one at a time
                answers += _apply_step(sorted(_PENDING.pop(first.clock), key=lambda p: p[0].trainer))
    for f, answer in answers:
        f.set_result(answer)
    return fut


class RolledBack(RuntimeError):
    """A step message from before a roll-back (or one the roll-back cut short)."""


def roll_back(epoch: int) -> int:
    """Enter ``epoch``: the steps waiting here are answered with :class:`RolledBack` (their trainers roll
    back too) and messages of older epochs are refused; how many waited."""
    with _LOCK:
        _EPOCH[0] = epoch
        waiting = [fut for entries in _PENDING.values() for _, fut in entries] + [f for _, f in _EARLY.values()]
        _PENDING.clear()
        _EARLY.clear()
        _EXPECTED.clear()
    for fut in waiting:
        fut.set_exception(RolledBack(f"the job rolled back (epoch {epoch})"))  # type: ignore[arg-type]
    return len(waiting)


def _apply_step(ready: list[tuple[StepMessage, Future[StepAnswer]]]) -> list[tuple[Future[StepAnswer], StepAnswer]]:
    msgs = [m for m, _ in ready]
    rows = [m.push_rows.split(m.push_counts) for m in msgs]
    grads = [m.push_grads.split(m.push_counts) for m in msgs]
    rank, names = int(os.environ.get("RANK", -1)), msgs[0].names
    per_table = [torch.cat([r[i] for r in rows]) for i in range(len(names))]  # in trainer order
    fused = arena(names)
    if fused is not None:  # every table in one update
        fused.push(fused.rows(per_table), torch.cat([torch.cat([g[i] for g in grads]) for i in range(len(names))]))
    for i, name in enumerate(names):
        t = get_table(name)
        if not len(per_table[i]):  # a run's first exchange only reads
            continue
        if fused is None:
            t.push(per_table[i], torch.cat([g[i] for g in grads]))
        else:
            t.updates += 1
        hooks.fire("ps_update", t.updates, rank)
    n = len(msgs)
    mean_loss = sum(m.loss for m in msgs) / n
    dense = [m.dense_grad for m in msgs if m.dense_grad is not None]
    mean_dense = torch.stack(dense).sum(0) / n if len(dense) == n else None
    return [
        (fut, StepAnswer(pull_many(m.names, m.pull_rows, m.pull_counts), mean_loss, mean_dense)) for m, fut in ready
    ]
