"""The step-time plan against measured steps: does ``disttrain estimate`` rank strategies and FSDP groupings as
they really run, and how close are its times?

For each model (the default GPT, 6 x 384; a model of many small blocks, 24 x 128) and each rank count (2 and 4,
one thread per rank, gloo), the plan (:func:`disttrain.plan.estimate.plan_job` with this machine's cached
``disttrain doctor`` figures) predicts the step of DDP, FSDP, FSDP without reshard, and FSDP with one block per
unit and with one unit for the whole model. Then every variant trains in one launch per model and rank count (a
Trainer each, in one process group), one timed ``train_step`` of each per round, the order rotating every round,
so load drifting over the run hits all alike; the figure is the median over rounds of the slowest rank's step.
Goals: the predicted ranking equals the measured ranking, each predicted step within 25% of the measured one;
the many-small-blocks model at least 1.3x faster with the chosen grouping than with one unit per block.

    .venv/bin/python -m benchmarks.bench_plan_time [--rounds 3] [--nproc 2,4] [--models default,small-blocks]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import tempfile
from pathlib import Path
from typing import Any

import torch.distributed as dist

from benchmarks import _common as C
from disttrain.plan.timing import NEAR_BEST
from disttrain.testing.launch import finish_worker, is_worker, launch_and_collect, write_rank_result

MODELS = {
    "default": {"n_layers": 6, "d_model": 384, "n_heads": 6, "context": 256},
    "small-blocks": {"n_layers": 24, "d_model": 128, "n_heads": 4, "context": 128},
}


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rounds", type=int, default=3, help="timed steps of each variant (one per round)")
    p.add_argument("--nproc", default="2,4")
    p.add_argument("--models", default="default,small-blocks")
    p.add_argument("--micro-batch", type=int, default=8)
    p.add_argument("--dtype", default="auto", help="compute dtype (auto: what this host is fast in)")
    p.add_argument("--spec", default=None, help=argparse.SUPPRESS)  # set for the workers
    p.add_argument("--out", default=None, help=argparse.SUPPRESS)
    return p.parse_args(argv)


def job(model: str, nproc: int, args: argparse.Namespace) -> Any:
    from disttrain.config import from_dict

    return from_dict(
        {
            "model": MODELS[model],
            "train": {"micro_batch": args.micro_batch, "global_batch": args.micro_batch * nproc, "eval_interval": 0},
            "parallel": {"device": "cpu", "oversubscribe": True, "nproc": nproc},
            "precision": {"dtype": args.dtype},
            "metrics": {"peak_tflops": 1.0, "progress": "off"},
        }
    )


def variants(est: Any) -> dict[str, tuple[str, dict[str, Any], float]]:
    """name -> (plan column, parallel settings, predicted seconds per step)."""
    out: dict[str, tuple[str, dict[str, Any], float]] = {}
    for col in ("ddp", "fsdp", "fsdp_no_reshard"):
        t = est.times[col]
        tuned = (
            {"blocks_per_unit": t.blocks_per_unit, "forward_prefetch": 1, "backward_prefetch": 1}
            if col != "ddp"
            else {}
        )
        name = col if col == "ddp" else f"{col} ({t.blocks_per_unit}/unit, chosen)"
        out[name] = (col, tuned, t.predicted_s)
    tried = est.groupings["fsdp"]
    for k in (min(tried), max(tried)):
        if k != est.times["fsdp"].blocks_per_unit:
            out[f"fsdp ({k}/unit)"] = (
                "fsdp",
                {"blocks_per_unit": k, "forward_prefetch": 1, "backward_prefetch": 1},
                tried[k].predicted_s,
            )
    return out


def worker(args: argparse.Namespace) -> None:
    """One rank: a Trainer per variant in this process group, then rounds of one timed step of each (the order
    rotating), a barrier before every step; the slowest rank's time counts."""
    C.one_thread()
    from disttrain.build import build_data, build_model, vocab_size
    from disttrain.config import from_dict
    from disttrain.parallel.env import init_distributed
    from disttrain.parallel.strategies import SHARDED
    from disttrain.train.trainer import Trainer

    spec = json.loads(Path(args.spec).read_text())
    env = init_distributed("cpu", threads=1)
    trainers = {}
    for name, raw in spec["variants"].items():
        cfg = from_dict(raw)
        train, _, text = build_data(cfg)
        model = build_model(cfg, vocab_size(train, text), on_meta=cfg.parallel.strategy in SHARDED)
        trainers[name] = Trainer(model, train, cfg, env=env)

    def step(name: str) -> Any:
        return lambda n: [trainers[name].train_step() for _ in range(n)]

    times = C.interleave(
        {n: step(n) for n in trainers}, steps_per_block=1, rounds=args.rounds, warmup=1, before_block=dist.barrier
    )
    write_rank_result(args.out, env.rank, C.slowest_rank(times))
    finish_worker()


def run_group(model: str, nproc: int, args: argparse.Namespace) -> dict[str, Any]:
    from disttrain.config import to_dict
    from disttrain.plan.estimate import Layout, plan_job, resolve_device_memory, resolved_precision, with_parallel
    from disttrain.plan.timing import resolve_machine
    from disttrain.train.loss import cross_entropy

    cfg = resolved_precision(job(model, nproc, args), "cpu")
    machine = resolve_machine("cpu", cfg.precision.dtype, nproc=nproc)
    layout = Layout(nproc, 1, resolve_device_memory("auto", "cpu", nproc))
    est = plan_job(cfg, layout, cross_entropy, machine)
    vs = variants(est)
    strategy = {"ddp": "ddp", "fsdp": "fsdp", "fsdp_no_reshard": "fsdp"}
    configs = {}
    for name, (col, tuned, _) in vs.items():
        extra = {"reshard_after_forward": "never"} if col == "fsdp_no_reshard" else {}
        configs[name] = to_dict(with_parallel(cfg, strategy=strategy[col], **tuned, **extra))
    with tempfile.TemporaryDirectory(prefix="bench-plan-") as tmp:
        spec = Path(tmp) / "spec.json"
        spec.write_text(json.dumps({"variants": configs}))
        measured = launch_and_collect(
            nproc, Path(__file__), ["--rounds", str(args.rounds), "--spec", str(spec)], echo=True
        )[0]
    names = list(vs)
    rows = {n: {"predicted_s": vs[n][2], "measured_s": C.median(measured[n]), "runs": measured[n]} for n in names}
    pred_rank = sorted(names, key=lambda n: rows[n]["predicted_s"])
    meas_rank = sorted(names, key=lambda n: rows[n]["measured_s"])
    chosen = next(n for n in names if n.startswith("fsdp (") and "chosen" in n)
    one = next((n for n in names if n == "fsdp (1/unit)"), chosen)
    return {
        "model": model,
        "nproc": nproc,
        "machine": dataclasses.asdict(machine),
        "rows": rows,
        "predicted_ranking": pred_rank,
        "measured_ranking": meas_rank,
        "ranking_matches": pred_rank == meas_rank,
        "ranking_matches_beyond_ties": not misordered(rows, 0.0, NEAR_BEST),
        "misordered_pairs": misordered(rows, TIE),
        "max_error_pct": max(abs(r["predicted_s"] - r["measured_s"]) / r["measured_s"] * 100 for r in rows.values()),
        "grouping_speedup": rows[one]["measured_s"] / rows[chosen]["measured_s"],
        "recommendation": est.choice,
    }


TIE = 0.05  # measured steps this close are a tie: their order is the machine's noise, not the plan's


def misordered(rows: dict[str, dict[str, Any]], tie: float, predicted_tie: float = 0.0) -> list[str]:
    """Pairs of variants whose measured steps differ by more than ``tie`` (relative) and that the plan orders the
    other way round by more than ``predicted_tie`` (the plan's own tie: two variants it puts within
    :data:`NEAR_BEST` of each other are equal to it, as to ``best_grouping``; some are the same configuration)."""
    out = []
    names = sorted(rows, key=lambda n: rows[n]["measured_s"])
    for i, fast in enumerate(names):
        for slow in names[i + 1 :]:
            apart = rows[slow]["measured_s"] > (1 + tie) * rows[fast]["measured_s"]
            if apart and (1 + predicted_tie) * rows[slow]["predicted_s"] < rows[fast]["predicted_s"]:
                out.append(f"{fast} < {slow}")
    return out


def print_group(g: dict[str, Any]) -> None:
    print(f"\n{g['model']} x {g['nproc']} ranks (auto recommends {g['recommendation']})")
    print(f"{'variant':<34}{'predicted':>11}{'measured':>11}{'error':>8}")
    for n, r in sorted(g["rows"].items(), key=lambda kv: kv[1]["measured_s"]):
        err = (r["predicted_s"] - r["measured_s"]) / r["measured_s"] * 100
        print(f"{n:<34}{r['predicted_s'] * 1e3:>9.0f}ms{r['measured_s'] * 1e3:>9.0f}ms{err:>7.1f}%")
    print(f"ranking matches: {g['ranking_matches']}  (predicted {' < '.join(g['predicted_ranking'])})")
    print(f"ranking matches where the plan sees no tie (<= {NEAR_BEST:.0%} apart): {g['ranking_matches_beyond_ties']}")
    pairs = g["misordered_pairs"]
    print(f"pairs more than {TIE:.0%} apart that the plan orders the other way: {', '.join(pairs) or 'none'}")
    print(
        f"max error {g['max_error_pct']:.1f}% (goal <= 25%); chosen grouping vs one block per unit: "
        f"{g['grouping_speedup']:.2f}x"
    )


def main(argv: list[str]) -> None:
    args = parse_args(argv)
    if is_worker():
        worker(args)
        return
    C.print_machine()
    groups = []
    for model in args.models.split(","):
        for nproc in (int(n) for n in args.nproc.split(",")):
            g = run_group(model, nproc, args)
            print_group(g)
            groups.append(g)
    C.write_results("bench_plan_time", {"args": vars(args), "groups": groups})


if __name__ == "__main__":
    main(sys.argv[1:])
