"""The ``disttrain`` command: parses arguments, then calls one function per subcommand; no logic here."""

from __future__ import annotations

import argparse
import sys

from disttrain.config import ConfigError, JobConfig, LaunchConfig, apply_overrides, load_toml, to_toml

USAGE = """disttrain <command> [options]

commands:
  run      train (default: the bundled GPT on Shakespeare, every local device)
  launch   run your own script under torchrun: disttrain launch -n 4 train.py [args]
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


RUN_HELP = """disttrain run [--config job.toml] [--print-config] [--section.key value ...]

  --config FILE     read the job from a TOML file ([train] steps = 500, ...); options below override it
  --print-config    print the resolved config (TOML) and exit without training
"""

COMMANDS = {"run": _run, "launch": _launch}


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
    except ConfigError as e:
        print(f"disttrain: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
