"""``disttrain ps`` throughput and traffic: samples/s for BSP / SSP / ASP and 1-4 trainers x 1-2 servers, ASP's pushes
combined or one by one, and the bytes a trainer moves per step against shipping its whole tables (goal <= 1% at
1M rows). Each job a fresh ``disttrain ps``; figures from its summary.json.

    .venv/bin/python -m benchmarks.bench_ps [--steps 60] [--jobs 2x2-bsp 1M-rows ...]
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path
from typing import Any

from benchmarks import harness as H

GOAL = H.Goal("bytes moved per step, sparse / whole tables", 0.01, higher_is_better=False)
JOBS = {
    **{f"2x2-{mode}": f"--ps.mode {mode}" for mode in ("bsp", "ssp", "asp")},
    **{f"{t}x{s}-bsp": f"--ps.trainers {t} --ps.servers {s}" for t, s in ((1, 1), (1, 2), (2, 1), (4, 1), (4, 2))},
    "4x2-asp-combined": "--ps.trainers 4 --ps.servers 2 --ps.mode asp",
    "4x2-asp-one-by-one": "--ps.trainers 4 --ps.servers 2 --ps.mode asp --ps.no-combine-pushes",
    "1M-rows": "--ps.tables 1000000 --ps.dim 16 --train.batch 256",
}
OPTIONS = {"steps": (60, "steps per job"), "jobs": (list(JOBS), "which jobs (trainers x servers - mode)")}
QUICK = {"steps": 5, "jobs": ["2x2-bsp", "1M-rows"]}


def per_update(summary: dict[str, Any]) -> str:
    """ssp / asp: how many pushes server 0 applied per update (above 1: combined)."""
    stats = summary.get("server0_pushes") or {}
    return f"{stats['pushes'] / stats['updates']:.2f}" if stats.get("updates") else ""


def run(args: argparse.Namespace) -> dict[str, Any]:
    common = f"--train.steps {args.steps} --train.eval-interval 0 --train.eval-samples 2000".split()
    runs: dict[str, dict[str, Any]] = {}
    with tempfile.TemporaryDirectory(prefix="disttrain-ps-") as tmp:
        for name in args.jobs:
            H.disttrain("ps", *common, *JOBS[name].split(), root=Path(tmp), name=name)
            runs[name] = json.loads((Path(tmp) / name / "summary.json").read_text())
    rows = [
        {"job (trainers x servers, mode)": k, "samples/s": r["samples_per_s"], "AUC": r["final"]["auc"]}
        | {"KiB moved / step / trainer": r["bytes_per_step"] / 2**10, "pushes / update": per_update(r)}
        for k, r in runs.items()
    ]
    H.table(rows, f"disttrain ps, {args.steps} steps of 256 samples per trainer (default tables unless said)")
    if "1M-rows" not in runs:
        return {"rows": rows, "runs": runs}
    big = runs["1M-rows"]["config"]["ps"]
    dense = 2 * sum(big["tables"]) * big["dim"] * 4  # pull the whole table, push a whole gradient
    print(f"1,000,000 rows x 16, batch 256: {runs['1M-rows']['bytes_per_step']:,} bytes per step, {dense:,} dense")
    return {"rows": rows, "goals": [GOAL.check(runs["1M-rows"]["bytes_per_step"] / dense)], "runs": runs}


if __name__ == "__main__":
    H.main(__file__, __doc__, OPTIONS, QUICK, run)
