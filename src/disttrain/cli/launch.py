"""``disttrain launch -n N script.py``: a user's own script under torchrun."""

from __future__ import annotations

import argparse

from disttrain.config import LaunchConfig


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="disttrain launch", description="Run a script under torchrun semantics.")
    p.add_argument("-n", "--nproc", type=int, default=None, help="processes on this node (default: GPUs or 2)")
    p.add_argument("--nnodes", default="1")
    p.add_argument("--node-rank", type=int, default=0)
    p.add_argument("--rdzv-endpoint", default=None)
    p.add_argument("--max-restarts", type=int, default=0)
    p.add_argument("--slurm", action="store_true", help="write <script>.sbatch for --nnodes nodes and exit")
    p.add_argument("script")
    p.add_argument("args", nargs=argparse.REMAINDER)
    a = p.parse_args(argv)
    from disttrain.launch.torchrun import launch_script

    if a.slurm:
        from disttrain.launch.slurm import write_launch_sbatch

        return write_launch_sbatch(a.nproc, a.nnodes, a.script, a.args)
    launch = LaunchConfig(a.nnodes, a.node_rank, a.rdzv_endpoint, a.max_restarts)
    return launch_script(a.nproc, launch, a.script, a.args)
