"""What the garbage-collector control (``train.gc_interval``, ``disttrain.utils.gc``) costs and saves, in one
launch of 2 ranks training a small GPT (2 x 128, context 256, DDP) with ``Trainer.fit()``.

1. **Pause of one collection** after set-up: a full ``gc.collect()`` with nothing frozen (what an automatic
   generation-2 collection walks), then one after ``gc.freeze()`` (what a scheduled one walks).
2. **Training**: ``gc_interval = --interval`` vs ``0`` (Python's automatic collection), blocks of ``fit()`` each
   started right after a full collection; a block runs from its first ``train_step`` to the end of its last and of
   any collection right after it; the entry collection + freeze of every scheduled ``fit()`` (once per job in a
   real run) is shown apart. Figure: the paired ratio scheduled / automatic.
"""

from __future__ import annotations

import argparse
import gc
import time
from collections.abc import Callable
from typing import Any

import torch.distributed as dist

from benchmarks import harness as H

OPTIONS = {
    **H.options(nproc=2, rounds=8, steps_per_block=100, warmup=20),
    **H.options(layers=2, width=128, heads=4, context=256, micro_batch=8),
    "interval": (50, "gc_interval of the scheduled variant"),
    "repeats": (5, "part 1: collections timed per figure"),
}
QUICK = {"rounds": 1, "steps_per_block": 20, "warmup": 2, "interval": 10, "repeats": 2}


def pause_ms(repeats: int) -> float:
    """Milliseconds of one full collection (median of ``repeats``)."""
    return H.median([H.per_call(gc.collect)() for _ in range(repeats)]) * 1e3


class StepClock:
    """Replaces ``trainer.train_step``: records when a block's first step starts and its last one ends, and
    (through ``gc.callbacks``) the collections that run after that last step."""

    def __init__(self, trainer: Any) -> None:
        self.train_step, trainer.train_step = trainer.train_step, self
        self.first, self.last_end, self.tail, self._t0 = 0.0, 0.0, 0.0, 0.0
        gc.callbacks.append(self._on_gc)

    def __call__(self) -> Any:
        self.first = self.first or time.perf_counter()
        out = self.train_step()
        self.last_end, self.tail = time.perf_counter(), 0.0
        return out

    def _on_gc(self, phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            self._t0 = time.perf_counter()
        elif self.first:
            self.tail += time.perf_counter() - self._t0

    def block(self, fit: Callable[[], Any], n: int) -> dict[str, float]:
        """Run ``fit()`` (``n`` steps): this rank's seconds per step and outside its steps."""
        self.first = 0.0
        t0 = time.perf_counter()
        fit()
        fit_s, steps_s = time.perf_counter() - t0, self.last_end - self.first + self.tail
        self.first = 0.0
        return {"s_per_step": steps_s / n, "outside_steps_s": fit_s - steps_s}


def worker(args: argparse.Namespace) -> dict[str, Any]:
    env = H.init_ranks()
    cfg = H.job(H.gpt_of(args), world=env.world_size, micro_batch=args.micro_batch, parallel={"strategy": "ddp"})
    trainer = H.trainer(cfg, H.text(args.context), env)
    clock = StepClock(trainer)
    blocks: dict[str, list[dict[str, float]]] = {"scheduled": [], "automatic": []}

    def run(name: str, interval: int) -> Callable[[int], None]:
        def go(n: int) -> None:
            trainer.cfg.train.gc_interval = interval
            blocks[name].append(clock.block(lambda: H.fit_for(trainer, n), n))

        return go

    H.fit_for(trainer, 5)  # set-up: the model, optimizer, data and a few steps
    dist.barrier()
    gc.collect()  # set-up's garbage gone: the timed ones walk, they free nothing
    pauses = {"objects tracked": len(gc.get_objects()), "full collect ms": pause_ms(args.repeats)}
    gc.freeze()
    pauses |= {"after freeze ms": pause_ms(args.repeats), "objects frozen": gc.get_freeze_count()}
    gc.unfreeze()

    def fresh_collector() -> None:
        gc.collect()
        dist.barrier()

    variants = {"scheduled": run("scheduled", args.interval), "automatic": run("automatic", 0)}
    H.interleave(variants, **H.blocks(args), before_block=fresh_collector)
    return {"pauses": pauses, "blocks": {k: v[-args.rounds :] for k, v in blocks.items()}}


def run(args: argparse.Namespace) -> dict[str, Any]:
    ranks = H.ranks(args.nproc, __file__, args.argv)
    pauses = [{"rank": r, **d["pauses"]} for r, d in enumerate(ranks)]
    H.table(pauses, f"\n1. Pause of one gc.collect() after set-up, median of {args.repeats}")
    per_step = H.slowest_per_round([{k: [b["s_per_step"] for b in v] for k, v in d["blocks"].items()} for d in ranks])
    labels = {"scheduled": f"gc_interval={args.interval}", "automatic": "gc_interval=0 (automatic)"}
    rows = [
        {"variant": label, "ms/step": H.median(per_step[k]) * 1e3, **H.ratio(per_step[k], per_step["automatic"])}
        | {"fit() outside steps ms": max(H.median([b["outside_steps_s"] for b in d["blocks"][k]]) for d in ranks) * 1e3}
        for k, label in labels.items()
    ]
    model = f"GPT {args.layers}x{args.width} ctx {args.context}, micro-batch {args.micro_batch}"
    H.table(rows, f"\n2. Training: Trainer.fit(), {args.nproc} ranks DDP, {model}; ratio: against automatic")
    return {"pauses": pauses, "rows": rows, "raw": ranks}


if __name__ == "__main__":
    H.main(__file__, __doc__, OPTIONS, QUICK, run, worker)
