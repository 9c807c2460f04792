"""``disttrain ps``'s parent: the run folder (with the resolved ``config.toml`` the workers read), then trainers +
servers as one torchrun job on this node."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

from disttrain.checkpoint.commit import resume_hint
from disttrain.config import to_toml
from disttrain.errors import ConfigError
from disttrain.launch.frozen_watch import watch_frozen
from disttrain.launch.torchrun import run_torchrun, torchrun_argv
from disttrain.ps.config import PSJobConfig
from disttrain.ps.plan import render_plan


def ps_run_dir(cfg: PSJobConfig) -> Path:
    path = Path(cfg.run.root) / (cfg.run.name or time.strftime("%Y%m%d-%H%M%S") + "-ps")
    path.mkdir(parents=True, exist_ok=True)
    return path


def launch_ps(cfg: PSJobConfig, plan: bool = False) -> int:
    """The job; ``plan``: only print the rows and bytes each server would hold."""
    ps = cfg.ps
    if plan:
        print(render_plan(ps))
        return 0
    if ps.data_path is not None and not Path(ps.data_path).is_file():
        raise ConfigError(f"ps.data_path {ps.data_path} does not exist; give a Criteo-format .tsv file")
    nproc = ps_procs_per_node(cfg)
    run_dir = ps_run_dir(cfg)
    config = run_dir / "config.toml"
    config.write_text(to_toml(cfg))
    tables = f"{len(ps.tables)} tables ({sum(ps.tables):,} rows x {ps.dim})"
    print(
        f"disttrain ps: {ps.trainers} trainer(s) x {ps.servers} server(s), {ps.mode}, {tables}; run folder {run_dir}",
        flush=True,
    )
    argv = torchrun_argv(nproc, cfg.launch, log_dir=run_dir / "logs")
    os.environ.setdefault("TORCH_CPP_LOG_LEVEL", "ERROR")  # TensorPipe's warnings repeat what the trainers say

    def name(rank: int) -> str:
        return f"{ps.role(rank)} (rank {rank})"

    with watch_frozen(cfg.health, run_dir, cfg.launch.node_rank):
        code = run_torchrun([*argv, "-m", "disttrain.jobs.ps_worker", str(run_dir)], nproc, "cpu", name)
    if code == 1:  # the line above named the rank; how to go on (a trainer may have said it first)
        back = resume_hint(run_dir, "server")
        print(f"disttrain ps: the job stopped; {back}", file=sys.stderr, flush=True)
    return code


def ps_procs_per_node(cfg: PSJobConfig) -> int:
    """Trainers + servers spread evenly over ``launch.nnodes`` (ranks in order: trainers, then servers)."""
    total = cfg.ps.processes
    nodes = int(cfg.launch.nnodes.split(":")[-1])
    if ":" in cfg.launch.nnodes or total % nodes:
        who = "trainers, each with its server" if cfg.ps.colocated else f"trainers + {cfg.ps.servers} servers"
        raise ConfigError(
            f"disttrain ps runs {total} processes ({cfg.ps.trainers} {who}), which "
            f"launch.nnodes {cfg.launch.nnodes!r} must divide evenly (a fixed number of nodes: RPC groups are static)"
        )
    return total // nodes
