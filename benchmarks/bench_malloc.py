"""glibc's allocator settings for CPU workers (``disttrain.utils.malloc.CPU_MALLOC_ENV``) against glibc's
defaults: step time and peak RSS per rank, for DDP and for FSDP with one and with six blocks per unit.

By default glibc maps every allocation of 32 MiB or more afresh and unmaps it when freed, and torch's CPU
allocator caches nothing, so a step's large transient buffers come as new zeroed pages every step. Part 1 times
that alone in this process (a fresh buffer filled by a copy, against a copy into a kept buffer, by size). Part 2
launches the default GPT on 2 ranks (gloo, one thread each, micro-batch 8, ``precision.dtype`` auto) with the
launcher's settings and with glibc's defaults (``DISTTRAIN_CPU_MALLOC=glibc``; not a ``MALLOC_*`` variable:
setting any of those turns off glibc's adaptive mmap threshold, far slower than either), launches alternating,
each launch timing every variant round-robin. The allocator settings can only change at process start, so the
two sides are separate launches: the ratio is the median over launch pairs of the per-variant median step.

    .venv/bin/python -m benchmarks.bench_malloc [--pairs 2] [--rounds 6]
"""

from __future__ import annotations

import argparse
import os
import resource
import sys
import time
from pathlib import Path
from typing import Any

from benchmarks import _common as C
from disttrain.testing.launch import child_env, finish_worker, is_worker, launch_and_collect, write_rank_result

GLIBC_DEFAULT = {"DISTTRAIN_CPU_MALLOC": "glibc"}
VARIANTS = {"ddp": {"strategy": "ddp"}, "fsdp 1/unit": {"blocks_per_unit": 1}, "fsdp 6/unit": {"blocks_per_unit": 6}}


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--pairs", type=int, default=2, help="launch pairs (launcher's settings, glibc's defaults)")
    p.add_argument("--rounds", type=int, default=6, help="timed steps of each variant per launch")
    p.add_argument("--out", default=None, help=argparse.SUPPRESS)
    return p.parse_args(argv)


def fresh_pages() -> list[list[Any]]:
    """Part 1: ms to fill a fresh buffer vs a kept one, by size (one thread, this process's allocator)."""
    import torch

    rows = []
    for mib in (16, 31, 33, 64):
        src = torch.ones(mib * 2**18)
        kept = torch.empty_like(src)

        def fresh(src: torch.Tensor = src) -> None:
            torch.empty_like(src).copy_(src)

        def reuse(src: torch.Tensor = src, kept: torch.Tensor = kept) -> None:
            kept.copy_(src)

        ms = [_per_call_ms(fn) for fn in (fresh, reuse)]
        rows.append([f"{mib} MiB", ms[0], ms[1], ms[0] / ms[1]])
    return rows


def _per_call_ms(fn: Any, seconds: float = 0.4) -> float:
    for _ in range(3):
        fn()
    n, t0 = 0, time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        fn()
        n += 1
    return (time.perf_counter() - t0) / n * 1e3


def worker(args: argparse.Namespace) -> None:
    C.one_thread()
    import torch.distributed as dist

    from disttrain.build import build_data, build_model, vocab_size
    from disttrain.config import from_dict
    from disttrain.parallel.env import init_distributed
    from disttrain.train.trainer import Trainer

    env = init_distributed("cpu", threads=1)
    trainers = {}
    for name, parallel in VARIANTS.items():
        cfg = from_dict(
            {
                "model": {"n_layers": 6, "d_model": 384, "n_heads": 6, "context": 256},
                "train": {"micro_batch": 8, "global_batch": 8 * env.world_size, "eval_interval": 0},
                "parallel": {
                    "device": "cpu",
                    "strategy": "fsdp",
                    "forward_prefetch": 1,
                    "backward_prefetch": 1,
                    **parallel,
                },
                "metrics": {"peak_tflops": 1.0, "progress": "off"},
            }
        )
        train, _, text = build_data(cfg)
        model = build_model(cfg, vocab_size(train, text), on_meta=cfg.parallel.strategy != "ddp")
        trainers[name] = Trainer(model, train, cfg, env=env)

    def step(name: str) -> Any:
        return lambda n: [trainers[name].train_step() for _ in range(n)]

    times = C.interleave(
        {n: step(n) for n in trainers}, steps_per_block=1, rounds=args.rounds, warmup=1, before_block=dist.barrier
    )
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    write_rank_result(args.out, env.rank, {"times": C.slowest_rank(times), "peak_rss": rss})
    finish_worker()


def launch(args: argparse.Namespace, extra_env: dict[str, str]) -> dict[str, Any]:
    mine = {k: v for k, v in os.environ.items() if not k.startswith(("MALLOC_", "DISTTRAIN_CPU_MALLOC"))}
    ranks = launch_and_collect(
        2, Path(__file__), ["--rounds", str(args.rounds)], env=child_env(base=mine, extra=extra_env), echo=True
    )
    return {"times": ranks[0]["times"], "peak_rss": max(r["peak_rss"] for r in ranks)}


def main(argv: list[str]) -> None:
    args = parse_args(argv)
    if is_worker():
        worker(args)
        return
    from disttrain.utils.malloc import CPU_MALLOC_ENV

    C.print_machine()
    part1 = fresh_pages()
    title1 = "Part 1: this process (glibc's defaults unless MALLOC_* is set): fill a fresh buffer vs a kept one"
    C.table(["buffer", "fresh ms", "kept ms", "ratio"], part1, title=title1)
    sides: dict[str, list[dict[str, Any]]] = {"launcher": [], "glibc": []}
    for i in range(args.pairs):
        order = ["launcher", "glibc"] if i % 2 == 0 else ["glibc", "launcher"]
        for side in order:
            sides[side].append(launch(args, CPU_MALLOC_ENV if side == "launcher" else GLIBC_DEFAULT))
    rows, out = [], {}
    for v in VARIANTS:
        ms = {s: C.median([C.median(r["times"][v]) for r in runs]) * 1e3 for s, runs in sides.items()}
        per_pair = [
            C.median(g["times"][v]) / C.median(k["times"][v])
            for k, g in zip(sides["launcher"], sides["glibc"], strict=True)
        ]
        rows.append([v, ms["glibc"], ms["launcher"], C.median(per_pair), " ".join(f"{x:.2f}" for x in per_pair)])
        out[v] = {"glibc_ms": ms["glibc"], "launcher_ms": ms["launcher"], "speedup_per_pair": per_pair}
    rss = {s: max(r["peak_rss"] for r in runs) / 2**20 for s, runs in sides.items()}
    title2 = f"Part 2: default GPT, 2 ranks, {args.rounds} rounds per launch, {args.pairs} launch pairs"
    C.table(["variant", "glibc defaults ms", "launcher's ms", "speed-up", "per pair"], rows, title=title2)
    print(
        f"peak RSS per rank (largest of the launches): glibc defaults {rss['glibc']:.0f} MiB, "
        f"launcher's {rss['launcher']:.0f} MiB"
    )
    C.write_results("bench_malloc", {"config": vars(args), "fresh_pages": part1, "steps": out, "peak_rss_mib": rss})


if __name__ == "__main__":
    main(sys.argv[1:])
