"""The ``disttrain`` command: parses arguments, then calls one function per subcommand; no logic here."""

from __future__ import annotations

import argparse
import sys

from disttrain.checkpoint import CheckpointError
from disttrain.config import ConfigError, JobConfig, LaunchConfig, apply_overrides, load_toml, to_toml

USAGE = """disttrain <command> [options]

commands:
  run      train (default: the bundled GPT on Shakespeare, every local device)
  launch   run your own script under torchrun: disttrain launch -n 4 train.py [args]
  estimate memory per rank for DDP / FSDP / HSDP and the strategy auto picks: disttrain estimate --nproc 8
  ckpt     look into and convert checkpoints: disttrain ckpt ls|inspect|verify|export RUN_OR_FOLDER
  doctor   is this machine (or cluster) ready: versions, devices, ports, rendezvous, bandwidth, RPC
"""


def _run(argv: list[str]) -> int:
    from disttrain.launch import launch_job, plan_and_resolve

    p = argparse.ArgumentParser(prog="disttrain run", add_help=False)
    p.add_argument("--config", default=None)
    p.add_argument("--print-config", action="store_true")
    p.add_argument("--max-restarts", default=None)  # = --launch.max-restarts
    p.add_argument("--debug", default=None)  # = --health.debug (comms, anomaly)
    known, rest = p.parse_known_args(argv)
    if known.max_restarts is not None:
        rest += ["--launch.max-restarts", known.max_restarts]
    if known.debug is not None:
        rest += ["--health.debug", known.debug]
    if any(a in ("-h", "--help") for a in rest):
        print(RUN_HELP)
    cfg = load_toml(known.config) if known.config else JobConfig()
    cfg = apply_overrides(cfg, rest)
    if known.print_config:
        resolved, choice = plan_and_resolve(cfg)
        print(f"# strategy {resolved.parallel.strategy}: {choice.reason}\n{to_toml(resolved)}", end="")
        return 0
    return launch_job(cfg)


def _launch(argv: list[str]) -> int:
    from disttrain.launch import launch_script

    p = argparse.ArgumentParser(prog="disttrain launch", description="Run a script under torchrun semantics.")
    p.add_argument("-n", "--nproc", type=int, default=None, help="processes on this node (default: GPUs or 2)")
    p.add_argument("--nnodes", default="1")
    p.add_argument("--node-rank", type=int, default=0)
    p.add_argument("--rdzv-endpoint", default=None)
    p.add_argument("--max-restarts", type=int, default=0)
    p.add_argument("script")
    p.add_argument("args", nargs=argparse.REMAINDER)
    a = p.parse_args(argv)
    launch = LaunchConfig(a.nnodes, a.node_rank, a.rdzv_endpoint, a.max_restarts)
    return launch_script(a.nproc, launch, a.script, a.args)


def _estimate(argv: list[str]) -> int:
    from disttrain.estimate_cmd import run_estimate

    p = argparse.ArgumentParser(prog="disttrain estimate", add_help=False)
    p.add_argument("--config", default=None)
    p.add_argument("--nproc", type=int, default=None)
    p.add_argument("--nnodes", type=int, default=1)
    p.add_argument("--device-memory", default=None)
    p.add_argument("--json", action="store_true")
    p.add_argument("--measure", action="store_true")
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
    )


def _ckpt(argv: list[str]) -> int:
    from pathlib import Path

    from disttrain import ckpt_tools

    p = argparse.ArgumentParser(prog="disttrain ckpt", description="Look into, check and convert checkpoints.")
    sub = p.add_subparsers(dest="action", required=True, metavar="ls|inspect|verify|export")
    where = "a run folder, its checkpoints folder, or one step-N folder"
    ls = sub.add_parser("ls", help="steps, sizes, complete or not, world size and strategy")
    ls.add_argument("path", type=Path, metavar="RUN_OR_FOLDER", help=where)
    ls.add_argument("--json", action="store_true", help="machine-readable output")
    pick = f"{where} (a folder means its newest complete checkpoint)"
    ins = sub.add_parser("inspect", help="keys, shapes, dtypes, per-rank shard sizes")
    ver = sub.add_parser("verify", help="every tensor readable, checksums match (exit 1 if not)")
    exp = sub.add_parser("export", help="one file of model weights, loadable without a process group")
    for s in (ins, ver, exp):
        s.add_argument("path", type=Path, metavar="RUN_OR_FOLDER", help=pick)
        s.add_argument("--step", type=int, default=None, help="this step instead of the newest")
    for s in (ins, ver):
        s.add_argument("--json", action="store_true", help="machine-readable output")
    ins.add_argument("--prefix", default="", help="only keys starting with this (e.g. app.model.)")
    ver.add_argument("--all", action="store_true", help="every checkpoint in the folder")
    exp.add_argument("--format", choices=("torch", "safetensors"), default=None, help="default: safetensors")
    exp.add_argument("--dtype", choices=("fp32", "bf16", "fp16"), default="fp32")
    exp.add_argument("--out", type=Path, default=None, help="default: model.<pt|safetensors> in the run folder")
    a = p.parse_args(argv)
    if a.action == "ls":
        return ckpt_tools.ls(a.path, a.json)
    if a.action == "inspect":
        return ckpt_tools.inspect(a.path, a.step, a.json, a.prefix)
    if a.action == "verify":
        return ckpt_tools.verify(a.path, a.step, a.json, a.all)
    return ckpt_tools.export(a.path, a.step, a.format, a.dtype, a.out)


def _doctor(argv: list[str]) -> int:
    from disttrain import doctor

    p = argparse.ArgumentParser(prog="disttrain doctor", description="Is this machine (or cluster) ready to train?")
    p.add_argument("-n", "--nproc", type=int, default=None, help="local processes for the test (default: GPUs or 2)")
    p.add_argument("--nnodes", default="1", help="nodes taking part (run doctor on each, same --rdzv-endpoint)")
    p.add_argument("--node-rank", type=int, default=0)
    p.add_argument("--rdzv-endpoint", default=None, help="HOST:PORT of the rendezvous (multi-node)")
    p.add_argument("--port", type=int, default=None, help="check that this port is free")
    p.add_argument("--quick", action="store_true", help="skip the multi-process bandwidth and RPC test")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    a = p.parse_args(argv)
    checks = doctor.run_checks(a.nproc, a.nnodes, a.node_rank, a.rdzv_endpoint, a.port, a.quick)
    return doctor.report(checks, a.json)


RUN_HELP = """disttrain run [--config job.toml] [--print-config] [--section.key value ...]

  --config FILE     read the job from a TOML file ([train] steps = 500, ...); options below override it
  --print-config    print the resolved config (TOML) and exit without training
  --max-restarts N  restart the job up to N times after a failure (= --launch.max-restarts)
  --debug PRESETS   comms and/or anomaly, e.g. --debug comms,anomaly (= --health.debug; see README)
"""

ESTIMATE_HELP = """disttrain estimate [--config job.toml] [--nproc N] [--nnodes M] [--device-memory 80GiB] [--json]
                  [--measure] [--section.key value ...]

  Per-rank memory (parameters, gradients, optimizer state, gathered blocks, activations) for DDP, FSDP,
  FSDP without reshard, HSDP and FSDP with CPU offload, built on the meta device (seconds, even for 70B),
  and the strategy `--parallel.strategy auto` would pick, with its reason.

  --nproc N            ranks per node (default: GPUs here, or 2 on CPU)
  --nnodes M           nodes (HSDP replicates across them)
  --device-memory SIZE memory of one device, e.g. 80GiB (default: this machine's)
  --json               machine-readable output
  --measure            also run a few real steps of each strategy that fits, here, and print
                       predicted vs measured with the error in percent
"""

COMMANDS = {"run": _run, "launch": _launch, "estimate": _estimate, "ckpt": _ckpt, "doctor": _doctor}


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0] in ("-h", "--help"):
        print(USAGE, end="")
        return 0
    cmd, rest = argv[0], argv[1:]
    if cmd not in COMMANDS:
        print(f"disttrain: error: unknown command {cmd!r}; commands: {', '.join(COMMANDS)}", file=sys.stderr)
        return 2
    try:
        return COMMANDS[cmd](rest)
    except (ConfigError, CheckpointError) as e:
        print(f"disttrain: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
