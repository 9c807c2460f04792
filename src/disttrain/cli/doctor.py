"""``disttrain doctor``: is this machine (or cluster) ready to train."""

from __future__ import annotations

import argparse


def main(argv: list[str]) -> int:
    from disttrain.jobs import doctor

    p = argparse.ArgumentParser(prog="disttrain doctor", description="Is this machine (or cluster) ready to train?")
    p.add_argument("-n", "--nproc", type=int, default=None, help="local processes for the test (default: GPUs or 2)")
    p.add_argument(
        "--nnodes", "--launch.nnodes", default="1", help="nodes taking part (run doctor on each, same --rdzv-endpoint)"
    )
    p.add_argument("--node-rank", "--launch.node-rank", type=int, default=0)
    p.add_argument("--rdzv-endpoint", "--launch.rdzv-endpoint", default=None, help="HOST:PORT of the rendezvous")
    p.add_argument("--port", type=int, default=None, help="check that this port is free")
    p.add_argument("--quick", action="store_true", help="skip the multi-process bandwidth and RPC test")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    a = p.parse_args(argv)
    checks = doctor.run_checks(a.nproc, a.nnodes, a.node_rank, a.rdzv_endpoint, a.port, a.quick)
    return doctor.report(checks, a.json)
