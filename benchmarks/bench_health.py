"""What health monitoring costs per training step: heartbeats + hang watchdog + straggler figures, on vs off.

One launch of 2 ranks (gloo, one thread each) trains the same GPT (4 blocks, width 256, context 128, bf16,
DDP) under four variants, in blocks of steps interleaved round by round (the order rotates), so the
machine's noise hits them alike:

* ``none``: the Trainer's health hooks replaced by no-ops (the floor);
* ``hooks``: ``health.enabled = false`` (the phase/step hooks still run, no thread);
* ``on``: the default (a heartbeat every 2 s to the c10d store, rank 0 watching every rank);
* ``on-0.1s``: heartbeats every 0.1 s (20x the default rate).

A fresh HealthMonitor is started before each ``on`` block and closed after it, outside the timed part.
The figure is the median over rounds of the paired ratio t(variant) / t(none). Goal: on / none < 1.01.

    .venv/bin/python benchmarks/bench_health.py [--rounds 8] [--steps-per-block 8]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

import torch

import _common as C

GOAL = 1.01


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rounds", type=int, default=8)
    p.add_argument("--steps-per-block", type=int, default=8)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--nproc", type=int, default=2)
    p.add_argument("--out", default=None, help=argparse.SUPPRESS)
    return p.parse_args(argv)


class _NoHealth:
    """The hooks as no-ops: what a loop without health monitoring pays."""

    stragglers: list[int] = []  # noqa: RUF012
    rank_figures: dict[str, list[float]] = {}  # noqa: RUF012

    def phase(self, name: str) -> None:
        pass

    def step_done(self, step: int, seconds: float) -> None:
        pass

    def inject_faults(self, step: int) -> None:
        pass

    def nan_fault(self, step: int) -> bool:
        return False


def worker(args: argparse.Namespace) -> None:
    import dataclasses

    from disttrain.config import JobConfig, from_dict
    from disttrain.data.text import load_text_data
    from disttrain.dist.env import init_distributed
    from disttrain.health import HealthMonitor
    from disttrain.models.gpt import GPT, GPTConfig
    from disttrain.train.trainer import Trainer

    C.one_thread()
    env = init_distributed("cpu", threads=1)
    text = load_text_data(None, 128, 0.1)
    base = {
        "model": {"n_layers": 4, "d_model": 256, "n_heads": 4, "context": 128},
        "train": {"steps": 10_000, "global_batch": 16, "micro_batch": 8, "eval_interval": 0},
        "parallel": {"strategy": "ddp", "device": "cpu"},
        "precision": {"dtype": "bf16"},
        "metrics": {"progress": "off", "peak_tflops": 1.0},
    }

    def make(**health: Any) -> Trainer:
        cfg: JobConfig = from_dict({**base, "health": health})
        model = GPT(GPTConfig(text.tokenizer.vocab_size, 4, 256, 4, 128), seed=1)
        return Trainer(model, text.train, cfg, env=env)

    trainers = {
        "none": make(enabled=False),
        "hooks": make(enabled=False),
        "on": make(),
        "on-0.1s": make(heartbeat_s=0.1),
    }
    trainers["none"].health = _NoHealth()  # type: ignore[assignment]

    def steps(t: Trainer, n: int) -> None:
        for _ in range(n):
            t0 = time.perf_counter()
            t.train_step()
            t.health.step_done(t.step, time.perf_counter() - t0)

    def fresh_monitor(t: Trainer) -> None:
        cfg = t.cfg.health
        t.health = HealthMonitor(dataclasses.replace(cfg), env.rank, env.world_size, None, 600.0)
        t.health.start()

    for t in trainers.values():
        steps(t, args.warmup)
    names = list(trainers)
    times: dict[str, list[float]] = {n: [] for n in names}
    for r in range(args.rounds):
        k = r % len(names)
        for name in names[k:] + names[:k]:
            t = trainers[name]
            if name.startswith("on"):
                fresh_monitor(t)
            torch.distributed.barrier()
            t0 = time.perf_counter()
            steps(t, args.steps_per_block)
            times[name].append((time.perf_counter() - t0) / args.steps_per_block)
            if name.startswith("on"):
                t.health.close()
    C.write_rank_result(args.out, env.rank, {"times": times})
    C.finish_worker()


def main(argv: list[str]) -> None:
    args = parse_args(argv)
    if C.is_worker():
        worker(args)
        return
    fwd = ["--rounds", str(args.rounds), "--steps-per-block", str(args.steps_per_block), "--warmup", str(args.warmup)]
    ranks = C.launch_and_collect(args.nproc, Path(__file__), fwd)
    times = ranks[0]["times"]  # the ranks are in lockstep (DDP): rank 0's clock is the job's
    rows, results = [], {}
    for name, ts in times.items():
        ratio = C.paired_ratio(ts, times["none"])
        lo, hi = C.spread([a / b for a, b in zip(ts, times["none"], strict=True)])
        rows.append([name, C.median(ts) * 1e3, ratio, f"{lo:.3f}-{hi:.3f}"])
        results[name] = {"median_step_s": C.median(ts), "ratio_vs_none": ratio, "iqr": [lo, hi], "times": ts}
    C.table(
        ["variant", "ms/step (median)", "t / t(none)", "IQR of ratio"],
        rows,
        title=f"health monitoring cost, {args.nproc} ranks, {args.rounds} rounds x {args.steps_per_block} steps",
    )
    on = results["on"]["ratio_vs_none"]
    print(f"goal: on / none < {GOAL}: {C.verdict(on, GOAL, higher_is_better=False)} ({on:.4f})")
    C.write_results("bench_health", {"args": vars(args), "goal": GOAL, "results": results})


if __name__ == "__main__":
    main(sys.argv[1:])
