"""``disttrain launch -n N script.py`` (or ``-m pkg.mod``): a user's own script or module under torchrun."""

from __future__ import annotations

import argparse

from disttrain.config import K8sConfig, LaunchConfig


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="disttrain launch", description="Run a script under torchrun semantics.")
    p.add_argument("-n", "--nproc", type=int, default=None, help="processes on this node (default: GPUs or 2)")
    p.add_argument("--nnodes", default="1")
    p.add_argument("--node-rank", type=int, default=0)
    p.add_argument("--rdzv-endpoint", default=None)
    p.add_argument("--max-restarts", type=int, default=0)
    p.add_argument("--slurm", action="store_true", help="write <script>.sbatch for --nnodes nodes and exit")
    k8s = p.add_argument_group("Kubernetes (docs/multi-node.md#kubernetes)")
    k8s.add_argument(
        "--k8s", choices=("pytorchjob", "jobset"), help="write <script>.KIND.yaml, one pod per node, and exit"
    )
    for field in ("image", "namespace", "volume", "gpus-per-node", "cpus-per-node", "queue", "shm-size"):
        k8s.add_argument(f"--k8s.{field}", dest=f"k8s_{field.replace('-', '_')}", help=f"k8s.{field} (run's)")
    p.add_argument(
        "-m",
        "--module",
        action="store_true",
        help="SCRIPT is a module, run as `python -m` runs it (torchrun's -m); on CPU one whose source defines "
        "entry(argv) -> exit code has its ranks forked from the launcher (no fresh imports)",
    )
    p.add_argument("script")
    p.add_argument("args", nargs=argparse.REMAINDER)
    a = p.parse_args(argv)
    from disttrain.launch.torchrun import launch_script

    if a.module and (a.slurm or a.k8s):
        from disttrain.errors import ConfigError

        raise ConfigError("--module is for a launch on this machine; give --slurm / --k8s a script path instead")

    if a.slurm:
        from disttrain.launch.slurm import write_launch_sbatch

        return write_launch_sbatch(a.nproc, a.nnodes, a.script, a.args)
    launch = LaunchConfig(a.nnodes, a.node_rank, a.rdzv_endpoint, a.max_restarts)
    if a.k8s:
        from disttrain.jobs.k8s import write_launch_manifest

        return write_launch_manifest(a.k8s, k8s_config(a), a.nproc, launch, a.script, a.args)
    from disttrain.launch.k8s.env import from_pod

    launch, nproc, _ = from_pod(launch, a.nproc)
    return launch_script(nproc, launch, a.script, a.args, module=a.module)


def k8s_config(a: argparse.Namespace) -> K8sConfig:
    """The ``--k8s.*`` options as the k8s section (checked as ``run``'s is)."""
    given = {k[4:]: v for k, v in vars(a).items() if k.startswith("k8s_") and v is not None}
    for key in ("gpus_per_node", "cpus_per_node"):
        if key in given:
            if not given[key].isdigit():
                from disttrain.errors import ConfigError

                raise ConfigError(f"--k8s.{key.replace('_', '-')} must be a whole number, got {given[key]!r}")
            given[key] = int(given[key])
    return K8sConfig(**given)
