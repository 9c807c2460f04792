"""``disttrain ps``'s parent: the run folder, then trainers + servers as one torchrun job on this node."""

from __future__ import annotations

import dataclasses
import json
import os
import sys
import time
from pathlib import Path

from disttrain.checkpoint.commit import resume_hint
from disttrain.errors import ConfigError
from disttrain.launch.torchrun import run_torchrun, torchrun_argv
from disttrain.ps.config import PSConfig
from disttrain.ps.plan import render_plan


def ps_run_dir(cfg: PSConfig) -> Path:
    path = Path(cfg.run_root) / (cfg.run_name or time.strftime("%Y%m%d-%H%M%S") + "-ps")
    path.mkdir(parents=True, exist_ok=True)
    return path


def launch_ps(cfg: PSConfig) -> int:
    if cfg.plan:
        print(render_plan(cfg))
        return 0
    if cfg.data_path is not None and not Path(cfg.data_path).is_file():
        raise ConfigError(f"ps.data_path {cfg.data_path} does not exist; give a Criteo-format .tsv file")
    run_dir = ps_run_dir(cfg)
    config = run_dir / "config.json"
    config.write_text(json.dumps(dataclasses.asdict(cfg), indent=2) + "\n")
    nproc = ps_procs_per_node(cfg)
    tables = f"{len(cfg.tables)} tables ({sum(cfg.tables):,} rows x {cfg.dim})"
    print(
        f"disttrain ps: {cfg.trainers} trainer(s) x {cfg.servers} server(s), {cfg.mode}, {tables}; "
        f"run folder {run_dir}",
        flush=True,
    )
    argv = torchrun_argv(nproc, cfg.launch, log_dir=run_dir / "logs")
    os.environ.setdefault("TORCH_CPP_LOG_LEVEL", "ERROR")  # TensorPipe's warnings repeat what the trainers say

    def name(rank: int) -> str:
        return f"trainer{rank} (rank {rank})" if rank < cfg.trainers else f"server{rank - cfg.trainers} (rank {rank})"

    code = run_torchrun([*argv, "-m", "disttrain.jobs.ps_worker", str(config), str(run_dir)], nproc, "cpu", name)
    if code == 1:  # the line above named the rank; how to go on (a trainer may have said it first)
        back = resume_hint(run_dir, "server")
        print(f"disttrain ps: the job stopped; {back}", file=sys.stderr, flush=True)
    return code


def ps_procs_per_node(cfg: PSConfig) -> int:
    """Trainers + servers spread evenly over ``launch.nnodes`` (ranks in order: trainers, then servers)."""
    total = cfg.trainers + cfg.servers
    nodes = int(cfg.launch.nnodes.split(":")[-1])
    if ":" in cfg.launch.nnodes or total % nodes:
        raise ConfigError(
            f"disttrain ps runs {total} processes ({cfg.trainers} trainers + {cfg.servers} servers), which "
            f"launch.nnodes {cfg.launch.nnodes!r} must divide evenly (a fixed number of nodes: RPC groups are static)"
        )
    return total // nodes
