"""The ``disttrain`` command: one module per subcommand (argument handling only), dispatched from here.

``run``, ``estimate``, ``ps`` and ``rl`` share one command line (:func:`disttrain.config.parse_command`):
``--config job.toml``, ``--section.key value``, ``--print-config`` and a ``--help`` generated from the sections.

The top of the import graph: may import every other package; nothing imports ``cli``.
"""

from __future__ import annotations

import importlib
import os
import sys

from disttrain.errors import CheckpointError, ConfigError

USAGE = """disttrain <command> [options]

commands:
  run      train (default: the bundled GPT on Shakespeare, every local device)
  launch   run your own script under torchrun: disttrain launch -n 4 train.py [args]
  estimate memory per rank for DDP / FSDP / HSDP and the strategy auto picks: disttrain estimate --parallel.nproc 8
  ckpt     look into and convert checkpoints: disttrain ckpt ls|inspect|verify|export RUN_OR_FOLDER
  data     a corpus into token shards, and checking them: disttrain data prepare|verify ...
  doctor   is this machine (or cluster) ready: versions, devices, ports, rendezvous, bandwidth, RPC
  ps       a click-through-rate model trained against parameter servers: disttrain ps --ps.servers 2 --ps.trainers 2
  rl       actors + a learner on RPC solve a gymnasium environment: disttrain rl --rl.env-id CartPole-v1
  report   plots and one HTML page for run folders (several: overlaid), or --live while a job runs
"""

COMMANDS = ("run", "launch", "estimate", "ckpt", "data", "doctor", "ps", "rl", "report")


def main(argv: list[str] | None = None) -> int:
    """``disttrain ARGV``; the command itself (``argv`` None) ends its process without the interpreter's teardown:
    with torch loaded (and the planner's meta-device build, torch._dynamo) that takes 0.5-2 s of CPU after the
    job is over, at every invocation. Callers in-process (``main([...])``) get the exit code back."""
    if argv is not None:
        return _main(argv)
    from disttrain.utils.process import exit_now

    try:
        code = _main(sys.argv[1:])
        sys.stdout.flush()
    except BrokenPipeError:  # `disttrain run --help | head`: the reader is gone, which is no error of ours
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # the last flush has nowhere to fail
        code = 141  # 128 + SIGPIPE, as a shell tool ended by the pipe has it
    exit_now(code)  # flushes the streams and logging first, as the workers do
    return 0  # not reached


def _main(argv: list[str]) -> int:
    if not argv or argv[0] in ("-h", "--help"):
        print(USAGE, end="")
        return 0
    cmd, rest = argv[0], argv[1:]
    if cmd not in COMMANDS:
        print(f"disttrain: error: unknown command {cmd!r}; commands: {', '.join(COMMANDS)}", file=sys.stderr)
        return 2
    try:
        return importlib.import_module(f"disttrain.cli.{cmd}").main(rest)
    except (ConfigError, CheckpointError) as e:
        print(f"disttrain: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
