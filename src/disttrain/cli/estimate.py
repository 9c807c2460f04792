"""``disttrain estimate``: the memory plan per strategy (and, with ``--measure``, measured against real ranks).

Arguments only: the work is :func:`disttrain.jobs.estimate.run_estimate`, imported when the command runs.
May import: anything (``disttrain.cli`` is the top layer).
"""

from __future__ import annotations

import argparse

from disttrain.config import JobConfig, apply_overrides, load_toml

ESTIMATE_HELP = """disttrain estimate [--config job.toml] [--nproc N] [--nnodes M] [--device-memory 80GiB] [--json]
                  [--bandwidth 25GB/s] [--inter-node-bandwidth 100Gbit/s] [--explain] [--measure]
                  [--section.key value ...]

  Per-rank memory (parameters, gradients, optimizer state, gathered blocks, activations) and the predicted
  step time (compute, bytes sent per rank, communication, with and without overlap) for DDP, FSDP, FSDP
  without reshard, HSDP and FSDP with CPU offload, built on the meta device (seconds, even for 70B), and the
  strategy `--parallel.strategy auto` would pick: the fastest that fits, with both numbers.

  --nproc N            ranks per node (default: GPUs here, or 2 on CPU)
  --nnodes M           nodes (HSDP replicates across them)
  --device-memory SIZE memory of one device, e.g. 80GiB (default: this machine's)
  --json               machine-readable output
  --bandwidth BW       one rank's link within a node, e.g. 25GB/s (default: what `disttrain doctor`
                       measured on this machine, cached in ~/.cache/disttrain/machine.json)
  --inter-node-bandwidth BW   across nodes, e.g. 100Gbit/s
  --explain            why: every grouping of blocks into FSDP units tried, the prefetch depth, the
                       collectives of the chosen strategy
  --measure            also run a few real steps of each strategy that fits, here, and print
                       predicted vs measured with the error in percent
"""


def main(argv: list[str]) -> int:
    from disttrain.jobs.estimate import run_estimate

    p = argparse.ArgumentParser(prog="disttrain estimate", add_help=False)
    p.add_argument("--config", default=None)
    p.add_argument("--nproc", type=int, default=None)
    p.add_argument("--nnodes", type=int, default=1)
    p.add_argument("--device-memory", default=None)
    p.add_argument("--json", action="store_true")
    p.add_argument("--measure", action="store_true")
    p.add_argument("--explain", action="store_true")
    p.add_argument("--bandwidth", default=None)
    p.add_argument("--inter-node-bandwidth", default=None)
    known, rest = p.parse_known_args(argv)
    if any(a in ("-h", "--help") for a in rest):
        print(ESTIMATE_HELP)
        return 0
    cfg = load_toml(known.config) if known.config else JobConfig()
    cfg = apply_overrides(cfg, rest)
    return run_estimate(
        cfg,
        nproc=known.nproc,
        nnodes=known.nnodes,
        device_memory=known.device_memory,
        as_json=known.json,
        measure=known.measure,
        explain=known.explain,
        bandwidth=known.bandwidth,
        inter_bandwidth=known.inter_node_bandwidth,
    )
