"""``disttrain doctor``: is this machine (or cluster) ready to train (arguments only)."""

from __future__ import annotations

from disttrain.config import Flag, parse_job
from disttrain.config.doctor import DoctorJobConfig

SUMMARY = """Is this machine (or cluster) ready to train? Versions, devices, backends, ports, the rendezvous and
clocks across nodes, the links' bandwidth and latency (cached for the planner), matmul and element-wise rates,
RPC. Each check says OK, WARN or FAIL, and what to do."""

FLAGS = (
    Flag("--nproc", "local processes for the multi-process checks", "N", key="doctor.nproc", short="-n"),
    Flag("--nnodes", "nodes taking part (run doctor on each, same --rdzv-endpoint)", "N", key="launch.nnodes"),
    Flag("--node-rank", "this node's rank", "K", key="launch.node_rank"),
    Flag("--rdzv-endpoint", "HOST:PORT of the rendezvous", "HOST:PORT", key="launch.rdzv_endpoint"),
    Flag("--port", "check that this port is free", "PORT", key="doctor.port"),
    Flag("--quick", "skip the multi-process checks (= --doctor.quick)"),
    Flag("--json", "machine-readable output"),
)


def main(argv: list[str]) -> int:
    line = parse_job(DoctorJobConfig, argv, "disttrain doctor", SUMMARY, FLAGS)
    if line is None:
        return 0
    from disttrain.jobs import doctor

    cfg, launch = line.cfg.doctor, line.cfg.launch
    quick = cfg.quick or bool(line.flags["quick"])
    checks = doctor.run_checks(cfg.nproc, launch.nnodes, launch.node_rank, launch.rdzv_endpoint, cfg.port, quick)
    return doctor.report(checks, line.flags["json"])
