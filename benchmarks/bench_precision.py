"""bf16 mixed precision vs fp32: throughput ratio and the final losses of a short run, one process.

Two Trainers on the default GPT, ``precision.dtype`` bf16 and fp32, the same seed and batches, blocks of steps
alternating, one thread. Goal: bf16 >= 2.5x fp32. ``--before`` adds both with the implementation choices of the
code before cbd42a5 forced back (``bench_mfu.apply_variant``), to reproduce the ratio measured then.

    .venv/bin/python -m benchmarks.bench_precision [--rounds 10] [--steps-per-block 2] [--before]
"""

from __future__ import annotations

import argparse
from typing import Any

from benchmarks import harness as H
from benchmarks.bench_mfu import BEFORE, apply_variant

GOAL = H.Goal("bf16 / fp32 throughput", 2.5)
OPTIONS = {
    **H.block_options(rounds=10, steps_per_block=2, warmup=2),
    "micro_batch": (8, "micro-batch"),
    "loss_window": (4, "final loss = mean of the last N step losses"),
    "before": (False, "add variants with the choices before cbd42a5"),
}
QUICK = {**H.QUICK_BLOCKS, "micro_batch": 2, "loss_window": 1}


def run(args: argparse.Namespace) -> dict[str, Any]:
    H.one_thread()
    env, data = H.init_ranks(), H.text(256)
    total = args.warmup + args.rounds * args.steps_per_block
    names = ["fp32", "bf16"] + (["fp32, before", "bf16, before"] if args.before else [])
    losses: dict[str, list[float]] = {n: [] for n in names}

    def runner(name: str) -> Any:
        sections: dict[str, Any] = {"precision": {"dtype": name[:4]}, "optim": {"warmup_steps": 5}}
        sections["parallel"] = {"strategy": "single"}
        trainer = H.trainer(H.job(micro_batch=args.micro_batch, steps=total, **sections), data, env)
        apply_variant(trainer, BEFORE if "before" in name else ())
        return lambda n: losses[name].extend(H.fit_for(trainer, n).losses)

    times = H.interleave({n: runner(n) for n in names}, **H.blocks(args))
    w = min(args.loss_window, total)
    final = {n: sum(losses[n][-w:]) / w for n in names}
    tokens = args.micro_batch * 256
    rows = [
        {"variant": n, "ms/step": H.median(times[n]) * 1e3, "tokens/s": tokens / H.median(times[n])}
        | {f"final loss (last {w})": final[n], "first loss": losses[n][0]}
        for n in names
    ]
    H.table(rows, f"bf16 vs fp32, 1 process x 1 thread, default GPT, micro-batch {args.micro_batch}, {total} steps")
    figures = []
    for suffix in ("", ", before")[: 1 + args.before]:
        label = "as is" if not suffix else "code before cbd42a5 (SDPA, tanh GELU, foreach AdamW)"
        bf16, fp32 = f"bf16{suffix}", f"fp32{suffix}"
        ratio = H.ratio(times[fp32], times[bf16])
        figures.append(
            {"figure": f"bf16 / fp32 throughput, {label}", **ratio, "final loss bf16 - fp32": final[bf16] - final[fp32]}
        )
    H.table(figures)
    goals = [GOAL.check(figures[0]["ratio"])]
    return {"rows": rows, "figures": figures, "goals": goals, "losses": losses, "times_s_per_step": times}


if __name__ == "__main__":
    H.main(__file__, __doc__, OPTIONS, QUICK, run)
