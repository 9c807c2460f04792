"""``disttrain run`` with its defaults against the FSDP2 loop a tutorial writes: tokens/s ratio. The default GPT
on 2 ranks in one launch; the tutorial loop is ``bench_overhead.PlainLoop("fsdp")`` with the tutorial's choices
(``fully_shard`` per block then the root, ``MixedPrecisionPolicy(param_dtype=DTYPE, reduce_dtype=fp32)``, AdamW
defaults); disttrain is ``Trainer.fit()`` with every ``parallel`` and ``precision`` setting at its default. Each
rank also measures its matmul peak, for each loop's MFU and the ratio's ceiling. Goal: >= 1.6x.
"""

from __future__ import annotations

import argparse
from typing import Any

import torch

from benchmarks import harness as H
from benchmarks.bench_overhead import PlainLoop, timed_pair
from disttrain.config import DTYPES

GOAL = H.Goal("disttrain defaults / tutorial tokens/s", 1.6)
OPTIONS = {
    **H.options(launches=3, nproc=2, rounds=4, steps_per_block=2, warmup=2),
    **H.options(layers=6, width=384, heads=6, context=256, micro_batch=8),
    "dtype": ("bf16", "the tutorial loop's compute dtype", ("bf16", "fp32")),
    "model": ("gpt", None),  # PlainLoop's model choice
}
QUICK = {"launches": 1, **H.QUICK_BLOCKS, **H.QUICK_GPT}


def worker(args: argparse.Namespace) -> dict[str, Any]:
    from disttrain.config import to_dict
    from disttrain.train.metrics import measure_matmul_tflops

    env, data = H.init_ranks(), H.text(args.context)
    total = args.warmup + args.rounds * args.steps_per_block
    shape = H.gpt_of(args)
    # the Trainer as `disttrain run` builds it with nothing but the model shape and batch set
    trainer = H.trainer(H.job(shape, world=env.world_size, micro_batch=args.micro_batch, steps=total), data, env)
    tutorial = PlainLoop("fsdp", args, data, total, {"fused": None, "foreach": None, "bucket_cap_mb": 25.0})
    times = timed_pair(trainer, {"tutorial": tutorial}, args)
    peak = measure_matmul_tflops(torch.device("cpu"), DTYPES[args.dtype])
    out = {"peak_tflops": peak, "flops_per_step": trainer.flops_per_sample * args.micro_batch, "times": times}
    out |= {"strategy": trainer.dims.strategy, "reason": trainer.job.reason, "dtype": trainer.cfg.precision.dtype}
    return out | {"parallel": to_dict(trainer.cfg)["parallel"]}


def run(args: argparse.Namespace) -> dict[str, Any]:
    launches = [H.ranks(args.nproc, __file__, args.argv)[0] for _ in range(args.launches)]
    per_launch = sorted(H.paired_ratio(r["times"]["tutorial"], r["times"]["disttrain"]) for r in launches)
    ms = {k: H.median([x for r in launches for x in r["times"][k]]) * 1e3 for k in ("tutorial", "disttrain")}
    peak = H.median([r["peak_tflops"] for r in launches])  # per rank, both ranks busy
    first = launches[0]
    mfu = {k: first["flops_per_step"] / (v / 1e3) / (peak * 1e12) for k, v in ms.items()}
    names = {"tutorial": f"tutorial FSDP2 ({args.dtype})", "disttrain": f"disttrain defaults ({first['strategy']})"}
    rows = [{"variant": names[k], "ms/step": ms[k], "MFU": f"{mfu[k]:.1%}"} for k in names]
    rows[1] |= {"tokens/s ratio": H.median(per_launch), "per launch": " ".join(f"{r:.2f}" for r in per_launch)}
    model = f"GPT {args.layers}x{args.width} ctx {args.context}, micro-batch {args.micro_batch}"
    H.table(rows, f"disttrain defaults vs a tutorial FSDP2 loop: {args.nproc} ranks, {model}; {args.launches} launches")
    ceiling = 1.0 / mfu["tutorial"]
    print(f"disttrain chose: {first['strategy']} — {first['reason']}")
    print(f"MFU against the {args.dtype} matmul peak measured on each rank with both busy: {peak:.3f} TFLOP/s")
    print(f"ceiling of the ratio (a loop at 100% of that peak): {ceiling:.2f}x")
    goals = [GOAL.check(H.median(per_launch))]
    data = {"rows": rows, "goals": goals, "peak_tflops": peak, "mfu": mfu, "ratio_ceiling": ceiling}
    return {"name": f"bench_vs_tutorial_{args.dtype}", **data, "launches": launches}


if __name__ == "__main__":
    H.main(__file__, __doc__, OPTIONS, QUICK, run, worker)
