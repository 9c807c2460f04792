"""glibc's allocator settings for CPU workers (``disttrain.utils.malloc.CPU_MALLOC_ENV``) against glibc's defaults
(which map buffers of 32 MiB or more afresh, zeroed, every step). Part 1: a fresh buffer filled by a copy vs a copy
into a kept one, by size. Part 2: the default GPT on 2 ranks (DDP, FSDP with 1 and 6 blocks per unit), launches
alternating between the launcher's settings and ``DISTTRAIN_CPU_MALLOC=glibc``: the median over launch pairs of
the per-variant median step, and peak RSS.
"""

from __future__ import annotations

import argparse
import functools
import os
import resource
from typing import Any

import torch

from benchmarks import harness as H
from disttrain.testing.launch import child_env

VARIANTS: dict[str, dict[str, Any]] = {
    "ddp": {"strategy": "ddp"},
    "fsdp 1/unit": {"blocks_per_unit": 1},
    "fsdp 6/unit": {"blocks_per_unit": 6},
}
OPTIONS = {
    "pairs": (2, "launch pairs (launcher's settings, glibc's defaults)"),
    **H.options(rounds=6, layers=6, width=384),  # rounds: timed steps of each variant per launch
}
QUICK = {"pairs": 1, "rounds": 1, "layers": 2, "width": 192}


def fresh_copy(src: torch.Tensor) -> torch.Tensor:
    return torch.empty_like(src).copy_(src)


def fresh_pages() -> list[dict[str, Any]]:
    """Part 1: ms to fill a fresh buffer vs a kept one, by size (one thread, this process's allocator)."""
    rows = []
    for mib in (16, 31, 33, 64):
        src = torch.ones(mib * 2**18)
        kept = torch.empty_like(src)
        calls = {
            "fresh": H.per_call(functools.partial(fresh_copy, src)),
            "kept": H.per_call(functools.partial(kept.copy_, src)),
        }
        ms = {k: H.median(v) * 1e3 for k, v in H.side_by_side(calls, 20, warmup=3).items()}
        rows.append(
            {"buffer": f"{mib} MiB", "fresh ms": ms["fresh"], "kept ms": ms["kept"], "ratio": ms["fresh"] / ms["kept"]}
        )
    return rows


def worker(args: argparse.Namespace) -> dict[str, Any]:
    import torch.distributed as dist

    env, data = H.init_ranks(), H.text(256)
    trainers = {}
    for name, parallel in VARIANTS.items():
        settings: dict[str, Any] = {"strategy": "fsdp", "forward_prefetch": 1, "backward_prefetch": 1, **parallel}
        cfg = H.job(H.gpt(args.layers, args.width, 6, 256), world=env.world_size, parallel=settings)
        trainers[name] = H.trainer(cfg, data, env)
    times = H.interleave(
        {n: H.train_steps(t) for n, t in trainers.items()},
        steps_per_block=1,
        rounds=args.rounds,
        warmup=1,
        before_block=dist.barrier,
    )
    return {"times": H.slowest_rank(times), "peak_rss": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024}


def launch(args: argparse.Namespace, settings: dict[str, str]) -> dict[str, Any]:
    """One launch of 2 ranks with these allocator settings (and none of ours from this process)."""
    mine = {k: v for k, v in os.environ.items() if not k.startswith(("MALLOC_", "DISTTRAIN_CPU_MALLOC"))}
    ranks = H.ranks(2, __file__, args.argv, env=child_env(base=mine, extra=settings))
    return {"times": ranks[0]["times"], "peak_rss": max(r["peak_rss"] for r in ranks)}


def run(args: argparse.Namespace) -> dict[str, Any]:
    from disttrain.utils.malloc import CPU_MALLOC_ENV

    part1 = fresh_pages()
    H.table(part1, "Part 1: this process (glibc's defaults unless MALLOC_* is set): fill a fresh buffer vs a kept one")
    sides = {"launcher": dict(CPU_MALLOC_ENV), "glibc": {"DISTTRAIN_CPU_MALLOC": "glibc"}}
    runs = H.side_by_side({side: functools.partial(launch, args, s) for side, s in sides.items()}, args.pairs)
    rows = []
    for v in VARIANTS:
        medians = {side: [H.median(r["times"][v]) for r in rs] for side, rs in runs.items()}
        per_pair = [g / k for k, g in zip(medians["launcher"], medians["glibc"], strict=True)]
        rows.append({"variant": v, "glibc defaults ms": H.median(medians["glibc"]) * 1e3})
        rows[-1] |= {"launcher's ms": H.median(medians["launcher"]) * 1e3, "speed-up": H.median(per_pair)}
        rows[-1]["per pair"] = " ".join(f"{x:.2f}" for x in per_pair)
    H.table(rows, f"Part 2: GPT {args.layers}x{args.width}, 2 ranks, {args.rounds} rounds x {args.pairs} launch pairs")
    rss = {side: max(r["peak_rss"] for r in rs) / 2**20 for side, rs in runs.items()}
    print(f"peak RSS per rank (largest of the launches): glibc defaults {rss['glibc']:.0f} MiB, ", end="")
    print(f"launcher's {rss['launcher']:.0f} MiB")
    return {"fresh_pages": part1, "rows": rows, "peak_rss_mib": rss, "runs": runs}


if __name__ == "__main__":
    H.main(__file__, __doc__, OPTIONS, QUICK, run, worker)
