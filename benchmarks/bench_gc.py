"""What the garbage-collector control (``train.gc_interval``, ``disttrain.utils.gc``) costs and saves.

One launch of 2 ranks (gloo, one thread each) trains a small GPT (2 blocks, width 128, context 256,
micro-batch 8, DDP) with the real ``Trainer.fit()``. Two parts:

1. **Pause of one collection**, on each rank after set-up (model, optimizer, data, a few steps): a full
   ``gc.collect()`` with nothing frozen (what an automatic generation-2 collection walks), then one after
   ``gc.freeze()`` (what a scheduled collection walks: only what was made since), median of ``--repeats``
   each; and how many objects the collector tracks.
2. **Training**: ``gc_interval = 50`` (the default: frozen, automatic collection off, a collection every 50
   steps on every rank) vs ``gc_interval = 0`` (Python's automatic collection). One Trainer; blocks of
   ``--steps-per-block`` steps interleaved round by round (order rotating, ``_common.interleave``); each
   block sets ``trainer.cfg.train.gc_interval`` and calls ``fit()`` for that many more steps. Every block
   starts right after a full ``gc.collect()`` (untimed, then a barrier): the scheduled variant's ``fit()``
   unfreezes everything on exit, leaving the next automatic block a collector whose generation-2 bookkeeping
   was set by collections of a frozen heap (a full collection would come sooner than in a job that never
   froze); after the reset each block starts from the state a full collection leaves, whatever ran before.

   ``train_step`` is wrapped with a clock: a step is the time from one ``train_step`` call to the next (the
   whole loop iteration: the step, the scheduled collection after it, the hooks); the block's last step is
   its ``train_step`` plus any collection after it. The entry collection + freeze that every ``fit()`` of
   the scheduled variant does before its first step (once per job in a real run) is therefore left out
   (shown apart as "fit() outside steps"). A ``gc.callbacks`` hook counts the generation-2 collections
   during the block's steps and times every collection. Figures: block time / steps on the slowest rank,
   the median over rounds of the paired ratio scheduled / automatic (< 1: the schedule saves time); per-step
   p50 / p99 / max over all timed steps of a rank (the worse rank shown).

    .venv/bin/python -m benchmarks.bench_gc [--rounds 8] [--steps-per-block 100] [--interval 50]
"""

from __future__ import annotations

import argparse
import gc
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch.distributed as dist

from benchmarks import _common as C
from disttrain.testing.launch import finish_worker, is_worker, launch_and_collect, write_rank_result


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--nproc", type=int, default=2)
    p.add_argument("--rounds", type=int, default=8)
    p.add_argument("--steps-per-block", type=int, default=100)
    p.add_argument("--warmup", type=int, default=20, help="untimed steps per variant before the rounds")
    p.add_argument("--interval", type=int, default=50, help="gc_interval of the scheduled variant")
    p.add_argument("--repeats", type=int, default=5, help="part 1: collections timed per figure")
    C.add_gpt_args(p, layers=2, width=128, heads=4, context=256, micro_batch=8)
    p.add_argument("--out", default=None, help=argparse.SUPPRESS)  # set for the workers
    return p.parse_args(argv)


def make_trainer(args: argparse.Namespace, env: Any) -> Any:
    """The Trainer of a small DDP GPT on the bundled text, as a job builds it."""
    from disttrain.build import build_model
    from disttrain.config import from_dict
    from disttrain.data.text import load_text_data
    from disttrain.train.trainer import Trainer

    text = load_text_data(None, args.context, 0.1)
    cfg = from_dict(
        {
            "model": C.gpt_shape(args),
            "train": {
                "steps": 1,
                "global_batch": args.micro_batch * env.world_size,
                "micro_batch": args.micro_batch,
                "eval_interval": 0,
                "generate_chars": 0,
            },
            "parallel": {"strategy": "ddp", "device": "cpu"},
            "metrics": {"peak_tflops": 1.0, "progress": "off"},
        }
    )
    model = build_model(cfg, text.tokenizer.vocab_size, on_meta=False)
    return Trainer(model, text.train, cfg, env=env)


def pause_costs(repeats: int) -> dict[str, float]:
    """Part 1: seconds of one full collection with nothing frozen and after ``gc.freeze()`` (medians)."""

    def timed() -> float:
        times = []
        for _ in range(repeats):
            t0 = time.perf_counter()
            gc.collect()
            times.append(time.perf_counter() - t0)
        return C.median(times)

    gc.collect()  # set-up's garbage gone: the timed ones walk, they free nothing
    objects = len(gc.get_objects())
    full = timed()
    gc.freeze()
    frozen = gc.get_freeze_count()
    after_freeze = timed()
    gc.unfreeze()
    return {"objects": objects, "frozen": frozen, "full_s": full, "after_freeze_s": after_freeze}


class StepClock:
    """Replaces ``trainer.train_step``: records when each step starts and ends, and (through ``gc.callbacks``)
    every collection that runs from a block's first step until its ``fit()`` returns."""

    def __init__(self, trainer: Any) -> None:
        self.train_step = trainer.train_step
        trainer.train_step = self
        self.active = False
        self.starts: list[float] = []
        self.last_end = 0.0
        self.pauses: list[tuple[float, float, int]] = []  # (start, seconds, generation)
        self._t0 = 0.0
        gc.callbacks.append(self._on_gc)

    def __call__(self) -> Any:
        self.starts.append(time.perf_counter())
        self.active = True
        out = self.train_step()
        self.last_end = time.perf_counter()
        return out

    def _on_gc(self, phase: str, info: dict[str, int]) -> None:
        if not self.active:
            return
        if phase == "start":
            self._t0 = time.perf_counter()
        else:
            self.pauses.append((self._t0, time.perf_counter() - self._t0, info["generation"]))

    def block(self, fit: Callable[[], Any]) -> dict[str, Any]:
        """Run ``fit()`` and return this rank's figures of its steps."""
        self.starts, self.pauses = [], []
        t0 = time.perf_counter()
        fit()
        fit_s = time.perf_counter() - t0
        self.active = False
        tail = sum(s for start, s, _ in self.pauses if start >= self.last_end)
        steps = [b - a for a, b in zip(self.starts, self.starts[1:], strict=False)]
        steps.append(self.last_end - self.starts[-1] + tail)
        return {
            "steps_s": steps,
            "s_per_step": sum(steps) / len(steps),
            "outside_steps_s": fit_s - sum(steps),
            "gen2": sum(1 for _, _, g in self.pauses if g == 2),
            "gen2_s": sum(s for _, s, g in self.pauses if g == 2),
            "gc_s": sum(s for _, s, _ in self.pauses),
            "collections": len(self.pauses),
        }


def worker(args: argparse.Namespace) -> None:
    from disttrain.parallel.env import init_distributed

    C.one_thread()
    env = init_distributed("cpu", threads=1)
    trainer = make_trainer(args, env)
    clock = StepClock(trainer)
    blocks: dict[str, list[dict[str, Any]]] = {}

    def run(name: str, interval: int) -> Callable[[int], None]:
        def go(n: int) -> None:
            trainer.cfg.train.gc_interval = interval
            trainer.cfg.train.steps = trainer.step + n  # fit() runs until this step
            blocks.setdefault(name, []).append(clock.block(trainer.fit))

        return go

    run("set-up", 0)(5)
    dist.barrier()
    pauses = pause_costs(args.repeats)

    def fresh_collector() -> None:
        gc.collect()
        dist.barrier()

    C.interleave(
        {f"gc_interval={args.interval}": run("scheduled", args.interval), "gc_interval=0": run("automatic", 0)},
        steps_per_block=args.steps_per_block,
        rounds=args.rounds,
        warmup=args.warmup,
        before_block=fresh_collector,
    )
    timed = {k: blocks[k][-args.rounds :] for k in ("scheduled", "automatic")}
    write_rank_result(args.out, env.rank, {"pauses": pauses, "blocks": timed})
    finish_worker()


def pct(xs: list[float], q: float) -> float:
    """The q-quantile by nearest rank."""
    s = sorted(xs)
    return s[min(len(s) - 1, int(q * len(s)))]


def print_pauses(ranks: list[dict[str, Any]], args: argparse.Namespace) -> None:
    C.table(
        ["rank", "objects tracked", "full collect ms", "after freeze ms", "objects frozen", "ratio"],
        [
            [
                f"rank {r}",
                d["pauses"]["objects"],
                d["pauses"]["full_s"] * 1e3,
                d["pauses"]["after_freeze_s"] * 1e3,
                d["pauses"]["frozen"],
                d["pauses"]["after_freeze_s"] / d["pauses"]["full_s"],
            ]
            for r, d in enumerate(ranks)
        ],
        title=f"\n1. Pause of one gc.collect() after set-up, median of {args.repeats} (ratio = after freeze / full)",
    )


def variant_figures(ranks: list[dict[str, Any]], k: str, per_step: dict[str, list[float]]) -> dict[str, Any]:
    """Variant ``k``'s figures: its step time against the automatic collector's, its steps, its collections."""
    ratio = C.paired_ratio(per_step[k], per_step["automatic"])
    lo, hi = C.spread([a / b for a, b in zip(per_step[k], per_step["automatic"], strict=True)])
    steps = [[s for b in d["blocks"][k] for s in b["steps_s"]] for d in ranks]
    return {
        "ms_per_step_median": C.median(per_step[k]) * 1e3,
        "ratio_vs_automatic": ratio,
        "iqr": [lo, hi],
        "step_ms_p50": max(C.median(s) for s in steps) * 1e3,
        "step_ms_p99": max(pct(s, 0.99) for s in steps) * 1e3,
        "step_ms_max": max(max(s) for s in steps) * 1e3,
        "gen2_per_block": [C.median([b["gen2"] for b in d["blocks"][k]]) for d in ranks],
        "gen2_total": [sum(b["gen2"] for b in d["blocks"][k]) for d in ranks],
        "collections_total": [sum(b["collections"] for b in d["blocks"][k]) for d in ranks],
        "gen2_ms_per_block": max(C.median([b["gen2_s"] for b in d["blocks"][k]]) for d in ranks) * 1e3,
        "gc_ms_per_block": max(C.median([b["gc_s"] for b in d["blocks"][k]]) for d in ranks) * 1e3,
        "outside_steps_ms": max(C.median([b["outside_steps_s"] for b in d["blocks"][k]]) for d in ranks) * 1e3,
        "s_per_step_slowest_rank": per_step[k],
    }


def variant_row(label: str, f: dict[str, Any]) -> list[Any]:
    lo, hi = f["iqr"]
    return [
        label,
        f["ms_per_step_median"],
        f["ratio_vs_automatic"],
        f"{lo:.3f}-{hi:.3f}",
        f["step_ms_p50"],
        f["step_ms_p99"],
        f["step_ms_max"],
        " / ".join(str(n) for n in f["gen2_total"]),
        " / ".join(str(n) for n in f["collections_total"]),
        f["gen2_ms_per_block"],
        f["gc_ms_per_block"],
        f["outside_steps_ms"],
    ]


def report(ranks: list[dict[str, Any]], args: argparse.Namespace) -> dict[str, Any]:
    print_pauses(ranks, args)
    names = {"scheduled": f"gc_interval={args.interval}", "automatic": "gc_interval=0 (automatic)"}
    per_step = {k: [max(d["blocks"][k][i]["s_per_step"] for d in ranks) for i in range(args.rounds)] for k in names}
    results = {k: variant_figures(ranks, k, per_step) for k in names}
    C.table(
        [
            "variant",
            "ms/step",
            "t / t(auto)",
            "IQR",
            "step p50 ms",
            "p99 ms",
            "max ms",
            "gen-2 (rank 0 / 1)",
            "all gens",
            "gen-2 ms/block",
            "all GC ms/block",
            "fit() outside steps ms",
        ],
        [variant_row(label, results[k]) for k, label in names.items()],
        title=(
            f"\n2. Training: Trainer.fit(), {args.nproc} ranks DDP, GPT {args.layers}x{args.width} ctx {args.context} "
            f"micro-batch {args.micro_batch}; {args.rounds} rounds x {args.steps_per_block} steps per block; "
            "ms/step: slowest rank per block, median over rounds;\nt / t(auto): median of the paired ratio; "
            "p50/p99/max: all timed steps of a rank, the worse rank; gen-2, all gens: collections during the timed "
            "steps, all rounds; ms/block: median over rounds, the worse rank"
        ),
    )
    return results


def main(argv: list[str]) -> None:
    args = parse_args(argv)
    if is_worker():
        worker(args)
        return
    t_start = time.perf_counter()
    C.print_machine()
    ranks = launch_and_collect(args.nproc, Path(__file__), argv, echo=True)
    results = report(ranks, args)
    wall = time.perf_counter() - t_start
    print(f"\nwall time {wall:.0f} s")
    config = {k: v for k, v in vars(args).items() if k != "out"}
    C.write_results(
        "bench_gc",
        {"config": config, "pauses": [r["pauses"] for r in ranks], "results": results, "wall_s": wall, "raw": ranks},
    )


if __name__ == "__main__":
    main(sys.argv[1:])
