"""Part 3 of bench_checkpoint.py, on every rank: the step-time overhead of async saves every ``interval``
steps in ``Trainer.fit()`` (``part_steps``)."""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch.distributed as dist

from benchmarks import _common as C
from benchmarks.ckpt_setup import config, make_trainer


class Blocks:
    """One Trainer for both variants (two instances differ by a few % in speed by themselves: memory
    placement); a variant's block sets ``trainer.checkpoint`` to the manager or to None, and each
    block's ``fit()`` runs ``n`` more steps. Records the blocked time of the checkpointed blocks and
    every block's CPU time."""

    def __init__(self, trainer: Any) -> None:
        self.trainer = trainer
        self.manager = trainer.checkpoint
        assert self.manager is not None
        self.blocked_per_block: list[float] = []
        self.cpu_s: dict[bool, list[float]] = {False: [], True: []}

    def wait_only(self) -> None:
        """What a block's end costs: the save written and committed, the purge done. ``fit()`` ends with
        ``close()``, which also releases the stager's buffers and thread; a real job does that once, at its
        very end, so re-creating them every block would charge each save a job-start cost."""
        self.manager.wait()
        if self.manager._purger is not None:
            self.manager._purger.join()

    def run(self, with_ckpt: bool) -> Callable[[int], None]:
        trainer, manager = self.trainer, self.manager

        def go(n: int) -> None:
            trainer.checkpoint = manager if with_ckpt else None
            trainer.cfg.train.steps = trainer.step + n  # fit() runs until this step
            before = len(manager.blocked_s)
            c0 = time.process_time()  # this rank's CPU time, all its threads (the background save's too)
            trainer.fit()
            self.cpu_s[with_ckpt].append(time.process_time() - c0)
            if with_ckpt:
                self.blocked_per_block.append(sum(manager.blocked_s[before:]))

        return go


def part_steps(args: argparse.Namespace, text: Any, env: Any, root: Path) -> dict[str, Any]:
    """Part 3: Trainer.fit() with async saves every ``interval`` steps vs without checkpoints (see ``Blocks``)."""
    from disttrain.utils.gc import GarbageCollection

    cfg = config(args, env.world_size, False, {"async_mode": "thread", "interval": args.interval})
    blocks = Blocks(make_trainer(cfg, text, env, root / "steps"))
    manager = blocks.manager
    manager.close = blocks.wait_only  # type: ignore[method-assign]
    block = args.interval * args.saves_per_block
    # Untimed: half an interval, then a warm-up block of one interval per variant (the first save in it),
    # so every timed block starts half-way between two saves and holds saves_per_block of them.
    # One job-wide GC context, as one fit() of a real job has: each block's fit() then only runs the
    # scheduled collections, not the entry collection of everything (~100 ms) per block.
    with GarbageCollection(cfg.train.gc_interval):
        blocks.run(False)(args.interval // 2)
        times = C.interleave(
            {"no checkpoint": blocks.run(False), f"async thread every {args.interval}": blocks.run(True)},
            steps_per_block=block,
            rounds=args.step_rounds,
            warmup=args.interval,
            before_block=dist.barrier,
        )
    del manager.close  # the real close(), once
    manager.close()
    cpu_s = blocks.cpu_s
    return {
        "params": sum(p.numel() for p in blocks.trainer.model.module.parameters()),
        "block_steps": block,
        "times_s_per_step": times,
        "blocked_s_per_block": blocks.blocked_per_block[1:],  # the first is the warm-up block's
        "cpu_s_per_block": {k: cpu_s[v][-args.step_rounds :] for k, v in zip(times, (False, True), strict=True)},
        "saves_timed": len(manager.blocked_s) - 1,
        "failures": manager.failures,
    }
