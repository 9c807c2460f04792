"""``disttrain ps`` throughput and traffic: samples/s for BSP / SSP / ASP at 2 trainers x 2 servers, for 1, 2, 4
trainers x 1, 2 servers under BSP, for 4 trainers under ASP with pushes combined server-side or applied one
by one (``--ps.no-combine-pushes``), and the bytes a trainer moves per step (sparse pulls and pushes of the
distinct rows a batch needs) against shipping its whole tables both ways (goal <= 1% at 1M rows).

Each configuration is a fresh `disttrain ps` job (trainers and servers share this machine's cores, so more
processes is not more compute here); figures come from each job's summary.json.

    .venv/bin/python -m benchmarks.bench_ps [--steps 60]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from benchmarks import _common as C

BYTES_GOAL = 0.01


def run_ps(tmp: Path, name: str, args: list[str]) -> dict[str, Any]:
    exe = Path(sys.executable).parent / "disttrain"
    cmd = [str(exe), "ps", *args, "--run.root", str(tmp), "--run.name", name]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
    if proc.returncode != 0:
        raise RuntimeError(f"{name} failed: {proc.stderr[-2000:]}")
    return json.loads((tmp / name / "summary.json").read_text())


def _per_update(summary: dict[str, Any]) -> str:
    """ssp / asp: how many pushes server 0 applied per update (above 1: combined)."""
    stats = summary.get("server0_pushes") or {}
    return f"{stats['pushes'] / stats['updates']:.2f}" if stats.get("updates") else ""


def main(argv: list[str]) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--steps", type=int, default=60)
    args = p.parse_args(argv)
    common = ["--train.steps", str(args.steps), "--train.eval-interval", "0", "--train.eval-samples", "2000"]
    runs: dict[str, dict[str, Any]] = {}
    with tempfile.TemporaryDirectory(prefix="disttrain-ps-") as tmp:
        for mode in ("bsp", "ssp", "asp"):
            runs[f"2x2 {mode}"] = run_ps(Path(tmp), mode, [*common, "--ps.mode", mode])
        for t, s in ((1, 1), (1, 2), (2, 1), (4, 1), (4, 2)):
            runs[f"{t}x{s} bsp"] = run_ps(
                Path(tmp), f"t{t}s{s}", [*common, "--ps.trainers", str(t), "--ps.servers", str(s)]
            )
        four = [*common, "--ps.trainers", "4", "--ps.servers", "2", "--ps.mode", "asp"]
        runs["4x2 asp combined"] = run_ps(Path(tmp), "asp4c", four)
        runs["4x2 asp one by one"] = run_ps(Path(tmp), "asp4", [*four, "--ps.no-combine-pushes"])
        big = ["--ps.tables", "1000000", "--ps.dim", "16", "--train.batch", "256"]
        runs["1M rows"] = run_ps(Path(tmp), "big", [*common, *big])
    rows = [
        [k, r["samples_per_s"], r["final"]["auc"], r["bytes_per_step"] / 2**10, _per_update(r)] for k, r in runs.items()
    ]
    title = f"disttrain ps, {args.steps} steps of 256 samples per trainer (default tables unless said)"
    head = ["job (trainers x servers, mode)", "samples/s", "AUC", "KiB moved / step / trainer", "pushes / update"]
    C.table(head, rows, title=title)
    big_cfg = runs["1M rows"]["config"]["ps"]
    dense = 2 * sum(big_cfg["tables"]) * big_cfg["dim"] * 4  # pull the whole table, push a whole gradient
    ratio = runs["1M rows"]["bytes_per_step"] / dense
    C.table(
        ["traffic per trainer per step", "bytes", "ratio", "goal", ""],
        [
            [
                "sparse (distinct rows only)",
                runs["1M rows"]["bytes_per_step"],
                ratio,
                f"<= {BYTES_GOAL}",
                C.verdict(ratio, BYTES_GOAL, higher_is_better=False),
            ],
            ["dense tables both ways", dense, 1.0, "", ""],
        ],
        title="1,000,000 rows x 16, batch 256",
    )
    C.write_results("bench_ps", {"runs": runs, "bytes_ratio": ratio})


if __name__ == "__main__":
    main(sys.argv[1:])
