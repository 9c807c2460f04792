"""``disttrain run`` with its defaults against the FSDP2 loop a tutorial writes, side by side: tokens/s ratio.

Both train the default GPT (6 x 384, context 256) on 2 ranks (gloo, one thread each), micro-batch 8 per rank,
in one launch, blocks of steps alternating (the order rotates every round). The tutorial loop is
``bench_overhead.PlainLoop("fsdp")`` with the tutorial's choices: ``fully_shard`` each block then the root,
``MixedPrecisionPolicy(param_dtype=DTYPE, reduce_dtype=fp32)``, ``AdamW`` with its defaults, cross-entropy,
``clip_grad_norm_(1.0)``, ``loss.item()``. disttrain is ``Trainer.fit()`` with every ``parallel`` and
``precision`` setting left at its default (``strategy``, ``blocks_per_unit``, prefetch and ``compile`` are
``auto``; ``precision.dtype`` is ``auto``): what a new user gets. ``--dtype`` is the tutorial's compute dtype
(bf16, as the tutorial writes it; on a CPU without AMX / AVX512-BF16, where bf16 is emulated, compare at fp32
too: there ``auto`` picks fp32 and the bf16 ratio mostly measures that choice). Goal: >= 1.6x.

Each rank also measures its matmul peak in the tutorial's dtype after the timed rounds (both ranks busy, as in
training), so the table gives each loop's MFU and the ceiling of the ratio: a loop that ran at 100% of that
peak would be ``1 / tutorial MFU`` times faster than the tutorial. Where the tutorial already runs at more
than 62.5% MFU (compute-bound: fast matmuls, little communication), 1.6x is out of reach on that machine.

    .venv/bin/python -m benchmarks.bench_vs_tutorial [--dtype bf16|fp32] [--launches 3] [--rounds 4]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from benchmarks import _common as C
from benchmarks.bench_overhead import PlainLoop
from disttrain.testing.launch import finish_worker, is_worker, launch_and_collect, write_rank_result

GOAL = 1.6


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--launches", type=int, default=3)
    p.add_argument("--rounds", type=int, default=4)
    p.add_argument("--steps-per-block", type=int, default=2)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--nproc", type=int, default=2)
    p.add_argument("--dtype", choices=("bf16", "fp32"), default="bf16", help="the tutorial loop's compute dtype")
    C.add_gpt_args(p, layers=6, width=384, heads=6, context=256, micro_batch=8)
    p.add_argument("--model", default="gpt", help=argparse.SUPPRESS)  # PlainLoop's model choice
    p.add_argument("--out", default=None, help=argparse.SUPPRESS)
    return p.parse_args(argv)


def defaults_trainer(args: argparse.Namespace, text: Any, env: Any, total: int) -> Any:
    """The Trainer as ``disttrain run`` builds it with nothing but the model shape and batch set."""
    from disttrain.build import build_model
    from disttrain.config import from_dict
    from disttrain.train.trainer import Trainer

    cfg = from_dict(
        {
            "model": C.gpt_shape(args),
            "train": {
                "steps": total,
                "global_batch": args.micro_batch * env.world_size,
                "micro_batch": args.micro_batch,
                "eval_interval": 0,
                "generate_chars": 0,
            },
            "parallel": {"device": "cpu"},
            "metrics": {"peak_tflops": 1.0, "progress": "off"},
        }
    )
    return Trainer(build_model(cfg, text.tokenizer.vocab_size, on_meta=False), text.train, cfg, env=env)


def worker(args: argparse.Namespace) -> None:
    C.one_thread()
    from disttrain.config import to_dict
    from disttrain.data.text import load_text_data
    from disttrain.parallel.env import init_distributed
    from disttrain.train.metrics import measure_matmul_tflops
    from disttrain.utils.gc import GarbageCollection

    env = init_distributed("cpu", threads=1)
    text = load_text_data(None, args.context, 0.1)
    total = args.warmup + args.rounds * args.steps_per_block
    trainer = defaults_trainer(args, text, env, total)
    tutorial = PlainLoop(
        "fsdp",
        args,
        text.tokenizer.vocab_size,
        text.train,
        total,
        {"fused": None, "foreach": None, "bucket_cap_mb": 25.0},
    )

    def run_trainer(n: int) -> None:
        trainer.cfg.train.steps = trainer.step + n
        trainer.fit()

    with GarbageCollection(trainer.cfg.train.gc_interval):
        times = C.interleave(
            {"disttrain": run_trainer, "tutorial": tutorial.run},
            steps_per_block=args.steps_per_block,
            rounds=args.rounds,
            warmup=args.warmup,
            before_block=dist.barrier,
        )
    dtype = torch.bfloat16 if args.dtype == "bf16" else torch.float32
    out = {
        "peak_tflops": measure_matmul_tflops(torch.device("cpu"), dtype),
        "flops_per_step": trainer.flops_per_sample * args.micro_batch,
        "times": C.slowest_rank(times),
        "strategy": trainer.dims.strategy,
        "reason": trainer.strategy_reason,
        "parallel": to_dict(trainer.cfg)["parallel"],
        "dtype": trainer.cfg.precision.dtype,
    }
    write_rank_result(args.out, env.rank, out)
    finish_worker()


def main(argv: list[str]) -> None:
    args = parse_args(argv)
    if is_worker():
        worker(args)
        return
    C.print_machine()
    launches = [launch_and_collect(args.nproc, Path(__file__), argv, echo=True)[0] for _ in range(args.launches)]
    per_launch = [C.paired_ratio(r["times"]["tutorial"], r["times"]["disttrain"]) for r in launches]
    ratio = C.median(per_launch)
    first = launches[0]
    tut_ms = C.median([x for r in launches for x in r["times"]["tutorial"]]) * 1e3
    dt_ms = C.median([x for r in launches for x in r["times"]["disttrain"]]) * 1e3
    peak = C.median([r["peak_tflops"] for r in launches])  # per rank, both ranks busy

    def mfu(ms: float) -> float:
        return first["flops_per_step"] / (ms / 1e3) / (peak * 1e12)

    C.table(
        ["variant", "ms/step", "MFU", "tokens/s ratio", "per launch", "goal", ""],
        [
            [f"tutorial FSDP2 ({args.dtype})", tut_ms, f"{mfu(tut_ms):.1%}", 1.0, "", "", ""],
            [
                f"disttrain defaults ({first['strategy']}, {first['dtype']})",
                dt_ms,
                f"{mfu(dt_ms):.1%}",
                ratio,
                " ".join(f"{r:.2f}" for r in sorted(per_launch)),
                f">= {GOAL}",
                C.verdict(ratio, GOAL),
            ],
        ],
        title=f"disttrain defaults vs a tutorial FSDP2 loop: {args.nproc} ranks, GPT {args.layers}x{args.width} "
        f"ctx {args.context}, micro-batch {args.micro_batch}; median of {args.launches} launches",
    )
    print(f"disttrain chose: {first['strategy']} — {first['reason']}")
    ceiling = 1.0 / mfu(tut_ms)
    print(
        f"MFU against the {args.dtype} matmul peak measured on each rank with both busy ({peak:.3f} TFLOP/s); "
        f"ceiling of the ratio (a loop at 100% of that peak): {ceiling:.2f}x"
        + (f": the {GOAL}x goal is out of reach on this machine" if ceiling < GOAL else "")
    )
    C.write_results(
        f"bench_vs_tutorial_{args.dtype}",
        {
            "config": {k: v for k, v in vars(args).items() if k != "out"},
            "ratio": ratio,
            "per_launch": per_launch,
            "tutorial_ms": tut_ms,
            "disttrain_ms": dt_ms,
            "launches": launches,
            "goal": GOAL,
            "peak_tflops": peak,
            "mfu": {"tutorial": mfu(tut_ms), "disttrain": mfu(dt_ms)},
            "ratio_ceiling": ceiling,
        },
    )


if __name__ == "__main__":
    main(sys.argv[1:])
