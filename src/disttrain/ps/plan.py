"""``disttrain ps --plan``: rows and bytes per server (weights + optimizer state) and whether they fit."""

from __future__ import annotations

import psutil

from disttrain.ps.config import PSConfig
from disttrain.ps.sharding import RowSharding
from disttrain.utils.fmt import fmt_bytes


def server_bytes(cfg: PSConfig) -> list[tuple[int, int]]:
    """(rows, bytes) each server holds: fp32 rows, and as much again for Adagrad's per-element sums."""
    per_row = cfg.dim * 4 * (2 if cfg.optimizer == "adagrad" else 1)
    out = []
    for s in range(cfg.servers):
        rows = sum(RowSharding(r, cfg.servers, cfg.sharding).shard_rows(s) for r in cfg.tables)
        out.append((rows, rows * per_row))
    return out


def render_plan(cfg: PSConfig, host_bytes: int | None = None) -> str:
    host = host_bytes if host_bytes is not None else psutil.virtual_memory().available
    shards = server_bytes(cfg)
    total = sum(b for _, b in shards)
    lines = [
        f"{len(cfg.tables)} tables, {sum(cfg.tables):,} rows x {cfg.dim} (fp32, {cfg.optimizer}): "
        f"{fmt_bytes(total)} in all, over {cfg.servers} server(s)"
    ]
    lines += [f"  server{s}: {rows:,} rows, {fmt_bytes(b)}" for s, (rows, b) in enumerate(shards)]
    fits = total <= 0.8 * host
    verdict = "fits" if fits else "does NOT fit: add servers (on more hosts) or shrink the tables"
    lines.append(f"this host has {fmt_bytes(host)} available; all servers on it: {verdict}")
    return "\n".join(lines)
