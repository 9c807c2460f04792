"""bf16 mixed precision vs fp32: throughput ratio and the final losses of a short run, one process.

Two ``Trainer``s on the default GPT (6 blocks, width 384, 6 heads, context 256, micro-batch 8), one with
``precision.dtype = "bf16"`` (autocast: bf16 matmuls, fp32 master weights and optimizer state) and one with
``"fp32"``, same seed and so the same batches; blocks of steps alternate between them. One thread (one
core). Goal: bf16 throughput >= 2.5 x fp32, and the short run's final losses close. ``--before`` adds
two variants with the implementation choices of the code before cbd42a5 forced back at run time (SDPA
attention, tanh GELU, foreach AdamW; see bench_mfu.py), to reproduce the ratio measured then.

    .venv/bin/python -m benchmarks.bench_precision [--rounds 10] [--steps-per-block 2] [--before]
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from benchmarks import _common as C
from benchmarks.mfu_variants import BEFORE, apply_variant

GOAL = 2.5


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rounds", type=int, default=10)
    p.add_argument("--steps-per-block", type=int, default=2)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--micro-batch", type=int, default=8)
    p.add_argument("--loss-window", type=int, default=4, help="final loss = mean of the last N step losses")
    p.add_argument("--before", action="store_true", help="add variants with the choices before cbd42a5")
    return p.parse_args(argv)


def make_trainer(dtype: str, args: argparse.Namespace, text: Any, env: Any, total: int) -> Any:
    from disttrain.build import build_model
    from disttrain.config import from_dict
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


def run_variants(
    names: list[str], args: argparse.Namespace, text: Any, env: Any, total: int
) -> tuple[dict[str, list[float]], dict[str, list[float]]]:
    """Blocks of steps of every variant interleaved: seconds per step of every (variant, round), and every
    step's loss."""
    trainers = {}
    for name in names:
        trainers[name] = make_trainer(name[:4], args, text, env, total)
        if "before" in name:
            apply_variant(trainers[name], BEFORE)
    losses: dict[str, list[float]] = {n: [] for n in names}

    def runner(name: str) -> Any:
        tr = trainers[name]

        def run(n: int) -> None:
            losses[name].extend(C.fit_for(tr, n).losses)

        return run

    times = C.interleave(
        {n: runner(n) for n in names}, steps_per_block=args.steps_per_block, rounds=args.rounds, warmup=args.warmup
    )
    return times, losses


def compare(times: dict[str, list[float]], final: dict[str, float]) -> dict[str, Any]:
    """bf16 against fp32 (as is, and the code before cbd42a5 where it ran): print the summary, return its figures."""
    figures: dict[str, Any] = {}
    summary = []
    for suffix in ("", ", before"):
        if f"bf16{suffix}" not in times:
            continue
        fp32, bf16 = times[f"fp32{suffix}"], times[f"bf16{suffix}"]
        ratio = C.paired_ratio(fp32, bf16)
        lo, hi = C.spread([a / b for a, b in zip(fp32, bf16, strict=True)])
        dloss = final[f"bf16{suffix}"] - final[f"fp32{suffix}"]
        label = "as is" if not suffix else "code before cbd42a5 (SDPA, tanh GELU, foreach AdamW)"
        figures[label] = {
            "throughput_ratio_bf16_over_fp32": ratio,
            "ratio_quartiles": [lo, hi],
            "final_loss_diff": dloss,
        }
        verdict = C.verdict(ratio, GOAL)
        summary.append([f"bf16 / fp32 throughput, {label}", ratio, f"{lo:.2f}-{hi:.2f}", f">= {GOAL}", verdict])
        summary.append([f"final loss bf16 - fp32, {label}", dloss, "", "", ""])
    C.table(["figure", "value", "IQR", "goal", ""], summary, title="")
    return figures


def main(argv: list[str]) -> None:
    args = parse_args(argv)
    C.one_thread()
    from disttrain.data.text import load_text_data
    from disttrain.parallel.env import init_distributed

    env = init_distributed("cpu", threads=1)
    text = load_text_data(None, 256, 0.1)
    total = args.warmup + args.rounds * args.steps_per_block
    names = ["fp32", "bf16"] + (["fp32, before", "bf16, before"] if args.before else [])
    times, losses = run_variants(names, args, text, env, total)
    w = min(args.loss_window, total)
    final = {n: sum(losses[n][-w:]) / w for n in names}
    tokens = args.micro_batch * 256
    rows = [[n, C.median(times[n]) * 1e3, tokens / C.median(times[n]), final[n], losses[n][0]] for n in names]
    C.table(
        ["variant", "ms/step", "tokens/s", f"final loss (last {w})", "first loss"],
        rows,
        title=f"bf16 vs fp32, 1 process x 1 thread, default GPT, micro-batch {args.micro_batch}, {total} steps",
    )
    figures = compare(times, final)
    ratio = figures["as is"]["throughput_ratio_bf16_over_fp32"]
    C.write_results(
        "bench_precision",
        {
            "config": vars(args) | {"steps": total},
            "results": {
                "throughput_ratio_bf16_over_fp32": ratio,
                "goal": GOAL,
                "verdict": C.verdict(ratio, GOAL),
                "figures": figures,
                "s_per_step_median": {n: C.median(times[n]) for n in times},
                "final_loss": final,
                "losses": losses,
                "times_s_per_step": times,
            },
        },
    )


if __name__ == "__main__":
    main(sys.argv[1:])
