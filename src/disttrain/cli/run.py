"""``disttrain run``: the job's config from TOML and dotted overrides, then the launcher."""

from __future__ import annotations

from disttrain.config import Flag, JobConfig, parse_command, to_toml
from disttrain.errors import ConfigError

SUMMARY = """Train: the bundled character-level GPT on the bundled Shakespeare corpus with every local device, or your
own model and data (--model.module, --data.module), under DDP, FSDP or HSDP as the memory plan decides."""

K8S = Flag(
    "--k8s",
    "write a Kubernetes manifest, pytorchjob (Kubeflow Training Operator) or jobset, with one pod per node "
    "(--k8s.image IMAGE, --k8s.volume PVC:/path; docs/multi-node.md#kubernetes) and exit",
    "KIND",
)
"""``--k8s KIND``: run's, ps's and rl's."""

FLAGS = (
    Flag("--max-restarts", "restart the job up to N times after a failure", "N", key="launch.max_restarts"),
    Flag(
        "--debug",
        "comms and/or anomaly, e.g. --debug comms,anomaly (docs/fault-tolerance.md)",
        "PRESETS",
        key="health.debug",
    ),
    Flag("--slurm", "write an sbatch script for --launch.nnodes nodes (one launcher per node) and exit"),
    K8S,
    Flag(
        "--dry-run",
        "plan the job and build its layout for one rank on a fake process group and the meta device (any world "
        "size, here, in seconds): its shards, each dimension's split, one step's collectives; then exit",
    ),
    Flag("--dry-run-rank", "the rank --dry-run builds (default 0)", "R"),
)


def main(argv: list[str]) -> int:
    line = parse_command(JobConfig, argv, "disttrain run", SUMMARY, FLAGS)
    if line is None:
        return 0
    from disttrain.jobs.run import launch_job
    from disttrain.resolve import resolve

    cfg = line.cfg
    if line.flags["slurm"]:
        from disttrain.launch.slurm import write_run_sbatch

        return write_run_sbatch(cfg)
    if line.flags["k8s"] is not None:
        from disttrain.jobs.k8s import write_run_manifest

        return write_run_manifest(cfg, line.flags["k8s"])
    if line.flags["dry_run"]:
        from disttrain.jobs.dry_run import run_dry

        return run_dry(cfg, _rank(line.flags["dry_run_rank"]))
    if line.print_config:
        job = resolve(cfg)
        print(f"# strategy {job.strategy}: {job.reason}\n{to_toml(job.config)}", end="")
        return 0
    return launch_job(cfg)


def _rank(value: str | None) -> int:
    try:
        return int(value or 0)
    except ValueError:
        raise ConfigError(f"--dry-run-rank takes a rank number, got {value!r}") from None
