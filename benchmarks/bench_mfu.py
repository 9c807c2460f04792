"""MFU of the default GPT in bf16 against the measured matmul peak; where the step time goes; what-ifs.

Part 1, one process x one thread: ``Trainer.fit()`` on the default GPT (6 x 384, 6 heads, context 256,
micro-batch 8, bf16). MFU = model FLOP/s (``GPT.flops_per_token``) / the bf16 matmul peak that
``disttrain.train.metrics.measure_matmul_tflops`` measures, once after every round in the same process.
A torch.profiler trace of a few steps gives the top ops by self CPU time and a breakdown by kind.
The same loop is timed side by side with variants that force one implementation choice, patched onto
one model instance at run time (nothing in src/ changes), so the benchmark keeps telling whether each
choice src/ makes is still the faster one on this CPU and torch:

* ``attention: SDPA``: ``F.scaled_dot_product_attention`` (its CPU flash kernel) instead of whatever the
  model does on CPU (since cbd42a5: ``baddbmm`` + softmax + ``bmm``);
* ``GELU: tanh``: ``F.gelu(approximate="tanh")``;
* ``AdamW: foreach``: ``AdamW(foreach=True)`` (src uses ``fused=True`` outside FSDP);
* ``GEMMs only``: not a training step: only the model's matmuls (every linear layer's forward and both
  backward GEMMs, and the attention bmm's, in bf16, same shapes): the MFU ceiling if nothing else cost
  anything;
* ``compile`` (``--compile``, adds ~30 s): ``torch.compile`` on the model.

Part 2, the default 2-rank job (DDP, global batch 16, micro-batch 8; one thread per rank): its MFU as
the Trainer computes it (against the peak it measures at start-up), the same with the gradient
all-reduce switched off (``no_sync`` on every step: the cost of communication), and with the three
choices above forced back to SDPA / tanh / foreach (the code before cbd42a5). Goal: MFU >= 35% (part 1).

    .venv/bin/python benchmarks/bench_mfu.py [--rounds 12] [--skip-2rank] [--compile]
"""

from __future__ import annotations

import argparse
import sys
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

import _common as C
from mfu_variants import BEFORE, GemmsOnly, apply_variant

GOAL = 0.35


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rounds", type=int, default=12, help="timed rounds (one step per variant each)")
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--profile-steps", type=int, default=3)
    p.add_argument("--rounds-2rank", type=int, default=6)
    p.add_argument("--skip-2rank", action="store_true")
    p.add_argument("--compile", action="store_true", help="add a torch.compile variant (compiles for ~30 s)")
    p.add_argument("--top", type=int, default=15, help="rows of the top-ops table")
    p.add_argument("--out", default=None, help=argparse.SUPPRESS)
    return p.parse_args(argv)


# -- set-up ---------------------------------------------------------------------------------------------
def job_config(world: int, total: int, peak: float | None) -> Any:
    from disttrain.config import from_dict

    return from_dict(
        {
            "train": {
                "steps": total,
                "global_batch": 8 * world,
                "micro_batch": 8,
                "eval_interval": 0,
                "generate_chars": 0,
            },
            "parallel": {"strategy": "ddp" if world > 1 else "single", "device": "cpu"},
            "precision": {"dtype": "bf16"},
            "metrics": {"peak_tflops": peak, "progress": "off"},
        }
    )


def make_trainer(text: Any, env: Any, total: int, choices: tuple[str, ...] = (), peak: float | None = 1.0) -> Any:
    from disttrain.build import build_model
    from disttrain.train.trainer import Trainer

    cfg = job_config(env.world_size, total, peak)
    model = build_model(cfg, text.tokenizer.vocab_size, on_meta=False)
    trainer = Trainer(model, text.train, cfg, env=env)
    apply_variant(trainer, choices)
    return trainer


def round_mfu(flops: float, times: list[float], peaks: list[float]) -> float:
    """Median over rounds of (flops / step time) / peak, each round against the peak measured right after it,
    so a burst of load from other processes slows both and cancels out."""
    return C.median([flops / t / (pk * 1e12) for t, pk in zip(times, peaks, strict=True)])


def fit_runner(trainer: Any, first_loss: dict[str, float], name: str) -> Any:
    def run(n: int) -> None:
        res = C.fit_for(trainer, n)
        first_loss.setdefault(name, res.losses[0])

    return run


# -- profile --------------------------------------------------------------------------------------------
KINDS = [
    ("linear matmuls", ("aten::mm", "aten::addmm")),
    ("attention", ("flash_attention", "aten::bmm", "aten::baddbmm", "softmax")),
    ("gelu", ("gelu",)),
    ("layernorm", ("layer_norm",)),
    ("dtype casts / copies", ("aten::copy_", "aten::_to_copy", "aten::cat")),
    ("communication", ("allreduce", "all_reduce", "gloo", "c10d")),
]


def kind_of(event: Any) -> str:
    parent = event
    while parent is not None:
        if "Optimizer.step" in parent.name:
            return "optimizer (AdamW)"
        if parent.name in ("aten::cross_entropy_loss", "aten::nll_loss_backward", "aten::_log_softmax_backward_data"):
            return "cross-entropy (fp32)"
        if parent.name in ("aten::_foreach_norm", "aten::linalg_vector_norm"):
            return "grad-norm clip"
        parent = parent.cpu_parent
    for kind, keys in KINDS:
        if any(k in event.name for k in keys):
            return kind
    return "other (adds, autograd, embedding, ...)"


def profile_steps(trainer: Any, steps: int, top: int) -> dict[str, Any]:
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(steps):
            trainer.train_step()
    total = sum(e.self_cpu_time_total for e in prof.events())
    kinds: dict[str, float] = defaultdict(float)
    for e in prof.events():
        kinds[kind_of(e)] += e.self_cpu_time_total
    ops = sorted(prof.key_averages(), key=lambda a: a.self_cpu_time_total, reverse=True)[:top]
    by_time = sorted(kinds.items(), key=lambda kv: -kv[1])
    return {
        "profiled_ms_per_step": total / steps / 1e3,
        "kinds": {k: {"ms_per_step": v / steps / 1e3, "share": v / total} for k, v in by_time},
        "top_ops": [
            {
                "op": a.key,
                "ms_per_step": a.self_cpu_time_total / steps / 1e3,
                "share": a.self_cpu_time_total / total,
                "calls_per_step": a.count / steps,
            }
            for a in ops
        ],
    }


# -- part 1: one process -------------------------------------------------------------------------------
@dataclass
class Part1:
    """Part 1's runs: the Trainers, seconds per step of every (variant, round), the bf16 matmul peak measured
    after each round, each Trainer's first loss."""

    trainers: dict[str, Any]
    times: dict[str, list[float]]
    peaks: list[float]
    first_loss: dict[str, float]


def run_part1(args: argparse.Namespace) -> Part1:
    """Every variant (and the GEMMs alone) one step per round, interleaved, a peak measured after each round."""
    from disttrain.data.text import load_text_data
    from disttrain.dist.env import init_distributed
    from disttrain.train.metrics import measure_matmul_tflops

    env = init_distributed("cpu", threads=1)
    text = load_text_data(None, 256, 0.1)
    total = args.warmup + args.rounds + args.profile_steps + 2
    variants: dict[str, tuple[str, ...]] = {"as is": (), **{c: (c,) for c in BEFORE}, "all three": BEFORE}
    if args.compile:
        variants["compile"] = ("compile",)
    trainers = {name: make_trainer(text, env, total, choices) for name, choices in variants.items()}
    first_loss: dict[str, float] = {}
    runners = {name: fit_runner(tr, first_loss, name) for name, tr in trainers.items()}
    runners["GEMMs only"] = GemmsOnly(text.tokenizer.vocab_size).run
    peaks: list[float] = []
    cpu = torch.device("cpu")
    times = C.interleave(
        runners,
        steps_per_block=1,
        rounds=args.rounds,
        warmup=args.warmup,
        between_rounds=lambda r: peaks.append(measure_matmul_tflops(cpu, torch.bfloat16)),
    )
    return Part1(trainers, times, peaks, first_loss)


def print_profiles(profiles: dict[str, Any], top: int) -> None:
    for name, prof in profiles.items():
        C.table(
            ["kind", "ms/step", "share"],
            [[k, v["ms_per_step"], f"{v['share'] * 100:.1f}%"] for k, v in prof["kinds"].items()],
            title=(
                f"\nWhere the step goes ({name}; torch.profiler self CPU time, "
                f"{prof['profiled_ms_per_step']:.0f} ms/step profiled)"
            ),
        )
    C.table(
        ["op", "ms/step", "share", "calls/step"],
        [
            [o["op"][:60], o["ms_per_step"], f"{o['share'] * 100:.1f}%", o["calls_per_step"]]
            for o in profiles["as is"]["top_ops"]
        ],
        title=f"\nTop {top} ops by self CPU time (as is)",
    )


def single_process(args: argparse.Namespace) -> dict[str, Any]:
    run = run_part1(args)
    times, peaks, first_loss = run.times, run.peaks, run.first_loss
    peak = C.median(peaks)
    flops_per_step = run.trainers["as is"].flops_per_sample * 8
    profiles = {"as is": profile_steps(run.trainers["as is"], args.profile_steps, args.top)}
    results: dict[str, Any] = {"peak_tflops_measured": peak, "peak_samples": peaks, "flops_per_step": flops_per_step}
    rows = []
    for name in times:
        t = C.median(times[name])
        mfu = round_mfu(flops_per_step, times[name], peaks)
        speedup = C.paired_ratio(times["as is"], times[name])
        results[name] = {
            "s_per_step_median": t,
            "mfu": mfu,
            "speedup_vs_as_is": speedup,
            "first_loss": first_loss.get(name),
            "times_s_per_step": times[name],
        }
        loss = f"{first_loss[name]:.4f}" if name in first_loss else "-"
        rows.append([name, t * 1e3, flops_per_step / t / 1e12, f"{mfu * 100:.1f}%", speedup, loss])
    results["profiles"] = profiles
    C.table(
        ["variant", "ms/step", "TFLOP/s", "MFU", "speed vs as is", "first loss"],
        rows,
        title=(
            f"Part 1: 1 process x 1 thread, default GPT, micro-batch 8, bf16; peak {peak:.3f} TFLOP/s "
            f"(bf16 matmul, median of {len(peaks)}, one after each round; MFU = median over rounds against it); "
            f"speed = paired median of step-time ratios; 'all three' = the code before cbd42a5"
        ),
    )
    print_profiles(profiles, args.top)
    return results


# -- part 2: the default 2-rank job ---------------------------------------------------------------------
def worker(args: argparse.Namespace) -> None:
    C.one_thread()
    from disttrain.data.text import load_text_data
    from disttrain.dist.env import init_distributed
    from disttrain.train.metrics import measure_matmul_tflops

    env = init_distributed("cpu", threads=1)
    text = load_text_data(None, 256, 0.1)
    total = args.warmup + args.rounds_2rank + 2
    # peak=None: each Trainer measures the peak at start-up, as the real job does.
    trainers = {
        "ddp": make_trainer(text, env, total, peak=None),
        "ddp, no all-reduce": make_trainer(text, env, total, peak=None),
        "ddp, SDPA + tanh + foreach": make_trainer(text, env, total, BEFORE, peak=None),
    }
    nosync = trainers["ddp, no all-reduce"]
    nosync.model.sync = lambda enabled: nosync.model.module.no_sync()
    first_loss: dict[str, float] = {}
    mfu_reported: dict[str, float] = {}

    def runner(name: str) -> Any:
        tr = trainers[name]

        def run(n: int) -> None:
            res = C.fit_for(tr, n)
            first_loss.setdefault(name, res.losses[0])
            mfu_reported[name] = res.mfu

        return run

    peaks: list[float] = []
    cpu = torch.device("cpu")

    def measure_peak(r: int) -> None:
        dist.barrier()
        peaks.append(measure_matmul_tflops(cpu, torch.bfloat16))

    times = C.interleave(
        {name: runner(name) for name in trainers},
        steps_per_block=1,
        rounds=args.rounds_2rank,
        warmup=args.warmup,
        before_block=dist.barrier,
        between_rounds=measure_peak,
    )
    out = {
        "times": times,
        "peaks": peaks,
        "trainer_peak": trainers["ddp"].peak,
        "mfu_reported": mfu_reported,
        "first_loss": first_loss,
        "flops_per_step_per_rank": trainers["ddp"].flops_per_sample * 8,
    }
    C.write_rank_result(args.out, env.rank, out)
    C.finish_worker()


def two_ranks(args: argparse.Namespace, argv: list[str]) -> dict[str, Any]:
    ranks = C.launch_and_collect(2, Path(__file__), argv)
    times = C.slowest_per_round([r["times"] for r in ranks])
    names = list(times)
    peaks = [min(r["peaks"][i] for r in ranks) for i in range(len(ranks[0]["peaks"]))]
    peak = C.median(peaks)
    start_peak = ranks[0]["trainer_peak"]
    flops = ranks[0]["flops_per_step_per_rank"]
    results: dict[str, Any] = {
        "peak_tflops_measured_per_rank": peak,
        "peak_samples": peaks,
        "trainer_start_up_peak": start_peak,
    }
    rows = []
    for n in names:
        t = C.median(times[n])
        mfu = round_mfu(flops, times[n], peaks)
        mfu_trainer = flops / t / (start_peak * 1e12)
        speedup = C.paired_ratio(times["ddp"], times[n])
        results[n] = {
            "s_per_step_median": t,
            "mfu": mfu,
            "mfu_vs_trainer_start_up_peak": mfu_trainer,
            "mfu_last_window_reported_by_trainer": ranks[0]["mfu_reported"][n],
            "speedup_vs_ddp": speedup,
            "first_loss": ranks[0]["first_loss"][n],
            "times_s_per_step": times[n],
        }
        rows.append([n, t * 1e3, f"{mfu * 100:.1f}%", f"{mfu_trainer * 100:.1f}%", speedup])
    C.table(
        ["variant", "ms/step", "MFU", "MFU vs start-up peak", "speedup"],
        rows,
        title=(
            f"\nPart 2: default job, DDP x 2 ranks x 1 thread, global batch 16, bf16; per-rank peak {peak:.3f} "
            f"TFLOP/s measured after each round while both ranks run (the Trainer's start-up figure: {start_peak:.3f})"
        ),
    )
    return results


def main(argv: list[str]) -> None:
    args = parse_args(argv)
    if C.is_worker():
        worker(args)
        return
    C.one_thread()
    out: dict[str, Any] = {"config": {k: v for k, v in vars(args).items() if k != "out"}}
    out["single_process"] = single_process(args)
    if not args.skip_2rank:
        out["two_ranks_ddp"] = two_ranks(args, argv)
    sp = out["single_process"]
    mfu = sp["as is"]["mfu"]
    out["goal"] = GOAL
    out["verdict"] = C.verdict(mfu, GOAL)
    rows = [
        ["MFU, 1 process, as is", f"{mfu * 100:.1f}%", f">= {GOAL:.0%}", C.verdict(mfu, GOAL)],
        ["MFU, 1 process, code before cbd42a5", f"{sp['all three']['mfu'] * 100:.1f}%", "", ""],
        ["MFU ceiling: the GEMMs alone", f"{sp['GEMMs only']['mfu'] * 100:.1f}%", "", ""],
    ]
    if "two_ranks_ddp" in out:
        two = out["two_ranks_ddp"]["ddp"]
        rows.append(
            ["MFU, default 2-rank DDP job (Trainer's way)", f"{two['mfu_vs_trainer_start_up_peak'] * 100:.1f}%"]
        )
        rows[-1] += ["", ""]
    C.table(["figure", "value", "goal", ""], rows, title="")
    C.write_results("bench_mfu", out)


if __name__ == "__main__":
    main(sys.argv[1:])
