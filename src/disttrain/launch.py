"""Start workers through ``torch.distributed.run`` (torchrun), in-process: local N processes, multi-node,
elastic restarts. No home-made spawner: torchrun sets RANK/WORLD_SIZE/LOCAL_RANK and supervises.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import sys
import time
from pathlib import Path
from typing import Any

import torch

from disttrain.config import ConfigError, JobConfig, LaunchConfig, resolve_batch, to_toml


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
    if launch.rdzv_endpoint:
        argv += ["--rdzv-backend=c10d", f"--rdzv-endpoint={launch.rdzv_endpoint}", f"--node-rank={launch.node_rank}"]
        argv += [f"--rdzv-id={os.environ.get('DISTTRAIN_RDZV_ID', 'disttrain')}"]
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


def run_torchrun(argv: list[str], nproc: int, device_type: str) -> int:
    """Run torchrun with ``argv`` (options, then the program); return the job's exit code."""
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.run import get_args_parser, run

    os.environ.setdefault("OMP_NUM_THREADS", str(threads_per_rank(nproc, device_type)))
    os.environ.setdefault("TORCH_NCCL_ASYNC_ERROR_HANDLING", "1")
    # A restarted group must not read the previous attempt's addresses from a shared store (pytorch#135712).
    os.environ.setdefault("TORCH_DISABLE_SHARE_RDZV_TCP_STORE", "1")
    for name in ("torch.distributed.elastic", "torch.distributed.run", "torch.distributed.launcher"):
        logging.getLogger(name).setLevel(logging.WARNING)
    args = get_args_parser().parse_args(argv)
    try:
        run(args)
    except ChildFailedError as e:
        rank, failure = e.get_first_failure()
        where = f"; its log: {failure.error_file}" if failure.error_file and os.path.exists(failure.error_file) else ""
        print(
            f"disttrain: rank {rank} failed with exit code {failure.exitcode}{where}",
            file=sys.stderr,
        )
        return 1
    return 0


def resolve_job(cfg: JobConfig) -> JobConfig:
    """Fill in what the user left to us (device, nproc, strategy) and check everything that needs them."""
    return plan_and_resolve(cfg)[0]


@dataclasses.dataclass(frozen=True)
class StrategyChoice:
    """What ``disttrain run`` decided, for the console and the run folder."""

    strategy: str
    reason: str
    plan_text: str = ""
    plan_json: dict[str, Any] | None = None


def plan_and_resolve(cfg: JobConfig) -> tuple[JobConfig, StrategyChoice]:
    """:func:`resolve_job`, plus the memory plan that chose (or checked) the strategy."""
    from disttrain.dist.env import resolve_device_type, resolve_precision
    from disttrain.dist.mesh import ParallelDims
    from disttrain.job import check_imports

    try:
        device = resolve_device_type(cfg.parallel.device)
    except RuntimeError as e:
        raise ConfigError(str(e)) from None
    if cfg.checkpoint.create_seed:  # initialise once, on one process, whatever the job will later use
        cfg = dataclasses.replace(cfg, parallel=dataclasses.replace(cfg.parallel, nproc=1, strategy="single"))
    nproc = cfg.parallel.nproc or default_nproc(device)
    check_nproc(nproc, device, cfg.parallel.oversubscribe)
    max_nodes = int(cfg.launch.nnodes.split(":")[-1])
    world = nproc * max_nodes
    check_imports(cfg)
    cfg = dataclasses.replace(cfg, precision=resolve_precision(cfg.precision, device))
    choice = choose_strategy(cfg, nproc, max_nodes, device)
    dims = ParallelDims(choice.strategy, world, cfg.parallel.replicate, cfg.parallel.shard, local_world_size=nproc)
    resolve_batch(cfg.train, dims.dp_size)
    parallel = dataclasses.replace(cfg.parallel, nproc=nproc, device=device, strategy=dims.strategy)  # type: ignore[arg-type]
    return dataclasses.replace(cfg, parallel=parallel), choice


def choose_strategy(cfg: JobConfig, nproc: int, nnodes: int, device: str) -> StrategyChoice:
    """'auto' from the memory plan; a forced strategy is checked against it (ConfigError unless it fits
    or ``parallel.force``). A model the planner cannot profile keeps a forced strategy, with a warning."""
    from disttrain import memory
    from disttrain.config import MetaDeviceError
    from disttrain.dist.mesh import SHARDED
    from disttrain.dist.strategy import resolve_strategy

    if cfg.checkpoint.create_seed:
        return StrategyChoice("single", "seed checkpoint: one process")
    layout = memory.Layout(
        nproc,
        nnodes,
        memory.resolve_device_memory(cfg.parallel.device_memory, device, nproc),
        cfg.parallel.memory_headroom,
    )
    try:
        est = memory.plan_job(cfg, layout)
    except ConfigError as e:
        if cfg.parallel.strategy == "auto" or (isinstance(e, MetaDeviceError) and cfg.parallel.strategy in SHARDED):
            raise
        print(f"disttrain: warning: no memory plan ({e})", file=sys.stderr)
        return StrategyChoice(resolve_strategy(cfg.parallel.strategy, nproc * nnodes), "forced; no memory plan")
    strategy, reason = memory.decide(cfg, est)
    return StrategyChoice(strategy, reason, memory.render(est), est.to_json())


def make_run_dir(cfg: JobConfig) -> Path:
    name = cfg.run.name or time.strftime("%Y%m%d-%H%M%S") + f"-{cfg.parallel.strategy}"
    path = Path(cfg.run.root) / name
    if cfg.run.name is None:
        n = 1
        while path.exists():
            n += 1
            path = Path(cfg.run.root) / f"{name}-{n}"
    path.mkdir(parents=True, exist_ok=True)
    return path


def launch_job(cfg: JobConfig) -> int:
    """``disttrain run``: resolve, write the run folder, start the workers (in-process when alone)."""
    cfg, choice = plan_and_resolve(cfg)
    run_dir = make_run_dir(cfg)
    (run_dir / "config.toml").write_text(to_toml(cfg))
    (run_dir / "strategy.json").write_text(
        json.dumps({"strategy": choice.strategy, "reason": choice.reason, "plan": choice.plan_json}, indent=2) + "\n"
    )
    if choice.plan_text:
        (run_dir / "memory_plan.txt").write_text(choice.plan_text + "\n")
    nproc, device = cfg.parallel.nproc or 1, cfg.parallel.device
    print(
        f"disttrain: {cfg.parallel.strategy} on {nproc} {device} process(es) x {cfg.launch.nnodes} node(s); "
        f"run folder {run_dir}\ndisttrain: strategy {cfg.parallel.strategy}: {choice.reason}",
        flush=True,
    )
    from disttrain.health import debug_env

    os.environ.update(debug_env(cfg.health.debug_presets, run_dir))  # read by the workers' c10d/NCCL at start
    if nproc == 1 and cfg.launch.nnodes == "1" and cfg.launch.max_restarts == 0:
        from disttrain import job

        torch.set_num_threads(threads_per_rank(1, device))
        return job.main(run_dir)
    argv = torchrun_argv(nproc, cfg.launch, run_dir / "logs" / "torchrun", quiet_ranks=True)
    return run_torchrun([*argv, "-m", "disttrain.job", str(run_dir)], nproc, device)


def launch_script(nproc: int | None, launch: LaunchConfig, script: str, script_args: list[str]) -> int:
    """``disttrain launch -n N script.py ...``: torchrun semantics for a user's own script."""
    if not Path(script).is_file():
        raise ConfigError(f"script {script!r} does not exist")
    device = "cuda" if torch.cuda.is_available() else "cpu"
    n = nproc or default_nproc(device)
    check_nproc(n, device, oversubscribe=True)
    return run_torchrun([*torchrun_argv(n, launch), script, *script_args], n, device)
