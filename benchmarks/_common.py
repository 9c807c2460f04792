"""Shared helpers for the benchmarks: side-by-side timing, tables and JSON results with the machine they ran on
(launching ranks and collecting their results: :mod:`disttrain.testing.launch`).

This machine is shared and noisy, so every comparison is a ratio of variants measured in the same
process, interleaved block by block (the order rotates every round, so a slow drift in load hits every
variant alike), with medians over rounds. ``paired`` ratios divide the two variants' times of
the *same* round before taking the median; they are the figures the benchmarks report.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import statistics
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch

from disttrain.utils.host import cpu_name

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results"


# -- where we are -------------------------------------------------------------------------------------
def machine() -> dict[str, Any]:
    flags = ""
    try:
        flags = Path("/proc/cpuinfo").read_text()
    except OSError:
        pass
    return {
        "date": datetime.date.today().isoformat(),
        "cpu": cpu_name(),
        "cores": os.cpu_count(),
        "amx": "amx_bf16" in flags,
        "torch": torch.__version__,
        "python": platform.python_version(),
        "load_avg_1m": os.getloadavg()[0] if hasattr(os, "getloadavg") else None,
    }


def one_thread() -> None:
    """One intra-op thread per process (per rank), as the benchmarks compare per-core figures."""
    os.environ["OMP_NUM_THREADS"] = "1"
    torch.set_num_threads(1)


def print_machine() -> None:
    """One line: date, CPU, cores, torch and the load average now."""
    m = machine()
    print(f"{m['date']}: {m['cpu']}, {m['cores']} cores, torch {m['torch']}, load average {m['load_avg_1m']:.2f}")


# -- options and jobs ---------------------------------------------------------------------------------
def add_gpt_args(
    p: argparse.ArgumentParser, *, layers: int, width: int, heads: int, context: int, micro_batch: int
) -> None:
    """``--layers --width --heads --context --micro-batch``: the shape of a benchmark's GPT and its micro-batch."""
    p.add_argument("--layers", type=int, default=layers)
    p.add_argument("--width", type=int, default=width)
    p.add_argument("--heads", type=int, default=heads)
    p.add_argument("--context", type=int, default=context)
    p.add_argument("--micro-batch", type=int, default=micro_batch)


def gpt_shape(args: argparse.Namespace) -> dict[str, int]:
    """The ``model`` section of a job config from the options of ``add_gpt_args``."""
    return {"n_layers": args.layers, "d_model": args.width, "n_heads": args.heads, "context": args.context}


def fit_for(trainer: Any, n: int) -> Any:
    """``trainer.fit()`` for ``n`` more steps (one block): ``fit()`` runs until step ``train.steps``."""
    trainer.cfg.train.steps = trainer.step + n
    return trainer.fit()


# -- timing -------------------------------------------------------------------------------------------
def interleave(
    variants: dict[str, Callable[[int], Any]],
    *,
    steps_per_block: int,
    rounds: int,
    warmup: int,
    before_block: Callable[[], None] | None = None,
    between_rounds: Callable[[int], None] | None = None,
) -> dict[str, list[float]]:
    """Run each variant's ``run(n)`` for ``warmup`` steps, then ``rounds`` rounds of one block each.

    Returns seconds per step for every (variant, round). Round r runs the variants rotated by r
    (A B C, B C A, C A B, ...): each variant takes every position equally often, and with three or more
    variants none runs twice in a row across a round boundary (a variant that does runs its second block
    on warm caches, a few % faster). With two it is A B, B A: both get that equally.
    ``before_block`` runs untimed before every block (a barrier, say).
    """
    names = list(variants)
    for name in names:
        if warmup:
            variants[name](warmup)
    times: dict[str, list[float]] = {n: [] for n in names}
    for r in range(rounds):
        k = r % len(names)
        for name in names[k:] + names[:k]:
            if before_block is not None:
                before_block()
            t0 = time.perf_counter()
            variants[name](steps_per_block)
            times[name].append((time.perf_counter() - t0) / steps_per_block)
        if between_rounds is not None:
            between_rounds(r)
    return times


def slowest_rank(times: dict[str, list[float]]) -> dict[str, list[float]]:
    """Per variant and block, the slowest rank's time (it sets the pace); a collective: every rank calls it."""
    import torch.distributed as dist

    gathered: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, times)
    return {k: [max(g[k][i] for g in gathered) for i in range(len(times[k]))] for k in times}


def slowest_per_round(per_rank: list[dict[str, list[float]]]) -> dict[str, list[float]]:
    """From each rank's ``{variant: [time of each round]}``, per variant and round the slowest rank's time."""
    return {n: [max(r[n][i] for r in per_rank) for i in range(len(per_rank[0][n]))] for n in per_rank[0]}


def median(xs: Sequence[float]) -> float:
    return float(statistics.median(xs))


def paired_ratio(num: Sequence[float], den: Sequence[float]) -> float:
    """Median over rounds of num[r] / den[r] (e.g. t_plain / t_disttrain = throughput ratio)."""
    return median([a / b for a, b in zip(num, den, strict=True)])


def spread(xs: Sequence[float]) -> tuple[float, float]:
    """(lower, upper) quartiles: how much the rounds disagree."""
    if len(xs) < 4:
        return min(xs), max(xs)
    q = statistics.quantiles(xs, n=4)
    return q[0], q[2]


# -- output -------------------------------------------------------------------------------------------
def table(headers: list[str], rows: list[list[Any]], title: str | None = None) -> str:
    """A plain-text table (right-aligned numbers), returned and printed."""
    cells = [[_fmt(c) for c in row] for row in rows]
    widths = [max(len(h), *(len(r[i]) for r in cells)) if cells else len(h) for i, h in enumerate(headers)]
    lines = []
    if title:
        lines.append(title)
    lines.append("  ".join(h.ljust(w) for h, w in zip(headers, widths, strict=True)))
    lines.append("  ".join("-" * w for w in widths))
    for row in cells:
        lines.append(
            "  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(row, widths, strict=True)))
        )
    text = "\n".join(lines)
    print(text, flush=True)
    return text


def _fmt(v: Any) -> str:
    if isinstance(v, float):
        return f"{v:.3f}" if abs(v) < 100 else f"{v:,.0f}"
    return str(v)


def write_results(name: str, data: dict[str, Any]) -> Path:
    """Write ``benchmarks/results/NAME.json`` (with the machine description) and return its path."""
    RESULTS.mkdir(parents=True, exist_ok=True)
    path = RESULTS / f"{name}.json"
    path.write_text(json.dumps({"benchmark": name, "machine": machine(), **data}, indent=2) + "\n")
    print(f"results: {path.relative_to(ROOT)}", flush=True)
    return path


def verdict(value: float, goal: float, higher_is_better: bool = True) -> str:
    ok = value >= goal if higher_is_better else value <= goal
    return "met" if ok else "MISSED"
