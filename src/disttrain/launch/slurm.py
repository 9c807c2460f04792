"""Slurm: an sbatch script that starts one disttrain launcher (a torchrun agent) per node with ``srun``, the
c10d rendezvous on the job's first node. No scheduler of our own: Slurm places the nodes, torchrun starts
the ranks, the script only says who the first node is and which node each launcher runs on."""

from __future__ import annotations

import dataclasses
import os
import shlex
import subprocess
import sys
import time
from pathlib import Path

from disttrain.config import JobConfig, to_toml
from disttrain.errors import ConfigError

RDZV_PORT = 29400


def sbatch_script(
    command: list[str], nodes: int, *, job_name: str, log_dir: Path, gpus_per_node: int = 0, cpus_per_node: int = 0
) -> str:
    """The script for ``command`` (a disttrain command line without node options) on ``nodes`` nodes; each
    node's launcher gets ``--launch.nnodes``, ``--launch.node-rank`` and ``--launch.rdzv-endpoint`` (run) or
    ``--nnodes``, ``--node-rank`` and ``--rdzv-endpoint`` (launch)."""
    is_launch = command[1:2] == ["launch"]
    names = (
        ("--nnodes", "--node-rank", "--rdzv-endpoint")
        if is_launch
        else ("--launch.nnodes", "--launch.node-rank", "--launch.rdzv-endpoint")
    )
    node_args = (
        f'{names[0]} "$SLURM_NNODES" {names[1]} "$SLURM_NODEID" '
        f'{names[2]} "$DISTTRAIN_HEAD:${{DISTTRAIN_RDZV_PORT:-{RDZV_PORT}}}"'
    )
    if is_launch:  # torchrun-style options go before the script
        head, tail = command[:2], command[2:]
        per_node = f"{shlex.join(head)} {node_args} {shlex.join(tail)}"
    else:
        per_node = f"{shlex.join(command)} {node_args}"
    lines = [
        "#!/bin/bash",
        f"#SBATCH --job-name={job_name}",
        f"#SBATCH --nodes={nodes}",
        "#SBATCH --ntasks-per-node=1",
        "# 90 s before the time limit every process gets SIGUSR1: the ranks finish their step, save a checkpoint",
        "# and the job requeues itself (scontrol requeue); the requeued job resumes from that checkpoint",
        "#SBATCH --signal=USR1@90",
        "#SBATCH --requeue",
        "#SBATCH --open-mode=append",
        f"#SBATCH --output={log_dir}/slurm-%j.out",
    ]
    if gpus_per_node:
        lines.append(f"#SBATCH --gpus-per-node={gpus_per_node}")
    if cpus_per_node:
        lines.append(f"#SBATCH --cpus-per-task={cpus_per_node}")
    lines += [
        "set -euo pipefail",
        "# the first node of the allocation hosts the rendezvous (its launcher is node rank 0)",
        'DISTTRAIN_HEAD=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)',
        'export DISTTRAIN_HEAD DISTTRAIN_RDZV_ID="slurm-$SLURM_JOB_ID"',
        "# one launcher per node; --kill-on-bad-exit: one failing node ends the step instead of hanging it",
        f"srun --kill-on-bad-exit=1 bash -c {shlex.quote('exec ' + per_node)}",
        "",
    ]
    return "\n".join(lines)


def requeue() -> str:
    """After a SIGUSR1 stop (the ranks saved a checkpoint): put this Slurm job back in the queue; it runs
    the same script again, which resumes from that checkpoint. What was done, as a clause of one line."""
    job = os.environ.get("SLURM_JOB_ID")
    if not job:
        return "not a Slurm job (no SLURM_JOB_ID): run it again to resume"
    try:
        done = subprocess.run(["scontrol", "requeue", job], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired) as e:
        return f"could not requeue Slurm job {job} ({e}): resubmit it to resume"
    if done.returncode != 0:
        why = (done.stderr or done.stdout).strip().splitlines()[-1:] or [f"exit code {done.returncode}"]
        return f"scontrol requeue {job} failed ({why[0]}): resubmit it to resume"
    return f"requeued Slurm job {job} (scontrol requeue): it resumes from there"


def write_sbatch(path: Path, script: str) -> str:
    """Write the script; the line that tells the user how to submit it."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(script)
    path.chmod(0o755)
    return f"wrote {path}; submit it with: sbatch {path}"


def disttrain_exe() -> str:
    """This installation's ``disttrain`` (a shared file system: the same path on every node)."""
    return str(Path(sys.executable).parent / "disttrain")


def nodes_of(nnodes: str) -> int:
    if ":" in nnodes:
        raise ConfigError(f"--slurm needs a fixed number of nodes (launch.nnodes), got the range {nnodes!r}")
    return int(nnodes)


def write_run_sbatch(cfg: JobConfig) -> int:
    """``disttrain run --slurm``: the job's config as TOML beside an sbatch script that runs it on
    ``launch.nnodes`` nodes, in one named run folder (a requeued job resumes there)."""
    nodes = nodes_of(cfg.launch.nnodes)
    name = cfg.run.name or time.strftime("%Y%m%d-%H%M%S") + "-slurm"
    cfg = dataclasses.replace(cfg, run=dataclasses.replace(cfg.run, name=name))
    root = Path(cfg.run.root).resolve()
    toml = root / f"{name}.toml"
    root.mkdir(parents=True, exist_ok=True)
    toml.write_text(to_toml(cfg))
    gpus = (cfg.parallel.nproc or 0) if cfg.parallel.device == "cuda" else 0
    script = sbatch_script(
        [disttrain_exe(), "run", "--config", str(toml)], nodes, job_name=name, log_dir=root, gpus_per_node=gpus
    )
    print(write_sbatch(root / f"{name}.sbatch", script))
    return 0


def write_launch_sbatch(nproc: int | None, nnodes: str, script: str, args: list[str]) -> int:
    """``disttrain launch --slurm -n N --nnodes M script.py ...``: ``<script>.sbatch`` beside the script."""
    if not Path(script).is_file():
        raise ConfigError(f"script {script!r} does not exist")
    command = [disttrain_exe(), "launch", *(["-n", str(nproc)] if nproc else []), str(Path(script).resolve()), *args]
    out = Path(script).resolve().with_suffix(".sbatch")
    print(write_sbatch(out, sbatch_script(command, nodes_of(nnodes), job_name=Path(script).stem, log_dir=out.parent)))
    return 0
