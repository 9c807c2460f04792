"""``disttrain ps``: a click-through-rate model trained against parameter servers (arguments only)."""

from __future__ import annotations

from disttrain.cli.run import K8S
from disttrain.config import Flag, parse_job
from disttrain.ps.config import PSJobConfig

SUMMARY = """A click-through-rate model (embedding tables + an MLP) trained by trainers against sharded parameter
servers on torch.distributed.rpc: bsp (equals one process on the combined batch), ssp or asp."""

FLAGS = (
    Flag(
        "--plan",
        "print the rows and bytes each server holds, whether they fit this host's memory, and the samples/s the "
        "job will reach (on --launch.nnodes hosts), then stop",
    ),
    K8S,
)


def main(argv: list[str]) -> int:
    line = parse_job(PSJobConfig, argv, "disttrain ps", SUMMARY, FLAGS)
    if line is None:
        return 0
    if line.flags["k8s"] is not None:
        from disttrain.jobs.k8s_rpc import write_ps_manifest

        return write_ps_manifest(line.cfg, line.flags["k8s"])
    from disttrain.jobs.ps import launch_ps

    return launch_ps(line.cfg, plan=line.flags["plan"])
