"""The step-time plan against measured steps: does ``disttrain estimate`` rank strategies and FSDP groupings as
they really run, and how close are its times? For each model (the default GPT; 24 x 128) and rank count, the plan
(with this machine's cached ``disttrain doctor`` figures) predicts the step of DDP, FSDP (its chosen grouping, one
block per unit, one unit) and FSDP without reshard; every variant then trains in one launch, one timed step each
per round. Goals: each predicted step within 25%; the small-blocks model >= 1.3x faster with the chosen grouping
than with one block per unit.
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path
from typing import Any

import torch.distributed as dist

from benchmarks import harness as H
from disttrain.plan.timing import NEAR_BEST

MODELS = {"default": H.gpt(6, 384, 6, 256), "small-blocks": H.gpt(24, 128, 4, 128)}
TIE = 0.05  # measured steps this close are a tie: their order is the machine's noise, not the plan's
GOALS = {
    "error": H.Goal("largest error of a predicted step", 0.25, higher_is_better=False),
    "grouping": H.Goal("small blocks: chosen grouping / 1 block per unit", 1.3),
}
OPTIONS = {
    **H.options(rounds=3, micro_batch=8),  # rounds: one timed step of each variant each
    "nproc": ("2,4", "rank counts, comma-separated"),
    "models": ("default,small-blocks", "models, comma-separated"),
    "dtype": ("auto", "compute dtype (auto: what this host is fast in)"),
    "spec": (None, None),  # the workers' variants (a JSON file)
}
QUICK = {"rounds": 1, "nproc": "2", "models": "small-blocks", "micro_batch": 2}


def variants(est: Any) -> dict[str, tuple[str, dict[str, Any], float]]:
    """name -> (plan column, parallel settings, predicted seconds per step)."""

    def grouping(k: int) -> dict[str, Any]:
        return {"blocks_per_unit": k, "forward_prefetch": 1, "backward_prefetch": 1}

    out: dict[str, tuple[str, dict[str, Any], float]] = {"ddp": ("ddp", {}, est.times["ddp"].predicted_s)}
    for col in ("fsdp", "fsdp_no_reshard"):
        t = est.times[col]
        out[f"{col} ({t.blocks_per_unit}/unit, chosen)"] = (col, grouping(t.blocks_per_unit), t.predicted_s)
    tried = est.groupings["fsdp"]
    for k in {min(tried), max(tried)} - {est.times["fsdp"].blocks_per_unit}:
        out[f"fsdp ({k}/unit)"] = ("fsdp", grouping(k), tried[k].predicted_s)
    return out


def worker(args: argparse.Namespace) -> dict[str, Any]:
    """A Trainer per variant, then rounds of one timed step of each, a barrier before every step."""
    from disttrain.config import from_dict

    env = H.init_ranks()
    trainers = {}
    for name, raw in json.loads(Path(args.spec).read_text())["variants"].items():
        cfg = from_dict(raw)
        trainers[name] = H.trainer(cfg, H.text(cfg.model.context), env)

    steps = {n: H.train_steps(t) for n, t in trainers.items()}
    times = H.interleave(steps, steps_per_block=1, rounds=args.rounds, warmup=1, before_block=dist.barrier)
    return H.slowest_rank(times)


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


def run_group(model: str, nproc: int, args: argparse.Namespace) -> dict[str, Any]:
    from disttrain.config import to_dict
    from disttrain.plan.estimate import Layout, plan_job, resolve_device_memory, resolved_precision, with_parallel
    from disttrain.plan.timing import resolve_machine
    from disttrain.train.loss import cross_entropy

    sections: dict[str, Any] = {"parallel": {"oversubscribe": True, "nproc": nproc}, "precision": {"dtype": args.dtype}}
    cfg = resolved_precision(H.job(MODELS[model], world=nproc, micro_batch=args.micro_batch, **sections), "cpu")
    machine = resolve_machine("cpu", cfg.precision.dtype, nproc=nproc)
    est = plan_job(cfg, Layout(nproc, 1, resolve_device_memory("auto", "cpu", nproc)), cross_entropy, machine)
    vs = variants(est)
    strategy = {"ddp": "ddp", "fsdp": "fsdp", "fsdp_no_reshard": "fsdp"}
    configs = {}
    for name, (col, tuned, _) in vs.items():
        extra = {"reshard_after_forward": "never"} if col == "fsdp_no_reshard" else {}
        configs[name] = to_dict(with_parallel(cfg, strategy=strategy[col], **tuned, **extra))
    with tempfile.TemporaryDirectory(prefix="bench-plan-") as tmp:
        spec = Path(tmp) / "spec.json"
        spec.write_text(json.dumps({"variants": configs}))
        measured = H.ranks(nproc, __file__, ["--rounds", str(args.rounds), "--spec", str(spec)])[0]
    rows = {n: {"predicted_s": vs[n][2], "measured_s": H.median(measured[n]), "runs": measured[n]} for n in vs}
    chosen = next(n for n in vs if n.startswith("fsdp (") and "chosen" in n)
    one = next((n for n in vs if n == "fsdp (1/unit)"), chosen)
    return {
        "model": model,
        "nproc": nproc,
        "rows": rows,
        "predicted_ranking": sorted(vs, key=lambda n: rows[n]["predicted_s"]),
        "measured_ranking": sorted(vs, key=lambda n: rows[n]["measured_s"]),
        "ranking_matches_beyond_ties": not misordered(rows, 0.0, NEAR_BEST),
        "misordered_pairs": misordered(rows, TIE),
        "max_error": max(abs(r["predicted_s"] - r["measured_s"]) / r["measured_s"] for r in rows.values()),
        "grouping_speedup": rows[one]["measured_s"] / rows[chosen]["measured_s"],
        "recommendation": est.choice,
    }


def print_group(g: dict[str, Any]) -> None:
    table = [
        {"variant": n, "predicted ms": r["predicted_s"] * 1e3, "measured ms": r["measured_s"] * 1e3}
        | {"error": f"{(r['predicted_s'] - r['measured_s']) / r['measured_s']:+.1%}"}
        for n, r in sorted(g["rows"].items(), key=lambda kv: kv[1]["measured_s"])
    ]
    H.table(table, f"\n{g['model']} x {g['nproc']} ranks (auto recommends {g['recommendation']})")
    ranking = g["predicted_ranking"]
    print(f"ranking matches: {ranking == g['measured_ranking']} (predicted {' < '.join(ranking)})")
    print(f"ranking matches beyond the plan's ties (<= {NEAR_BEST:.0%} apart): {g['ranking_matches_beyond_ties']}")
    print(f"pairs > {TIE:.0%} apart that the plan orders the other way: {', '.join(g['misordered_pairs']) or 'none'}")
    print(f"chosen grouping vs one block per unit: {g['grouping_speedup']:.2f}x")


def run(args: argparse.Namespace) -> dict[str, Any]:
    groups, goals = [], []
    for model in args.models.split(","):
        for nproc in (int(n) for n in args.nproc.split(",")):
            groups.append(g := run_group(model, nproc, args))
            print_group(g)
            goals.append(GOALS["error"].check(g["max_error"]))
            if model == "small-blocks":
                goals.append(GOALS["grouping"].check(g["grouping_speedup"]))
    return {"groups": groups, "goals": goals}


if __name__ == "__main__":
    H.main(__file__, __doc__, OPTIONS, QUICK, run, worker)
