"""MFU of the default GPT against the measured matmul peak; where the step time goes; what-ifs.

Part 1, one process x one thread: ``Trainer.fit()`` on the default GPT (6 x 384, 6 heads, context 256,
micro-batch 8) in ``--dtype`` (default: what ``precision.dtype = "auto"`` picks on this CPU: bf16 where
bf16 matmuls are fast, else fp32). MFU = model FLOP/s (``GPT.flops_per_token``) / the matmul peak in that
dtype that ``disttrain.train.metrics.measure_matmul_tflops`` measures, once after every round in the same
process. Every figure also on the CPU clock (the thread's CPU time, step and peak alike): on a shared 2-core
machine the wall clock also counts the time a step waited for a core, and only the CPU clock resolves
differences of a few %.
A torch.profiler trace of a few steps gives the top ops by self CPU time and a breakdown by kind.
The same loop is timed side by side with variants that force one implementation choice, patched onto
one model instance at run time (nothing in src/ changes), so the benchmark keeps telling whether each
choice src/ makes is still the faster one on this CPU and torch:

* ``attention: SDPA``: ``F.scaled_dot_product_attention`` (its CPU flash kernel) whatever the dtype and CPU;
* ``GELU: tanh``: ``F.gelu(approximate="tanh")``;
* ``AdamW: foreach``: ``AdamW(foreach=True)`` (src uses ``fused=True`` outside FSDP);
* ``attention: bmm``: ``baddbmm`` + softmax + ``bmm`` (what src does for bf16 on a CPU with AMX or AVX512-BF16; SDPA
  elsewhere);
* ``GEMMs only``: not a training step: only the model's matmuls (every linear layer's forward and both
  backward GEMMs, and the attention bmm's, in the same dtype and shapes): the MFU ceiling if nothing else
  cost anything;
* ``compile: blocks`` and ``compile: model`` (``--compile``): ``parallel.compile`` (src/disttrain/parallel/compile.py),
  each block or the whole model through torch.compile; the first step's extra time is reported as the
  compile time, cold (a fresh inductor cache folder for the run unless ``--warm-cache``): what the first run
  of a job on a machine pays. Adds ~1-3 min on a 2-core CPU.

Part 2, the default 2-rank job (DDP, global batch 16, micro-batch 8; one thread per rank): its MFU as
the Trainer computes it (against the peak it measures at start-up), the same with the gradient
all-reduce switched off (``no_sync`` on every step: the cost of communication), and with the three
choices above forced back to SDPA / tanh / foreach (the code before cbd42a5). Goal: MFU >= 35% (part 1).

    .venv/bin/python -m benchmarks.bench_mfu [--rounds 12] [--skip-2rank] [--compile] [--dtype fp32|bf16]
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from benchmarks import _common as C
from benchmarks.mfu_variants import (
    BEFORE,
    COMPILE_MODES,
    GemmsOnly,
    apply_variant,
    cpu_peak_tflops,
    first_steps,
    on_cpu_clock,
    print_profiles,
    profile_steps,
)
from disttrain.testing.launch import finish_worker, is_worker, launch_and_collect, write_rank_result

GOAL = 0.35


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rounds", type=int, default=12, help="timed rounds (one step per variant each)")
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--profile-steps", type=int, default=3)
    p.add_argument("--rounds-2rank", type=int, default=6)
    p.add_argument("--skip-2rank", action="store_true")
    p.add_argument("--compile", action="store_true", help="add parallel.compile = blocks and = model variants")
    p.add_argument("--skip-before", action="store_true", help="leave out the SDPA / tanh / foreach variants")
    p.add_argument("--warm-cache", action="store_true", help="compile with the usual inductor cache (else a fresh one)")
    p.add_argument("--dtype", choices=["auto", "fp32", "bf16"], default="auto", help="auto: what precision auto picks")
    p.add_argument("--top", type=int, default=15, help="rows of the top-ops table")
    p.add_argument("--out", default=None, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    args.dtype = resolve_dtype(args.dtype)
    return args


# -- set-up ---------------------------------------------------------------------------------------------
def resolve_dtype(dtype: str) -> str:
    """``auto`` -> what ``precision.dtype = "auto"`` resolves to on this CPU."""
    from disttrain.config import PrecisionConfig
    from disttrain.parallel.env import resolve_precision

    return resolve_precision(PrecisionConfig(dtype=dtype), "cpu").dtype


def job_config(world: int, total: int, peak: float | None, dtype: str = "bf16", compile: str = "off") -> Any:
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
            "parallel": {"strategy": "ddp" if world > 1 else "single", "device": "cpu", "compile": compile},
            "precision": {"dtype": dtype},
            "metrics": {"peak_tflops": peak, "progress": "off"},
        }
    )


def make_trainer(
    text: Any,
    env: Any,
    total: int,
    choices: tuple[str, ...] = (),
    peak: float | None = 1.0,
    dtype: str = "bf16",
    compile: str = "off",
) -> Any:
    from disttrain.build import build_model
    from disttrain.train.trainer import Trainer

    cfg = job_config(env.world_size, total, peak, dtype, compile)
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


# -- part 1: one process -------------------------------------------------------------------------------
@dataclass
class Part1:
    """Part 1's runs: the Trainers, seconds per step of every (variant, round), the matmul peak measured after
    each round, each Trainer's first loss, and each variant's first step (compiling, for the compile ones)."""

    trainers: dict[str, Any]
    times: dict[str, list[float]]
    peaks: list[float]
    first_loss: dict[str, float]
    first_step_s: dict[str, float]
    cpu_times: dict[str, list[float]]
    cpu_peaks: list[float]


def run_part1(args: argparse.Namespace) -> Part1:
    """Every variant (and the GEMMs alone) one step per round, interleaved, a peak measured after each round."""
    from disttrain.config import DTYPES
    from disttrain.data.text import load_text_data
    from disttrain.parallel.env import init_distributed
    from disttrain.train.metrics import measure_matmul_tflops

    env = init_distributed("cpu", threads=1)
    text = load_text_data(None, 256, 0.1)
    total = args.warmup + args.rounds + args.profile_steps + 3
    variants: dict[str, tuple[str, ...]] = {"as is": ()}
    if not args.skip_before:
        variants.update({**{c: (c,) for c in BEFORE}, "all three": BEFORE, "attention: bmm": ("attention: bmm",)})
    trainers = {name: make_trainer(text, env, total, choices, dtype=args.dtype) for name, choices in variants.items()}
    if args.compile:
        for name, mode in COMPILE_MODES.items():
            trainers[name] = make_trainer(text, env, total, dtype=args.dtype, compile=mode)
    first_loss: dict[str, float] = {}
    runners = {name: fit_runner(tr, first_loss, name) for name, tr in trainers.items()}
    runners["GEMMs only"] = GemmsOnly(text.tokenizer.vocab_size, dtype=DTYPES[args.dtype]).run
    cpu_times: dict[str, list[float]] = {}
    runners = on_cpu_clock(runners, cpu_times)
    first = first_steps(runners, cold=not args.warm_cache)
    peaks: list[float] = []
    cpu_peaks: list[float] = []

    def measure_peaks(r: int) -> None:
        peaks.append(measure_matmul_tflops(torch.device("cpu"), DTYPES[args.dtype]))
        cpu_peaks.append(cpu_peak_tflops(DTYPES[args.dtype]))

    times = C.interleave(
        runners, steps_per_block=1, rounds=args.rounds, warmup=max(args.warmup - 1, 0), between_rounds=measure_peaks
    )
    cpu_times = {name: ts[-args.rounds :] for name, ts in cpu_times.items()}  # the timed rounds only
    return Part1(trainers, times, peaks, first_loss, first, cpu_times, cpu_peaks)


def variant_figures(run: Part1, name: str, flops: float) -> dict[str, Any]:
    """One variant's step time, MFU and speed-up, on the wall clock and on the CPU clock (see on_cpu_clock)."""
    wall, cpu = run.times[name], run.cpu_times[name]
    lo, hi = C.spread([a / b for a, b in zip(run.times["as is"], wall, strict=True)])
    t = C.median(wall)
    return {
        "s_per_step_median": t,
        "mfu": round_mfu(flops, wall, run.peaks),
        "speedup_vs_as_is": C.paired_ratio(run.times["as is"], wall),
        "speedup_iqr": [lo, hi],
        "cpu_s_per_step_median": C.median(cpu),
        "mfu_cpu_clock": round_mfu(flops, cpu, run.cpu_peaks),
        "speedup_vs_as_is_cpu_clock": C.paired_ratio(run.cpu_times["as is"], cpu),
        "first_step_s": run.first_step_s[name],
        "first_step_extra_s": run.first_step_s[name] - t,
        "first_loss": run.first_loss.get(name),
        "times_s_per_step": wall,
        "cpu_s_per_step": cpu,
    }


def single_process(args: argparse.Namespace) -> dict[str, Any]:
    run = run_part1(args)
    peak, cpu_peak = C.median(run.peaks), C.median(run.cpu_peaks)
    flops_per_step = run.trainers["as is"].flops_per_sample * 8
    profiled = [n for n in ("as is", "compile: blocks") if n in run.trainers]
    profiles = {n: profile_steps(run.trainers[n], args.profile_steps, args.top) for n in profiled}
    results: dict[str, Any] = {
        "dtype": args.dtype,
        "peak_tflops_measured": peak,
        "peak_samples": run.peaks,
        "peak_tflops_cpu_clock": cpu_peak,
        "peak_samples_cpu_clock": run.cpu_peaks,
        "flops_per_step": flops_per_step,
    }
    rows = []
    for name in run.times:
        r = results[name] = variant_figures(run, name, flops_per_step)
        lo, hi = r["speedup_iqr"]
        rows.append(
            [
                name,
                r["s_per_step_median"] * 1e3,
                f"{r['mfu'] * 100:.1f}%",
                r["speedup_vs_as_is"],
                f"{lo:.2f}-{hi:.2f}",
                r["cpu_s_per_step_median"] * 1e3,
                f"{r['mfu_cpu_clock'] * 100:.1f}%",
                r["speedup_vs_as_is_cpu_clock"],
                f"{r['first_step_extra_s']:.1f}",
                f"{r['first_loss']:.4f}" if r["first_loss"] is not None else "-",
            ]
        )
    results["profiles"] = profiles
    headers = ["variant", "ms/step", "MFU", "speed", "IQR", "CPU ms/step", "MFU (CPU)", "speed (CPU)"]
    C.table(
        [*headers, "1st step +s", "first loss"],
        rows,
        title=(
            f"Part 1: 1 process x 1 thread, default GPT, micro-batch 8, {args.dtype}; {args.dtype} matmul peak "
            f"{peak:.3f} TFLOP/s wall clock, {cpu_peak:.3f} CPU clock (medians of {len(run.peaks)}, one after each "
            "round; MFU = median over rounds against it); speed = paired median of as-is / variant step-time "
            "ratios; CPU = this thread's CPU time (excludes waiting for a core held by another process); "
            "'all three' = the code before cbd42a5; 1st step +s = first step - median step (compile time)"
        ),
    )
    print_profiles(profiles, args.top)
    return results


# -- part 2: the default 2-rank job ---------------------------------------------------------------------
def worker(args: argparse.Namespace) -> None:
    C.one_thread()
    from disttrain.config import DTYPES
    from disttrain.data.text import load_text_data
    from disttrain.parallel.env import init_distributed
    from disttrain.train.metrics import measure_matmul_tflops

    env = init_distributed("cpu", threads=1)
    text = load_text_data(None, 256, 0.1)
    total = args.warmup + args.rounds_2rank + 2
    # peak=None: each Trainer measures the peak at start-up, as the real job does.
    trainers = {
        "ddp": make_trainer(text, env, total, peak=None, dtype=args.dtype),
        "ddp, no all-reduce": make_trainer(text, env, total, peak=None, dtype=args.dtype),
        "ddp, SDPA + tanh + foreach": make_trainer(text, env, total, BEFORE, peak=None, dtype=args.dtype),
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
        peaks.append(measure_matmul_tflops(cpu, DTYPES[args.dtype]))

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
    write_rank_result(args.out, env.rank, out)
    finish_worker()


def two_ranks(args: argparse.Namespace, argv: list[str]) -> dict[str, Any]:
    ranks = launch_and_collect(2, Path(__file__), argv, echo=True)
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
            f"\nPart 2: default job, DDP x 2 ranks x 1 thread, global batch 16, {args.dtype}; per-rank peak {peak:.3f} "
            f"TFLOP/s measured after each round while both ranks run (the Trainer's start-up figure: {start_peak:.3f})"
        ),
    )
    return results


def main(argv: list[str]) -> None:
    args = parse_args(argv)
    if is_worker():
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
    rows = [["MFU, 1 process, as is", f"{mfu * 100:.1f}%", f">= {GOAL:.0%}", C.verdict(mfu, GOAL)]]
    for label, name in [("code before cbd42a5", "all three"), *[(n, n) for n in COMPILE_MODES]]:
        if name in sp:
            rows.append([f"MFU, 1 process, {label}", f"{sp[name]['mfu'] * 100:.1f}%", "", ""])
    rows.append(["MFU ceiling: the GEMMs alone", f"{sp['GEMMs only']['mfu'] * 100:.1f}%", "", ""])
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
