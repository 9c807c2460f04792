"""``disttrain run``: the job's config from TOML and dotted overrides, then the launcher."""

from __future__ import annotations

import argparse

from disttrain.config import JobConfig, apply_overrides, load_toml, to_toml

RUN_HELP = """disttrain run [--config job.toml] [--print-config] [--section.key value ...]

  --config FILE     read the job from a TOML file ([train] steps = 500, ...); options below override it
  --print-config    print the resolved config (TOML) and exit without training
  --max-restarts N  restart the job up to N times after a failure (= --launch.max-restarts)
  --debug PRESETS   comms and/or anomaly, e.g. --debug comms,anomaly (= --health.debug; see docs/fault-tolerance.md)
  --slurm           write an sbatch script for --launch.nnodes nodes (one launcher per node) and exit
"""


def main(argv: list[str]) -> int:
    from disttrain.jobs.run import launch_job
    from disttrain.resolve import resolve

    p = argparse.ArgumentParser(prog="disttrain run", add_help=False)
    p.add_argument("--config", default=None)
    p.add_argument("--print-config", action="store_true")
    p.add_argument("--max-restarts", default=None)  # = --launch.max-restarts
    p.add_argument("--debug", default=None)  # = --health.debug (comms, anomaly)
    p.add_argument("--slurm", action="store_true")
    known, rest = p.parse_known_args(argv)
    if known.max_restarts is not None:
        rest += ["--launch.max-restarts", known.max_restarts]
    if known.debug is not None:
        rest += ["--health.debug", known.debug]
    if any(a in ("-h", "--help") for a in rest):
        print(RUN_HELP)
    cfg = load_toml(known.config) if known.config else JobConfig()
    cfg = apply_overrides(cfg, rest)
    if known.slurm:
        from disttrain.launch.slurm import write_run_sbatch

        return write_run_sbatch(cfg)
    if known.print_config:
        job = resolve(cfg)
        print(f"# strategy {job.strategy}: {job.reason}\n{to_toml(job.config)}", end="")
        return 0
    return launch_job(cfg)
