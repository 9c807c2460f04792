"""``disttrain estimate``: the memory plan per strategy (and, with ``--measure``, measured against real ranks).

Arguments only: the work is :func:`disttrain.jobs.estimate.run_estimate`, imported when the command runs.
May import: anything (``disttrain.cli`` is the top layer).
"""

from __future__ import annotations

from disttrain.config import Flag, JobConfig, parse_job

SUMMARY = """Per-rank memory (parameters, gradients, optimizer state, gathered blocks, activations) and the predicted
step time (compute, bytes sent per rank, communication, with and without overlap) for DDP, FSDP, FSDP without
reshard, HSDP and FSDP with CPU offload, built on the meta device (seconds, even for 70B), and the strategy
`--parallel.strategy auto` would pick: the fastest that fits. The job is the one `disttrain run` takes (the same
--config and options): ranks per node --parallel.nproc (default: GPUs here, or 2 on CPU), nodes --launch.nnodes
(HSDP replicates across them), one device's memory --parallel.device-memory (e.g. 80GiB; default: this
machine's)."""

FLAGS = (
    Flag("--json", "machine-readable output"),
    Flag("--explain", "why: every grouping of blocks into FSDP units tried, the prefetch depth, the collectives"),
    Flag("--measure", "also run a few real steps of each strategy that fits, here: predicted vs measured"),
    Flag(
        "--bandwidth",
        "one rank's link within a node, e.g. 25GB/s (default: what `disttrain doctor` measured here)",
        "BW",
    ),
    Flag("--inter-node-bandwidth", "one rank's link across nodes, e.g. 100Gbit/s", "BW"),
    Flag("--reset-measurements", "forget the compute efficiency earlier --measure runs taught the plan here"),
)


def main(argv: list[str]) -> int:
    line = parse_job(JobConfig, argv, "disttrain estimate", SUMMARY, FLAGS)
    if line is None:
        return 0
    from disttrain.jobs.estimate import run_estimate

    f = line.flags
    if f["reset_measurements"]:
        from disttrain.plan.timing import forget_efficiency

        print(forget_efficiency())
    return run_estimate(
        line.cfg,
        as_json=f["json"],
        measure=f["measure"],
        explain=f["explain"],
        bandwidth=f["bandwidth"],
        inter_bandwidth=f["inter_node_bandwidth"],
    )
