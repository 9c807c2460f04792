"""bf16 mixed precision vs fp32: throughput ratio and the final losses of a short run, one process.

Two ``Trainer``s on the default GPT (6 blocks, width 384, 6 heads, context 256, micro-batch 8), one with
``precision.dtype = "bf16"`` (autocast: bf16 matmuls, fp32 master weights and optimizer state) and one with
``"fp32"``, same seed and so the same batches; blocks of steps alternate between them. One thread (one
core). Goal: bf16 throughput >= 2.5 x fp32, and the short run's final losses close.

    .venv/bin/python benchmarks/bench_precision.py [--rounds 8] [--steps-per-block 2]
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

import _common as C

GOAL = 2.5


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rounds", type=int, default=8)
    p.add_argument("--steps-per-block", type=int, default=2)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--micro-batch", type=int, default=8)
    p.add_argument("--loss-window", type=int, default=4, help="final loss = mean of the last N step losses")
    return p.parse_args(argv)


def make_trainer(dtype: str, args: argparse.Namespace, text: Any, env: Any, total: int) -> Any:
    from disttrain.config import from_dict
    from disttrain.job import build_model
    from disttrain.train.trainer import Trainer

    cfg = from_dict(
        {
            "train": {
                "steps": total,
                "global_batch": args.micro_batch,
                "micro_batch": args.micro_batch,
                "eval_interval": 0,
                "generate_chars": 0,
            },
            "optim": {"warmup_steps": 5},
            "parallel": {"strategy": "single", "device": "cpu"},
            "precision": {"dtype": dtype},
            "metrics": {"peak_tflops": 1.0, "progress": "off"},
        }
    )
    model = build_model(cfg, text.tokenizer.vocab_size, on_meta=False)
    return Trainer(model, text.train, cfg, env=env)


def main(argv: list[str]) -> None:
    args = parse_args(argv)
    C.one_thread()
    from disttrain.data.text import load_text_data
    from disttrain.dist.env import init_distributed

    env = init_distributed("cpu", threads=1)
    text = load_text_data(None, 256, 0.1)
    total = args.warmup + args.rounds * args.steps_per_block
    trainers = {d: make_trainer(d, args, text, env, total) for d in ("bf16", "fp32")}
    losses: dict[str, list[float]] = {d: [] for d in trainers}

    def runner(dtype: str) -> Any:
        tr = trainers[dtype]

        def run(n: int) -> None:
            tr.cfg.train.steps = tr.step + n
            losses[dtype].extend(tr.fit().losses)

        return run

    times = C.interleave(
        {d: runner(d) for d in trainers}, steps_per_block=args.steps_per_block, rounds=args.rounds, warmup=args.warmup
    )
    ratio = C.paired_ratio(times["fp32"], times["bf16"])
    lo, hi = C.spread([a / b for a, b in zip(times["fp32"], times["bf16"], strict=True)])
    w = args.loss_window
    final = {d: sum(losses[d][-w:]) / w for d in trainers}
    tokens = args.micro_batch * 256
    rows = [
        [d, C.median(times[d]) * 1e3, tokens / C.median(times[d]), final[d], losses[d][0]]
        for d in ("fp32", "bf16")
    ]
    C.table(
        ["dtype", "ms/step", "tokens/s", f"final loss (last {w})", "first loss"],
        rows,
        title=f"bf16 vs fp32, 1 process x 1 thread, default GPT, micro-batch {args.micro_batch}, {total} steps",
    )
    C.table(
        ["figure", "value", "goal", ""],
        [
            ["bf16 / fp32 throughput", ratio, f">= {GOAL}", C.verdict(ratio, GOAL)],
            ["  IQR over rounds", f"{lo:.2f}-{hi:.2f}", "", ""],
            ["final loss bf16 - fp32", final["bf16"] - final["fp32"], "", ""],
        ],
    )
    C.write_results(
        "bench_precision",
        {
            "config": vars(args) | {"steps": total},
            "results": {
                "throughput_ratio_bf16_over_fp32": ratio,
                "ratio_quartiles": [lo, hi],
                "goal": GOAL,
                "verdict": C.verdict(ratio, GOAL),
                "s_per_step_median": {d: C.median(times[d]) for d in times},
                "final_loss": final,
                "losses": losses,
                "times_s_per_step": times,
            },
        },
    )


if __name__ == "__main__":
    main(sys.argv[1:])
