"""What health monitoring costs per training step: heartbeats + hang watchdog + straggler figures, on vs off.

One launch of 2 ranks (gloo, one thread each) trains the same GPT (4 blocks, width 256, context 128, DDP;
bf16 where the CPU multiplies bf16 fast, else fp32: see ``pick_dtype``) under four variants, in blocks of
steps interleaved round by round (the order rotates), so the machine's noise hits them alike:

* ``none``: the Trainer's health hooks replaced by no-ops (the floor);
* ``hooks``: ``health.enabled = false`` (the phase/step hooks still run, no thread);
* ``on``: the default (a heartbeat every 2 s to the c10d store, rank 0 watching every rank);
* ``on-0.1s``: heartbeats every 0.1 s (20x the default rate).

(Every variant with health on all-gathers the straggler window's figures every ``straggler_interval`` steps.)

A fresh HealthMonitor is started before each ``on`` block and closed after it, outside the timed part.
The figure is the median over rounds of the paired ratio t(variant) / t(none). Goal: on / none < 1.01.

On a loaded machine those ratios scatter by far more than 1%, so each rank also times, one call at a time
(wall and CPU of the calling thread, 200 calls each), what the thread runs every period (one heartbeat
``store.set``, the verdict ``check``, and on rank 0 the watchdog pass) and what the training thread runs
every step (the phase/step hooks and the hook points, at step 100 and at step 100,000: their cost must not grow with the
step). Period cost / heartbeat_s is the share of a core the monitor takes, whatever the step time.

    .venv/bin/python -m benchmarks.bench_health [--rounds 12] [--steps-per-block 4] [--dtype auto]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

import torch

from benchmarks import _common as C
from disttrain.config import HealthConfig
from disttrain.testing.launch import finish_worker, is_worker, launch_and_collect, write_rank_result

GOAL = 1.01


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rounds", type=int, default=12)
    p.add_argument("--steps-per-block", type=int, default=4)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--nproc", type=int, default=2)
    p.add_argument(
        "--dtype",
        choices=["auto", "bf16", "fp32"],
        default="auto",
        help="auto: bf16 where the CPU has fast bf16 matmuls (oneDNN: AVX-512/AMX), else fp32",
    )
    p.add_argument("--out", default=None, help=argparse.SUPPRESS)
    return p.parse_args(argv)


class _NoHealth:
    """The hooks as no-ops: what a loop without health monitoring pays."""

    stragglers: list[int] = []  # noqa: RUF012
    rank_figures: dict[str, list[float]] = {}  # noqa: RUF012

    def phase(self, name: str) -> None:
        pass

    def step_done(self, step: int, seconds: float) -> None:
        pass


def pick_dtype(requested: str) -> str:
    """bf16 only where the CPU multiplies bf16 fast: without AVX-512/AMX, torch falls back to a reference
    GEMM ~100x slower than fp32 (0.18 vs 18 GFLOP/s on an AVX2 EPYC), and one step takes tens of seconds."""
    if requested != "auto":
        return requested
    try:
        fast = bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
    except (AttributeError, RuntimeError):
        fast = False
    return "bf16" if fast else "fp32"


def direct_costs(cfg: Any, rank: int, world: int, calls: int = 200) -> dict[str, float]:
    """Seconds per call (wall, and CPU of this thread) of what the monitor runs each period and each step."""
    import dataclasses

    from disttrain.health import HealthMonitor
    from disttrain.health.stragglers import CollectiveExchange
    from disttrain.utils import hooks

    # a period of an hour: the thread sleeps, and the calls below are what it would run each period
    mon = HealthMonitor(dataclasses.replace(cfg, heartbeat_s=3600.0), rank, world, None, 600.0)
    mon.start()
    torch.distributed.barrier()  # every rank's first heartbeat is in the store
    out: dict[str, float] = {}

    def timed(key: str, fn: Any, n: int = calls) -> None:
        fn()
        w0, c0 = time.perf_counter(), time.thread_time()
        for _ in range(n):
            fn()
        out[f"{key}_wall_s"] = (time.perf_counter() - w0) / n
        out[f"{key}_cpu_s"] = (time.thread_time() - c0) / n

    timed("beat", mon._beat)
    # the straggler window's all-gather, on the training thread once every health.straggler_interval steps
    timed("exchange", lambda: CollectiveExchange()(cfg.straggler_interval, (0.1, 0.0)))
    timed("verdict_check", lambda: mon._store.check(["verdict"]))
    if rank == 0:
        timed("watch", mon._watch)
    for step in (100, 100_000):

        def per_step(s: int = step) -> None:  # what train_step + fit call per step: the monitor, the hook points
            mon.phase("data")
            hooks.fire("step_start", s, rank)
            mon.phase("forward")
            hooks.apply("loss", 1.0, s, rank)
            mon.phase("backward")
            mon.phase("optimizer")
            mon.step_done(s + 1, 1.0)

        timed(f"hooks_step{step}", per_step, 20 * calls)
    torch.distributed.barrier()
    mon.close()
    return out


def make_trainers(args: argparse.Namespace, env: Any, text: Any) -> dict[str, Any]:
    """The four variants' Trainers, on the same GPT (same seed), in the order a round runs them (rotated)."""
    from disttrain.config import JobConfig, from_dict
    from disttrain.models.gpt import GPT, GPTConfig
    from disttrain.train.trainer import Trainer

    base = {
        "model": {"n_layers": 4, "d_model": 256, "n_heads": 4, "context": 128},
        "train": {"steps": 10_000, "global_batch": 16, "micro_batch": 8, "eval_interval": 0},
        "parallel": {"strategy": "ddp", "device": "cpu"},
        "precision": {"dtype": args.dtype},
        "metrics": {"progress": "off", "peak_tflops": 1.0},
    }

    def make(**health: Any) -> Trainer:
        cfg: JobConfig = from_dict({**base, "health": health})
        model = GPT(GPTConfig(text.tokenizer.vocab_size, 4, 256, 4, 128), seed=1)
        return Trainer(model, text.train, cfg, env=env)

    trainers = {
        "none": make(enabled=False),
        "hooks": make(enabled=False),
        "on": make(),
        "on-0.1s": make(heartbeat_s=0.1),
    }
    trainers["none"].health = _NoHealth()  # type: ignore[assignment]
    return trainers


def steps(t: Any, n: int) -> None:
    """``n`` training steps, each reported to the trainer's health monitor as ``fit()`` does."""
    for _ in range(n):
        t0 = time.perf_counter()
        t.train_step()
        t.health.step_done(t.step, time.perf_counter() - t0)


def interleaved_blocks(trainers: dict[str, Any], args: argparse.Namespace, env: Any) -> dict[str, list[float]]:
    """Seconds per step of every (variant, round); an ``on`` variant gets a fresh HealthMonitor before each
    block and closes it after, outside the timed part."""
    import dataclasses

    from disttrain.health import HealthMonitor

    def fresh_monitor(t: Any) -> None:
        cfg = t.cfg.health
        t.health = HealthMonitor(dataclasses.replace(cfg), env.rank, env.world_size, None, 600.0)
        t.health.start()

    for t in trainers.values():
        steps(t, args.warmup)
    names = list(trainers)
    times: dict[str, list[float]] = {n: [] for n in names}
    for r in range(args.rounds):
        k = r % len(names)
        for name in names[k:] + names[:k]:
            t = trainers[name]
            if name.startswith("on"):
                fresh_monitor(t)
            torch.distributed.barrier()
            t0 = time.perf_counter()
            steps(t, args.steps_per_block)
            times[name].append((time.perf_counter() - t0) / args.steps_per_block)
            if name.startswith("on"):
                t.health.close()
    return times


def worker(args: argparse.Namespace) -> None:
    from disttrain.data.text import load_text_data
    from disttrain.parallel.env import init_distributed

    C.one_thread()
    env = init_distributed("cpu", threads=1)
    text = load_text_data(None, 128, 0.1)
    trainers = make_trainers(args, env, text)
    times = interleaved_blocks(trainers, args, env)
    direct = direct_costs(trainers["on"].cfg.health, env.rank, env.world_size)
    write_rank_result(args.out, env.rank, {"times": times, "direct": direct})
    finish_worker()


def report_steps(times: dict[str, list[float]], args: argparse.Namespace) -> dict[str, Any]:
    """The step-time table (rank 0's clock: the ranks are in lockstep under DDP) and the goal's verdict."""
    rows, results = [], {}
    for name, ts in times.items():
        ratio = C.paired_ratio(ts, times["none"])
        lo, hi = C.spread([a / b for a, b in zip(ts, times["none"], strict=True)])
        rows.append([name, C.median(ts) * 1e3, ratio, f"{lo:.3f}-{hi:.3f}"])
        results[name] = {"median_step_s": C.median(ts), "ratio_vs_none": ratio, "iqr": [lo, hi], "times": ts}
    C.table(
        ["variant", "ms/step (median)", "t / t(none)", "IQR of ratio"],
        rows,
        title=f"health monitoring cost, {args.nproc} ranks, {args.rounds} rounds x {args.steps_per_block} steps",
    )
    on = results["on"]["ratio_vs_none"]
    print(f"goal: on / none < {GOAL}: {C.verdict(on, GOAL, higher_is_better=False)} ({on:.4f})")
    return results


def direct_row(r: int, d: dict[str, float], step_s: float, interval: int) -> list[Any]:
    """Rank ``r``'s direct costs (and, into ``d``, the cost of one heartbeat period)."""
    period_wall = d["beat_wall_s"] + d["verdict_check_wall_s"] + d.get("watch_wall_s", 0.0)
    period_cpu = d["beat_cpu_s"] + d["verdict_check_cpu_s"] + d.get("watch_cpu_s", 0.0)
    d["period_wall_s"], d["period_cpu_s"] = period_wall, period_cpu
    return [
        f"rank {r}",
        d["beat_wall_s"] * 1e3,
        d.get("watch_wall_s", 0.0) * 1e3,
        period_wall * 1e3,
        period_cpu * 1e3,
        f"{100 * period_cpu / 2.0:.3f}%",
        f"{100 * period_cpu / 0.1:.2f}%",
        d["hooks_step100_wall_s"] * 1e6,
        d["hooks_step100000_wall_s"] * 1e6,
        f"{100 * d['hooks_step100000_wall_s'] / step_s:.4f}%",
        d["exchange_wall_s"] * 1e3,
        f"{100 * d['exchange_wall_s'] / (interval * step_s):.4f}%",
    ]


def main(argv: list[str]) -> None:
    args = parse_args(argv)
    if is_worker():
        worker(args)
        return
    args.dtype = pick_dtype(args.dtype)
    fwd = ["--rounds", str(args.rounds), "--steps-per-block", str(args.steps_per_block), "--warmup", str(args.warmup)]
    fwd += ["--dtype", args.dtype]
    ranks = launch_and_collect(args.nproc, Path(__file__), fwd, echo=True)
    results = report_steps(ranks[0]["times"], args)  # the ranks are in lockstep (DDP): rank 0's clock is the job's
    step_s = results["none"]["median_step_s"]
    C.table(
        [
            "rank",
            "beat ms",
            "watch ms",
            "period ms (wall)",
            "period ms (CPU)",
            "CPU/2s",
            "CPU/0.1s",
            "hooks us/step @100",
            "@100k",
            "hooks/step",
            "exchange ms",
            "exchange/step",
        ],
        [direct_row(r, rank["direct"], step_s, HealthConfig().straggler_interval) for r, rank in enumerate(ranks)],
        title="direct: cost of one heartbeat period (set + verdict check [+ watchdog pass]), of the hooks and of the "
        "straggler window's all-gather (once per straggler_interval steps)",
    )
    direct = {f"rank{r}": rank["direct"] for r, rank in enumerate(ranks)}
    C.write_results("bench_health", {"args": vars(args), "goal": GOAL, "results": results, "direct": direct})


if __name__ == "__main__":
    main(sys.argv[1:])
