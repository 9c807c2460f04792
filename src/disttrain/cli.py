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
  ckpt     look into and convert checkpoints: disttrain ckpt ls|inspect|verify|export RUN_OR_FOLDER
"""


def _run(argv: list[str]) -> int:
    from disttrain.launch import launch_job, resolve_job

    p = argparse.ArgumentParser(prog="disttrain run", add_help=False)
    p.add_argument("--config", default=None)
    p.add_argument("--print-config", action="store_true")
    known, rest = p.parse_known_args(argv)
    if any(a in ("-h", "--help") for a in rest):
        print(RUN_HELP)
    cfg = load_toml(known.config) if known.config else JobConfig()
    cfg = apply_overrides(cfg, rest)
    if known.print_config:
        print(to_toml(resolve_job(cfg)), end="")
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


RUN_HELP = """disttrain run [--config job.toml] [--print-config] [--section.key value ...]

  --config FILE     read the job from a TOML file ([train] steps = 500, ...); options below override it
  --print-config    print the resolved config (TOML) and exit without training
"""

COMMANDS = {"run": _run, "launch": _launch, "ckpt": _ckpt}


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
