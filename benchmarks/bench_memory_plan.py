"""The memory planner (``disttrain.plan.estimate``) held to account: predicted vs measured, DeepSpeed's ZeRO
formulas at 7B / 70B, and the throughput of HSDP vs FSDP vs DDP.

Three parts, each selectable with ``--parts`` (default: all three):

* ``measure``: the plan's per-rank bytes (params, grads, optimizer, activations, total peak) against what
  ranks really hold, for the default GPT (6 x 384) and a ~4x larger one (``d_model`` 768) at 1, 2 and 4
  ranks, every strategy (single at 1 rank; DDP, FSDP, FSDP without reshard, FSDP + CPU offload at 2 and
  4; HSDP as 2 replicas x 2 shards at 4, compared with a plan for 2 ranks x 2 nodes, whose HSDP column
  shards within a node). Micro-batch 4, one micro-step, ``--dtype`` fp32 by default (the figures are
  bytes, so the dtype only changes the speed: bf16 is quick only with AMX). Measured by
  ``disttrain.jobs.measure.measure``, one launch per strategy: exact storage accounting after an
  optimizer step for params / grads / optimizer, saved-tensor hooks for activations, and the process RSS
  peak above the RSS before the model was built for the total (``MALLOC_MMAP_THRESHOLD_=65536``, so freed
  tensors leave the RSS). ``--one-launch`` runs every strategy in one launch instead (quicker), but then
  only the first strategy pays the process's one-time costs (library code paged in, kernel caches,
  communicator buffers; ~40 MiB here) and the later peaks come out lower. Nothing is timed, so the load
  on the machine does not matter. Targets: 5% for params / grads / optimizer, 20% for the total peak.
* ``zero``: the plan for a ~7B and a ~70B GPT (built on the meta device: no memory, no processes) on 8
  devices (1 node) and 64 (8 nodes of 8), next to DeepSpeed's published ZeRO formulas for K = 12
  (mixed-precision Adam): baseline (2 + 2 + K) P, ZeRO-2 2 P + (2 + K) P / N, ZeRO-3 (2 + 2 + K) P / N.
* ``throughput``: DDP vs FSDP vs HSDP (2 x 2) at 4 ranks, in one launch, blocks of ``Trainer.fit()``
  steps interleaved (rotating order), paired medians of the per-round ratios. GPT 4 x 256, context 128,
  micro-batch 4, ``--dtype``. 4 ranks on a 2-core machine are oversubscribed: the ratios say how the strategies
  compare when compute is scarce, not what a real cluster would show.

    .venv/bin/python -m benchmarks.bench_memory_plan [--parts measure,zero,throughput] [--ranks 1,2,4]
                                                     [--models 384,768] [--rounds 8] [--dtype fp32]
"""

from __future__ import annotations

import argparse
import functools
import os
import sys
import time
from pathlib import Path
from typing import Any

import torch

from benchmarks import _common as C
from disttrain.testing.launch import finish_worker, is_worker, launch_and_collect, write_rank_result

GiB = 2**30
MiB = 2**20
TARGETS = {"params": 5.0, "grads": 5.0, "optimizer": 5.0, "total peak": 20.0}
ROWS = ("params", "grads", "optimizer", "activations saved", "total peak")  # disttrain.plan.render.compare's rows
STRATEGIES = ("ddp", "fsdp", "fsdp_no_reshard", "fsdp_offload")
K_ADAM = 12  # DeepSpeed's K for mixed-precision Adam: fp32 master weights + two fp32 moments


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--parts", default="measure,zero,throughput", help="which parts, comma-separated")
    p.add_argument("--ranks", default="1,2,4", help="measure: world sizes")
    p.add_argument("--models", default="384,768", help="measure: GPT widths (d_model; 6 layers, 6 heads)")
    p.add_argument("--micro-batch", type=int, default=4, help="measure: micro-batch per rank")
    p.add_argument("--dtype", default="fp32", help="measure and throughput: compute dtype (bf16 needs AMX to be quick)")
    p.add_argument(
        "--one-launch", action="store_true", help="measure: every strategy in one launch (quicker, see docstring)"
    )
    p.add_argument("--rounds", type=int, default=8, help="throughput: timed blocks per variant")
    p.add_argument("--steps-per-block", type=int, default=2)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--role", default=None, help=argparse.SUPPRESS)  # set for the workers
    p.add_argument("--width", type=int, default=384, help=argparse.SUPPRESS)
    p.add_argument("--out", default=None, help=argparse.SUPPRESS)
    return p.parse_args(argv)


# -- part 1: predicted vs measured ----------------------------------------------------------------------
def job_config(
    model: dict[str, int], world: int, micro: int, strategy: str = "auto", dtype: str = "fp32", steps: int | None = None
) -> Any:
    """A job on ``world`` CPU ranks (oversubscribed); HSDP as 2 replicas x 2 shards."""
    from disttrain.config import from_dict

    parallel: dict[str, Any] = {"strategy": strategy, "device": "cpu", "oversubscribe": True}
    if strategy == "hsdp":
        parallel |= {"replicate": 2, "shard": 2}
    train = {"global_batch": micro * world, "micro_batch": micro, "eval_interval": 0, "generate_chars": 0}
    if steps is not None:
        train = {"steps": steps, **train}
    return from_dict(
        {
            "model": model,
            "train": train,
            "parallel": parallel,
            "precision": {"dtype": dtype},
            "metrics": {"peak_tflops": 1.0, "progress": "off"},
        }
    )


def strategies_at(world: int) -> list[str]:
    if world == 1:
        return ["single"]
    return [*STRATEGIES, "hsdp"] if world == 4 else list(STRATEGIES)


def measure_worker(args: argparse.Namespace) -> None:
    """Every strategy in turn on this rank; each ``measure_strategy`` takes its own RSS baseline."""
    import gc

    from disttrain.jobs.measure import measure_strategy
    from disttrain.parallel.env import init_distributed

    env = init_distributed("cpu", threads=1)
    out = {}
    for s in strategies_at(env.world_size):
        strategy = "hsdp" if s == "hsdp" else "auto"
        cfg = job_config({"d_model": args.width}, env.world_size, args.micro_batch, strategy, args.dtype)
        gc.collect()
        out[s] = measure_strategy(cfg, s, env, steps=2)
    write_rank_result(args.out, env.rank, out)
    finish_worker()


def largest_rank(ranks: list[dict[str, Any]], s: str) -> dict[str, Any]:
    """The rank that must fit (as ``memory_measure.measure`` picks it): most params + grads + optimizer."""
    return max((r[s] for r in ranks), key=lambda m: m["params"] + m["grads"] + m["optimizer"])


def measure_at(args: argparse.Namespace, argv: list[str], width: int, world: int) -> dict[str, Any]:
    """Every strategy at ``world`` ranks, GPT width ``width``: what the ranks hold against the plan."""
    from disttrain.jobs.measure import measure
    from disttrain.plan.estimate import Layout, plan_job
    from disttrain.plan.render import compare
    from disttrain.train.loss import cross_entropy

    t0 = time.perf_counter()
    strategies = strategies_at(world)
    print(f"measure: d_model {width}, {world} rank(s): {', '.join(strategies)} ...", flush=True)
    cfg = job_config({"d_model": width}, world, args.micro_batch, dtype=args.dtype)
    cfg_h = job_config({"d_model": width}, world, args.micro_batch, "hsdp", args.dtype)
    if not args.one_launch:
        measured = measure(cfg, world, [s for s in strategies if s != "hsdp"])
        if "hsdp" in strategies:
            measured |= measure(cfg_h, world, ["hsdp"])
    else:
        worker_argv = [*argv, "--role", "measure", "--width", str(width)]
        ranks = launch_and_collect(world, Path(__file__), worker_argv, echo=True)
        measured = {s: largest_rank(ranks, s) for s in strategies}
    mem = 80 * GiB  # the plan's figures do not depend on it
    est = plan_job(cfg, Layout(world, 1, mem), cross_entropy)
    flat = {("ddp" if s == "single" else s): m for s, m in measured.items() if s != "hsdp"}
    _, tables = compare(est, flat)
    if "hsdp" in measured:  # HSDP 2 x 2 on one machine = the plan's HSDP at 2 ranks per node x 2 nodes
        est_h = plan_job(cfg_h, Layout(2, 2, mem), cross_entropy)
        _, tables_h = compare(est_h, {"hsdp": measured["hsdp"]})
        tables |= tables_h
    return {
        "d_model": width,
        "world": world,
        "n_params": est.profile.n_params,
        "measured": measured,
        "compare": tables,
        "seconds": time.perf_counter() - t0,
    }


def measure_rows(width: int, world: int, tables: dict[str, Any]) -> list[list[Any]]:
    rows: list[list[Any]] = []
    for s, tab in tables.items():
        if "error" in tab:
            rows.append([f"d{width} x{world} {s}", "failed", tab["error"][:80]])
            continue
        label = "single" if world == 1 else s
        for row in ROWS:
            r = tab[row]
            rows.append(
                [
                    f"d{width} x{world} {label}" if row == "params" else "",
                    row,
                    r["predicted"] / MiB,
                    r["measured"] / MiB,
                    f"{r['error_pct']:+.1f}%",
                    _target(row, r["error_pct"]),
                ]
            )
    return rows


def run_measure(args: argparse.Namespace, argv: list[str]) -> dict[str, Any]:
    os.environ["MALLOC_MMAP_THRESHOLD_"] = "65536"  # as memory_measure.measure sets it for its workers
    results: dict[str, Any] = {}
    rows: list[list[Any]] = []
    for width in [int(w) for w in args.models.split(",")]:
        for world in [int(n) for n in args.ranks.split(",")]:
            results[f"d{width}_x{world}"] = res = measure_at(args, argv, width, world)
            rows += measure_rows(width, world, res["compare"])
    C.table(
        ["model x ranks strategy", "row", "predicted MiB", "measured MiB", "error", "target"],
        rows,
        title=(
            f"Predicted vs measured per rank (largest rank), GPT 6 layers, {args.dtype}, "
            f"micro-batch {args.micro_batch}, 1 micro-step; "
            "total peak measured = RSS peak above the RSS before the model was built"
        ),
    )
    return results


def _target(row: str, err: float) -> str:
    if row not in TARGETS:
        return "-"
    t = TARGETS[row]
    return f"<= {t:.0f}% " + ("met" if abs(err) <= t else "MISSED")


# -- part 2: 7B / 70B vs DeepSpeed's ZeRO formulas -------------------------------------------------------
LARGE = {
    "7B": {"n_layers": 32, "d_model": 4096, "n_heads": 32},
    "70B": {"n_layers": 80, "d_model": 8192, "n_heads": 64},
}


def zero_at(name: str, prof: Any, cfg: Any, nnodes: int, rows: list[list[Any]]) -> dict[str, Any]:
    """The plan for ``prof`` on ``nnodes`` nodes of 8 devices next to DeepSpeed's formulas (its rows into ``rows``)."""
    from disttrain.plan.estimate import Layout, estimate

    p = prof.n_params
    lay = Layout(8, nnodes, 80 * GiB)
    n = lay.world
    est = estimate(prof, cfg, lay)
    ds = {
        "ddp": ("baseline (2+2+K)P", (2 + 2 + K_ADAM) * p),
        "fsdp_no_reshard": ("ZeRO-2 2P+(2+K)P/N", 2 * p + (2 + K_ADAM) * p / n),
        "fsdp": ("ZeRO-3 (2+2+K)P/N", (2 + 2 + K_ADAM) * p / n),
        "hsdp": ("ZeRO-3, N=8 (ZeRO++ hpZ-like)", (2 + 2 + K_ADAM) * p / 8),
    }
    res: dict[str, Any] = {"n_params": p, "world": n, "plan": est.to_json(), "deepspeed": {}}
    for s, (formula, ds_bytes) in ds.items():
        if s == "hsdp" and nnodes == 1:
            continue  # one node: HSDP = FSDP
        plan = est.plans[s]
        states = plan.params + plan.grads + plan.optimizer
        res["deepspeed"][s] = {"formula": formula, "bytes": ds_bytes, "ours_model_states": states}
        rows.append(
            [
                f"{name} ({p / 1e9:.2f}B) x {n}",
                s,
                states / GiB,
                plan.gathered / GiB,
                plan.activations / GiB,
                plan.total / GiB,
                formula,
                ds_bytes / GiB,
                states / ds_bytes,
                "yes" if est.fits[s] else "no",
            ]
        )
    res["recommendation"] = [est.choice, est.reason]
    return res


def run_zero() -> dict[str, Any]:
    from disttrain.config import from_dict
    from disttrain.models.gpt import GPT, GPTConfig
    from disttrain.plan.profile import profile_model
    from disttrain.train.loss import cross_entropy

    cfg = from_dict({"train": {"micro_batch": 1, "global_batch": 64}, "precision": {"dtype": "bf16"}})
    ctx = 4096
    sample = (torch.zeros(ctx, dtype=torch.long), torch.zeros(ctx, dtype=torch.long))
    results: dict[str, Any] = {}
    rows: list[list[Any]] = []
    for name, shape in LARGE.items():
        t0 = time.perf_counter()
        with torch.device("meta"):
            model = GPT(GPTConfig(32000, context=ctx, **shape))
        # planned for GPUs: attention accounted as CUDA's fused kernels run it (what --parallel.device cuda does)
        prof = profile_model(
            model, sample, micro_batch=1, loss_fn=cross_entropy, compute_dtype="bf16", attention="flash"
        )
        for nnodes in (1, 8):
            res = zero_at(name, prof, cfg, nnodes, rows)
            results[f"{name}_x{res['world']}"] = res
        results[f"{name}_profile"] = {
            "n_params": prof.n_params,
            "activations_bytes": prof.activations("none"),
            "activations_full_ac_bytes": prof.activations("full"),
            "seconds": time.perf_counter() - t0,
        }
        del model
    C.table(
        [
            "model x devices",
            "ours",
            "states GiB",
            "gathered GiB",
            "activ. GiB",
            "total GiB",
            "DeepSpeed (K=12)",
            "DS GiB",
            "states/DS",
            "fits 72 GiB",
        ],
        rows,
        title="Per-device plan (bf16, flash attention, micro-batch 1, context 4096, 80 GiB devices, 10% headroom) "
        "vs DeepSpeed ZeRO",
    )
    return results


# -- part 3: throughput of DDP vs FSDP vs HSDP ----------------------------------------------------------
TP = {"layers": 4, "width": 256, "heads": 4, "context": 128, "micro": 4}


def throughput_worker(args: argparse.Namespace) -> None:
    import torch.distributed as dist

    C.one_thread()
    from disttrain.build import build_model
    from disttrain.data.text import load_text_data
    from disttrain.parallel.env import init_distributed
    from disttrain.parallel.strategies import SHARDED
    from disttrain.train.trainer import Trainer

    env = init_distributed("cpu", threads=1)
    text = load_text_data(None, TP["context"], 0.1)
    total = args.warmup + args.rounds * args.steps_per_block
    trainers: dict[str, Any] = {}
    shape = {"n_layers": TP["layers"], "d_model": TP["width"], "n_heads": TP["heads"], "context": TP["context"]}
    for s in ("ddp", "fsdp", "hsdp"):
        cfg = job_config(shape, env.world_size, TP["micro"], s, args.dtype, steps=total)
        model = build_model(cfg, text.tokenizer.vocab_size, on_meta=s in SHARDED)
        trainers[s] = Trainer(model, text.train, cfg, env=env)

    times = C.interleave(
        {s: functools.partial(C.fit_for, t) for s, t in trainers.items()},
        steps_per_block=args.steps_per_block,
        rounds=args.rounds,
        warmup=args.warmup,
        before_block=dist.barrier,
    )
    out = C.slowest_rank(times)
    write_rank_result(args.out, env.rank, out)
    finish_worker()


def run_throughput(args: argparse.Namespace, argv: list[str]) -> dict[str, Any]:
    print("throughput: DDP, FSDP, HSDP 2x2 at 4 ranks, one launch ...", flush=True)
    times = launch_and_collect(4, Path(__file__), [*argv, "--role", "throughput"], echo=True)[0]
    tokens = TP["micro"] * TP["context"] * 4
    rows, figures = [], {}
    for s in ("ddp", "fsdp", "hsdp"):
        ms = C.median(times[s]) * 1e3
        vs_ddp = [d / x for d, x in zip(times["ddp"], times[s], strict=True)]
        vs_fsdp = [f / x for f, x in zip(times["fsdp"], times[s], strict=True)]
        figures[s] = {
            "ms_per_step_median": ms,
            "tokens_per_s_median": tokens / (ms / 1e3),
            "throughput_vs_ddp": C.median(vs_ddp),
            "throughput_vs_ddp_quartiles": list(C.spread(vs_ddp)),
            "throughput_vs_fsdp": C.median(vs_fsdp),
            "throughput_vs_fsdp_quartiles": list(C.spread(vs_fsdp)),
            "times_s_per_step": times[s],
        }
        q = C.spread(vs_ddp)
        rows.append([s, ms, tokens / (ms / 1e3), C.median(vs_ddp), f"{q[0]:.3f}-{q[1]:.3f}", C.median(vs_fsdp)])
    C.table(
        ["strategy", "ms/step", "tokens/s", "vs DDP", "IQR", "vs FSDP"],
        rows,
        title=(
            f"Throughput at 4 ranks (oversubscribed: 2 cores), GPT {TP['layers']}x{TP['width']} ctx {TP['context']}, "
            f"micro-batch {TP['micro']}, {args.dtype}; paired medians of {args.rounds} rounds "
            f"x {args.steps_per_block} steps"
        ),
    )
    return figures


def main(argv: list[str]) -> None:
    args = parse_args(argv)
    if is_worker():
        measure_worker(args) if args.role == "measure" else throughput_worker(args)
        return
    parts = args.parts.split(",")
    unknown = set(parts) - {"measure", "zero", "throughput"}
    if unknown:
        raise SystemExit(f"unknown --parts {sorted(unknown)}; choose from measure, zero, throughput")
    t0 = time.perf_counter()
    results: dict[str, Any] = {}
    if "zero" in parts:
        results["zero"] = run_zero()
    if "measure" in parts:
        results["measure"] = run_measure(args, argv)
    if "throughput" in parts:
        results["throughput"] = run_throughput(args, argv)
    config = {k: v for k, v in vars(args).items() if k not in ("out", "role", "width")}
    results["seconds"] = time.perf_counter() - t0
    name = "bench_memory_plan" + ("" if len(parts) == 3 else "_" + "_".join(parts))
    C.write_results(name, {"config": config | {"throughput_model": TP}, "results": results})


if __name__ == "__main__":
    main(sys.argv[1:])
