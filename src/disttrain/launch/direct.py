"""Worker processes started and watched by the command itself, not by torchrun: for RPC jobs that must outlive
one of their processes (an RL actor, a parameter server with a spare). torchrun's agent ends, or restarts, the
whole group when any worker fails; these jobs replace the process's part instead.

:func:`start` gives a worker torchrun's environment (RANK, WORLD_SIZE, MASTER_ADDR/PORT, GROUP_RANK for the
launcher's frozen-rank watch); rank 0 prints to this console, every rank's output also goes to
``<run>/logs/rank<r>.log``.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any

from disttrain.errors import ConfigError
from disttrain.launch.forked import ForkedProcess, fork_process, start_method
from disttrain.launch.frozen_watch import watch_frozen
from disttrain.utils.host import reserved_port

Worker = subprocess.Popen[bytes] | ForkedProcess
"""A started worker: a fresh interpreter, or forked from this process (:mod:`disttrain.launch.forked`)."""


def start(module: str, rank: int, world: int, host: str, port: int, run_dir: Path, node: int = 0) -> Worker:
    """``python -m module RUN_DIR`` as rank ``rank`` of ``world``, rendezvous at ``host:port``; forked from
    this process where :func:`disttrain.launch.forked.start_method` says so."""
    env = dict(
        os.environ,
        RANK=str(rank),
        GROUP_RANK=str(node),  # whose launcher watches its heartbeat
        WORLD_SIZE=str(world),
        MASTER_ADDR=host,
        MASTER_PORT=str(port),
        OMP_NUM_THREADS="1",
        PYTHONUNBUFFERED="1",
    )
    env.setdefault("TORCH_CPP_LOG_LEVEL", "ERROR")  # TensorPipe's warnings when a peer dies
    (run_dir / "logs").mkdir(exist_ok=True)
    log: IO[bytes] = open(run_dir / "logs" / f"rank{rank}.log", "ab")  # noqa: SIM115 (the child keeps it)
    out = None if rank == 0 else log
    if start_method(module, "cpu", env) == "fork":  # these jobs run on CPU
        fd = None if out is None else out.fileno()
        return fork_process(module, [str(run_dir)], env, stdout=fd, stderr=fd)
    return subprocess.Popen(
        [sys.executable, "-m", module, str(run_dir)], env=env, stdout=out, stderr=log if rank else None
    )


def per_node(world: int, nnodes: str, what: str) -> int:
    """Processes per node: ``world`` spread evenly over a fixed ``nnodes`` (an RPC group is fixed when it
    starts: no MIN:MAX). ``what``: the processes, for the error."""
    if ":" in nnodes:
        raise ConfigError(
            f"{what} in one RPC group, fixed when it starts: launch.nnodes must be a number of nodes, not "
            f"{nnodes!r} (MIN:MAX is for elastic training jobs)"
        )
    if world % int(nnodes):
        raise ConfigError(f"{what}, which launch.nnodes {nnodes!r} must divide evenly")
    return world // int(nnodes)


def node_ranks(world: int, nnodes: str, node_rank: int, rdzv_endpoint: str, what: str) -> tuple[range, str, int]:
    """This node's ranks of ``world`` spread evenly over ``nnodes``, and the rendezvous host and port (rank 0
    hosts the RPC store; one node: loopback and a free port). ``what``: the processes, for the error."""
    per = per_node(world, nnodes, what)
    nodes = world // per
    if nodes == 1:
        return range(world), "127.0.0.1", reserved_port()
    if not rdzv_endpoint or ":" not in rdzv_endpoint:
        raise ConfigError(
            "launch.nnodes > 1 needs --launch.rdzv-endpoint HOST:PORT (node 0's address, the same everywhere)"
        )
    host, port = rdzv_endpoint.rsplit(":", 1)
    return range(node_rank * per, (node_rank + 1) * per), host, int(port)


def run_watched(procs: dict[int, Worker], health: Any, run_dir: Path, node: int, watch: Callable[[], int]) -> int:
    """``watch()`` (the job's own loop over ``procs``) under the launcher's frozen-rank watch; Ctrl-C passes to
    the workers (exit 130), SIGTERM too (exit 143: a scheduler or the kubelet stopping this node; as the
    container's first process the launcher would otherwise ignore it and wait for SIGKILL), and no worker
    outlives it. These jobs checkpoint on their schedule: a stopped one resumes from its newest checkpoint."""
    old = signal.signal(signal.SIGTERM, _raise_terminated)
    try:
        with watch_frozen(health, run_dir, node):  # names a worker whose process stopped
            return watch()
    except KeyboardInterrupt:
        for p in procs.values():
            p.send_signal(signal.SIGINT)
        return 130
    except Terminated:
        for p in procs.values():
            if p.poll() is None:
                p.terminate()
        _wait(procs, TERM_WAIT_S)
        print(
            f"disttrain: terminated (SIGTERM): the workers were stopped; run the same command again to resume "
            f"from the newest checkpoint in {run_dir}",
            file=sys.stderr,
            flush=True,
        )
        return 143
    finally:
        signal.signal(signal.SIGTERM, old)
        for p in procs.values():
            if p.poll() is None:
                p.kill()


TERM_WAIT_S = 10.0
"""How long stopped workers get to exit before they are killed."""


class Terminated(Exception):
    """SIGTERM reached the launcher."""


def _raise_terminated(signum: int, frame: Any) -> None:
    raise Terminated


def _wait(procs: dict[int, Worker], seconds: float) -> None:
    deadline = time.monotonic() + seconds
    for p in procs.values():
        with contextlib.suppress(subprocess.TimeoutExpired):
            p.wait(timeout=max(deadline - time.monotonic(), 0.01))
