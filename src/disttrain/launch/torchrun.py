"""Start workers through ``torch.distributed.run`` (torchrun), in-process: local N processes, multi-node,
elastic restarts. No home-made spawner: torchrun sets RANK/WORLD_SIZE/LOCAL_RANK and supervises.
:func:`run_module_captured` runs torchrun as a child process instead, for a caller that wants fresh workers
and their output (``disttrain estimate --measure``).
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import uuid
from collections.abc import Callable, Iterator, MutableMapping
from pathlib import Path
from typing import Any

import torch

from disttrain.config import LaunchConfig
from disttrain.errors import ConfigError
from disttrain.health.peers import PEER_LOST_EXIT
from disttrain.launch.agent_log import quiet_agent_log
from disttrain.launch.forked import forked_worker, start_method
from disttrain.launch.network import endpoint_parts, is_local, route_to, set_interface_env
from disttrain.utils.host import reserved_port
from disttrain.utils.malloc import CPU_MALLOC_ENV, allocator_is_ours

STOP_SIGNALS = "SIGTERM,SIGINT,SIGHUP,SIGQUIT,SIGUSR1"
"""Signals torchrun's agent passes on to the workers: its defaults and Slurm's time-limit warning."""
STOPPED_CODES = (128 + signal.SIGINT, 128 + signal.SIGUSR1, 128 + signal.SIGTERM)
"""Exit codes of a job stopped by a signal on purpose (Ctrl-C, SIGUSR1, SIGTERM): the caller says the line."""


def device_count(device_type: str) -> int:
    if device_type == "cuda":
        return torch.cuda.device_count()
    return os.cpu_count() or 1


def default_nproc(device_type: str) -> int:
    """One process per GPU; 2 on a CPU machine."""
    return max(torch.cuda.device_count(), 1) if device_type == "cuda" else 2


def check_nproc(nproc: int, device_type: str, oversubscribe: bool = False) -> None:
    have = device_count(device_type)
    if nproc <= have or (device_type == "cpu" and oversubscribe):
        return
    if device_type == "cuda":
        raise ConfigError(
            f"parallel.nproc ({nproc}) is larger than the {have} visible GPU(s); "
            f"use --parallel.nproc {have} or fewer (or check CUDA_VISIBLE_DEVICES)"
        )
    raise ConfigError(
        f"parallel.nproc ({nproc}) is larger than this machine's {have} CPU core(s); use --parallel.nproc {have}, "
        "or add --parallel.oversubscribe to run more processes than cores (slow, for testing sharding)"
    )


def threads_per_rank(nproc: int, device_type: str) -> int:
    cores = os.cpu_count() or 1
    return max(1, cores // nproc) if device_type == "cpu" else max(1, min(8, cores // max(nproc, 1)))


def torchrun_argv(
    nproc: int,
    launch: LaunchConfig,
    log_dir: Path | None = None,
    quiet_ranks: bool = False,
) -> list[str]:
    """torchrun options for ``nproc`` processes on this node; ranks > 0 go to files when ``quiet_ranks``."""
    argv = [f"--nproc-per-node={nproc}", f"--nnodes={launch.nnodes}", f"--max-restarts={launch.max_restarts}"]
    # SIGTERM / SIGUSR1 reach the workers (they finish the step and save), who get preempt_grace_s to leave
    argv += [f"--signals-to-handle={STOP_SIGNALS}", f"--shutdown-timeout={launch.preempt_grace_s}"]
    if launch.rdzv_endpoint:
        argv += ["--rdzv-backend=c10d", f"--rdzv-endpoint={launch.rdzv_endpoint}"]  # ranks in order of arrival
        argv += [f"--rdzv-id={os.environ.get('DISTTRAIN_RDZV_ID', 'disttrain')}"]
        host, port = endpoint_parts(launch.rdzv_endpoint)
        argv += [f"--local-addr={route_to(host, port)}"]
        # Who hosts the rendezvous store: torchrun guesses from host names, which say nothing where several
        # hosts share one (containers, network namespaces, one test machine) or the endpoint is an address,
        # and two nodes that both guess "me" race for the port. Node 0 hosts it when the endpoint is one of
        # its own addresses; other node ranks never do (a node left at the default rank 0 keeps the guess).
        conf = {}
        if launch.node_rank != 0:
            conf["is_host"] = "false"
        elif is_local(host):
            conf["is_host"] = "true"
        if ":" in launch.nnodes:  # elastic: once MIN nodes are in, how long a round waits for more
            conf["last_call_timeout"] = str(launch.elastic_wait_s)
            # a dead node leaves the rendezvous after 3 missed keep-alives: 6 s instead of torchrun's 15
            conf["keep_alive_interval"] = "2"
        if conf:
            argv += ["--rdzv-conf=" + ",".join(f"{k}={v}" for k, v in conf.items())]
    else:
        if launch.nnodes != "1":
            raise ConfigError(
                f"launch.nnodes is {launch.nnodes!r} but no launch.rdzv_endpoint is set; "
                "pass --launch.rdzv-endpoint HOST:PORT (the same on every node)"
            )
        argv += ["--standalone"]
    if log_dir is not None:
        argv += [f"--log-dir={log_dir}"]
        if quiet_ranks and nproc > 1:
            argv += ["--redirects=" + ",".join(f"{r}:3" for r in range(1, nproc))]
    return argv


def worker_env_defaults(env: MutableMapping[str, str], nproc: int, device_type: str) -> None:
    """The variables every worker starts with, unless ``env`` already sets them."""
    env.setdefault("OMP_NUM_THREADS", str(threads_per_rank(nproc, device_type)))
    env.setdefault("TORCH_NCCL_ASYNC_ERROR_HANDLING", "1")
    # A restarted group must not read the previous attempt's addresses from a shared store (pytorch#135712).
    env.setdefault("TORCH_DISABLE_SHARE_RDZV_TCP_STORE", "1")
    if device_type == "cpu" and allocator_is_ours(env):
        env.update(CPU_MALLOC_ENV)


def run_torchrun(argv: list[str], nproc: int, device_type: str, name_rank: Callable[[int], str] | None = None) -> int:
    """Run torchrun with ``argv`` (options, then the program); return the job's exit code. ``name_rank``
    names a rank in the failure line (``server0 (rank 2)``)."""
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.run import get_args_parser

    worker_env_defaults(os.environ, nproc, device_type)
    quiet_agent_log()  # a Ctrl-C is our one line, not three of the agent's warnings
    args = get_args_parser().parse_args(argv)
    hold_master_ports()
    if args.local_addr:
        set_interface_env(os.environ, args.local_addr)
    try:
        with _pruned(Path(args.log_dir) if args.log_dir and args.nnodes == "1" else None):
            _run(args, device_type)
    except SignalException as e:  # Ctrl-C (SIGINT) or a scheduler's SIGTERM: torchrun has stopped the workers
        return 128 + int(e.sigval)
    except KeyboardInterrupt:  # a Ctrl-C outside torchrun's own handler (start-up, shutdown)
        return 130
    except ChildFailedError as e:
        rank, failure = e.get_first_failure()
        if failure.exitcode in STOPPED_CODES:  # a stop that began on another node: the ranks saved and left
            return failure.exitcode
        if failure.exitcode == PEER_LOST_EXIT:  # the rank said which node it lost and how to resume
            return PEER_LOST_EXIT
        where = f"; its log: {failure.error_file}" if failure.error_file and os.path.exists(failure.error_file) else ""
        who = name_rank(rank) if name_rank else f"rank {rank}"
        print(f"disttrain: {who} failed with exit code {failure.exitcode}{where}", file=sys.stderr)
        return 1
    return 0


def _run(args: Any, device_type: str) -> None:
    """torchrun's ``run(args)``; a rank of one of our worker modules on CPU is forked from this process
    (:mod:`disttrain.launch.forked`) instead of started as a fresh ``python -u -m`` process."""
    from torch.distributed.launcher.api import elastic_launch
    from torch.distributed.run import config_from_args, run

    method = start_method(args.training_script, device_type, os.environ) if args.module else "exec"
    if method == "exec":
        run(args)
        return
    if args.standalone:  # what torchrun's run() makes of --standalone
        args.rdzv_backend, args.rdzv_endpoint, args.rdzv_id = "c10d", "localhost:0", str(uuid.uuid4())
    if args.master_port is None:
        args.master_port = 29500
    config, _python, _argv = config_from_args(args)
    config.start_method = "fork"
    elastic_launch(config, entrypoint=forked_worker)(args.training_script, *args.training_script_args)


def hold_master_ports() -> None:
    """Make this process's torchrun agent hold the port it names for rank 0's store (``MASTER_PORT``) until the
    job ends: its own pick (``get_free_port``, used as we do not share the agent's store) is only free until
    someone else binds it, and on a busy host rank 0 then fails to listen (``EADDRINUSE``)."""
    import torch.distributed.elastic.rendezvous.api as rdzv_api

    rdzv_api.get_free_port = reserved_port  # type: ignore[attr-defined]


@contextlib.contextmanager
def _pruned(log_dir: Path | None) -> Iterator[None]:
    """Remove the empty folders under ``log_dir`` (and it, if empty) when torchrun is done: it makes one per rank
    and attempt, filled only for the ranks whose output goes to files, or with the error file of a rank that
    failed. One node only: on a shared file system another node's agent may still be using its empty ones."""
    try:
        yield
    finally:
        if log_dir is not None and log_dir.is_dir():
            for folder in sorted((p for p in log_dir.rglob("*") if p.is_dir()), key=lambda p: -len(p.parts)):
                with contextlib.suppress(OSError):  # not empty
                    folder.rmdir()
            with contextlib.suppress(OSError):
                log_dir.rmdir()


_HELD_TORCHRUN = (
    "from disttrain.launch.torchrun import hold_master_ports; hold_master_ports(); "
    "from torch.distributed.run import main; main()"
)
"""``python -m torch.distributed.run``, its agent holding rank 0's port (:func:`hold_master_ports`)."""


def run_module_captured(
    module: str,
    args: list[str],
    nproc: int,
    device_type: str,
    *,
    env: dict[str, str] | None = None,
    timeout: float | None = None,
    tail_lines: int = 6,
) -> tuple[int, str]:
    """``python -m module args`` on ``nproc`` ranks of this node, torchrun in a child process of its own (fresh
    workers, their output captured instead of shown); (exit code, the last ``tail_lines`` lines of its stderr, or
    of its stdout when stderr is empty, joined by `` | ``). ``env`` adds to (and overrides) this process's
    variables; the worker defaults of :func:`run_torchrun` fill in the rest."""
    child_env = {**os.environ, **(env or {})}
    worker_env_defaults(child_env, nproc, device_type)
    argv = [sys.executable, "-c", _HELD_TORCHRUN, *torchrun_argv(nproc, LaunchConfig())]
    proc = subprocess.run([*argv, "-m", module, *args], env=child_env, capture_output=True, text=True, timeout=timeout)
    tail = (proc.stderr or proc.stdout).strip().splitlines()[-tail_lines:]
    return proc.returncode, " | ".join(tail)


def launch_script(
    nproc: int | None, launch: LaunchConfig, script: str, script_args: list[str], module: bool = False
) -> int:
    """``disttrain launch -n N script.py ...`` (``-m pkg.mod ...`` with ``module``): torchrun semantics for a
    user's own script or module."""
    if module:
        import importlib.util

        try:
            found = importlib.util.find_spec(script) is not None
        except (ImportError, ValueError):
            found = False
        if not found:
            raise ConfigError(f"module {script!r} cannot be imported here; check its name and PYTHONPATH")
    elif not Path(script).is_file():
        raise ConfigError(f"script {script!r} does not exist")
    device = "cuda" if torch.cuda.is_available() else "cpu"
    n = nproc or default_nproc(device)
    check_nproc(n, device, oversubscribe=True)
    program = ["-m", script] if module else [script]
    return run_torchrun([*torchrun_argv(n, launch), *program, *script_args], n, device)
