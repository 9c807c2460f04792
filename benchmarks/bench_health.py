"""What health monitoring costs per training step: heartbeats + hang watchdog + straggler figures, on vs off.

One launch of 2 ranks, GPT 4 x 256 (context 128, DDP, ``--dtype auto``), four variants in blocks of steps:
``none`` (the Trainer's health hooks replaced by no-ops), ``hooks`` (``health.enabled = false``), ``on`` (the
default: a heartbeat every 2 s, rank 0 watching) and ``on-0.1s``; a fresh HealthMonitor around each ``on`` block,
untimed. Goal: on / none <= 1.01. That ratio scatters by more than 1% on a loaded machine, so each rank also times
one call at a time (wall and thread CPU) what the monitor's thread runs every period, the straggler window's
all-gather, and the hooks the training thread runs every step (at step 100 and 100,000: they must not grow).
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import time
from collections.abc import Callable
from typing import Any

import torch.distributed as dist

from benchmarks import harness as H

GOAL = H.Goal("step time, health on / none", 1.01, higher_is_better=False)
OPTIONS = {
    **H.options(rounds=12, steps_per_block=4, warmup=3, nproc=2),
    "calls": (200, "direct costs: calls timed per figure"),
    "dtype": ("auto", "auto: what precision auto picks on this CPU", ("auto", "bf16", "fp32")),
}
QUICK = {**H.QUICK_BLOCKS, "calls": 10}


class _NoHealth:
    """The hooks as no-ops: what a loop without health monitoring pays."""

    stragglers: list[int] = []  # noqa: RUF012
    rank_figures: dict[str, list[float]] = {}  # noqa: RUF012

    def phase(self, name: str) -> None:
        pass

    def step_done(self, step: int, seconds: float) -> None:
        pass


def direct_costs(cfg: Any, rank: int, world: int, calls: int) -> dict[str, float]:
    """Seconds per call (wall, and CPU of this thread) of what the monitor runs each period and each step."""
    from disttrain.health import HealthMonitor
    from disttrain.health.stragglers import CollectiveExchange
    from disttrain.utils import hooks

    # a period of an hour: the thread sleeps, and the calls below are what it would run each period
    mon = HealthMonitor(dataclasses.replace(cfg, heartbeat_s=3600.0), rank, world, None, 600.0)
    mon.start()
    dist.barrier()  # every rank's first heartbeat is in the store
    out: dict[str, float] = {}

    def timed(key: str, fn: Callable[[], Any], n: int = calls) -> None:
        fn()
        w0, c0 = time.perf_counter(), time.thread_time()
        for _ in range(n):
            fn()
        out[f"{key}_wall_s"], out[f"{key}_cpu_s"] = (time.perf_counter() - w0) / n, (time.thread_time() - c0) / n

    def per_step(s: int) -> None:  # what train_step + fit call per step: the monitor, the hook points
        mon.phase("data")
        hooks.fire("step_start", s, rank)
        mon.phase("forward")
        hooks.apply("loss", 1.0, s, rank)
        mon.phase("backward")
        mon.phase("optimizer")
        mon.step_done(s + 1, 1.0)

    timed("beat", mon._beat)
    # the straggler window's all-gather, on the training thread once every health.straggler_interval steps
    timed("exchange", lambda: CollectiveExchange()(cfg.straggler_interval, (0.1, 0.0)))
    timed("verdict_check", lambda: mon._store.check(["verdict"]))
    if rank == 0:
        timed("watch", mon._watch)
    for step in (100, 100_000):
        timed(f"hooks_step{step}", functools.partial(per_step, step), 20 * calls)
    dist.barrier()
    mon.close()
    return out


def steps(trainer: Any, n: int) -> None:
    """``n`` training steps, each reported to the trainer's health monitor as ``fit()`` does."""
    for _ in range(n):
        t0 = time.perf_counter()
        trainer.train_step()
        trainer.health.step_done(trainer.step, time.perf_counter() - t0)


def block(trainer: Any, args: argparse.Namespace, env: Any, monitor: bool) -> Callable[[], float]:
    """One variant's timed block: seconds per step of ``steps_per_block`` steps; ``monitor``: a fresh
    HealthMonitor started before and closed after, untimed."""
    from disttrain.health import HealthMonitor

    def run() -> float:
        if monitor:
            trainer.health = HealthMonitor(trainer.cfg.health, env.rank, env.world_size, None, 600.0)
            trainer.health.start()
        dist.barrier()
        t0 = time.perf_counter()
        steps(trainer, args.steps_per_block)
        seconds = (time.perf_counter() - t0) / args.steps_per_block
        if monitor:
            trainer.health.close()
        return seconds

    return run


def worker(args: argparse.Namespace) -> dict[str, Any]:
    from disttrain.models.gpt import GPT, GPTConfig

    env, data = H.init_ranks(), H.text(128)
    health = {"none": {"enabled": False}, "hooks": {"enabled": False}, "on": {}, "on-0.1s": {"heartbeat_s": 0.1}}
    sections: dict[str, Any] = {"parallel": {"strategy": "ddp"}, "precision": {"dtype": args.dtype}}
    trainers = {}
    for name, settings in health.items():
        cfg = H.job(H.gpt(4, 256, 4, 128), world=env.world_size, steps=10_000, health=settings, **sections)
        model = GPT(GPTConfig(data.tokenizer.vocab_size, 4, 256, 4, 128), seed=1)  # the same GPT in every variant
        trainers[name] = H.trainer(cfg, data, env, model=model)
    trainers["none"].health = _NoHealth()
    for trainer in trainers.values():
        steps(trainer, args.warmup)
    blocks = {n: block(t, args, env, monitor=n.startswith("on")) for n, t in trainers.items()}
    times = H.side_by_side(blocks, args.rounds)
    return {"times": times, "direct": direct_costs(trainers["on"].cfg.health, env.rank, env.world_size, args.calls)}


def direct_row(rank: int, d: dict[str, float], step_s: float, interval: int) -> dict[str, Any]:
    """Rank ``rank``'s direct costs (and, into ``d``, the cost of one heartbeat period)."""
    d["period_wall_s"] = d["beat_wall_s"] + d["verdict_check_wall_s"] + d.get("watch_wall_s", 0.0)
    d["period_cpu_s"] = period = d["beat_cpu_s"] + d["verdict_check_cpu_s"] + d.get("watch_cpu_s", 0.0)
    row: dict[str, Any] = {"rank": rank, "period ms (wall)": d["period_wall_s"] * 1e3, "period ms (CPU)": period * 1e3}
    row |= {"CPU/2s": f"{period / 2.0:.3%}", "CPU/0.1s": f"{period / 0.1:.2%}"}
    row |= {"hooks us/step @100": d["hooks_step100_wall_s"] * 1e6, "@100k": d["hooks_step100000_wall_s"] * 1e6}
    return row | {"exchange/step": f"{d['exchange_wall_s'] / (interval * step_s):.4%}"}


def run(args: argparse.Namespace) -> dict[str, Any]:
    from disttrain.config import HealthConfig

    args.dtype = H.dtype(args.dtype)
    ranks = H.ranks(args.nproc, __file__, [*args.argv, "--dtype", args.dtype])
    times = ranks[0]["times"]  # the ranks are in lockstep (DDP): rank 0's clock is the job's
    rows = [{"variant": n, "ms/step": H.median(ts) * 1e3, **H.ratio(ts, times["none"])} for n, ts in times.items()]
    H.table(rows, f"health monitoring cost, {args.nproc} ranks, {args.rounds} rounds x {args.steps_per_block} steps")
    step_s, interval = H.median(times["none"]), HealthConfig().straggler_interval
    direct = [direct_row(r, rank["direct"], step_s, interval) for r, rank in enumerate(ranks)]
    H.table(direct, "direct: a heartbeat period (set + verdict check [+ watchdog]), the hooks, the straggler exchange")
    goals = [GOAL.check(rows[2]["ratio"])]
    return {"rows": rows, "direct": direct, "goals": goals, "raw": [r["direct"] for r in ranks], "times": times}


if __name__ == "__main__":
    H.main(__file__, __doc__, OPTIONS, QUICK, run, worker)
