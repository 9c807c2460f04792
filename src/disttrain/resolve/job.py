"""The parent's decisions before any worker starts: device, number of processes, the strategy (``auto`` from
the memory plan, or a forced one checked against it) and the batch arithmetic. Every mistake found here is a
:class:`ConfigError` (one line, exit 2) instead of a failure inside N workers.
"""

from __future__ import annotations

import dataclasses
import sys
from typing import Any

from disttrain.build import check_imports
from disttrain.config import JobConfig, resolve_batch
from disttrain.errors import ConfigError, MetaDeviceError
from disttrain.launch.torchrun import check_nproc, default_nproc
from disttrain.parallel.env import resolve_device_type, resolve_precision
from disttrain.parallel.mesh import SHARDED, ParallelDims, resolve_strategy
from disttrain.plan.choose import decide
from disttrain.plan.estimate import Layout, plan_job, resolve_device_memory
from disttrain.plan.render import render
from disttrain.resolve.inputs import check_inputs
from disttrain.train.loss import cross_entropy


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
    parallel: dict[str, Any] = dataclasses.field(default_factory=dict)
    """Parallel settings the plan resolved (FSDP grouping, prefetch depth, reshard for FSDP without reshard)."""


def plan_and_resolve(cfg: JobConfig) -> tuple[JobConfig, StrategyChoice]:
    """:func:`resolve_job`, plus the memory plan that chose (or checked) the strategy."""

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
    check_inputs(cfg)  # data.path and checkpoint.resume, before the plan reads the data
    cfg = dataclasses.replace(cfg, precision=resolve_precision(cfg.precision, device))
    choice = choose_strategy(cfg, nproc, max_nodes, device)
    dims = ParallelDims.from_config(cfg.parallel, world, nproc, choice.strategy)
    resolve_batch(cfg.train, dims.dp_size)
    resolved: dict[str, Any] = {"nproc": nproc, "device": device, "strategy": dims.strategy, **choice.parallel}
    parallel = dataclasses.replace(cfg.parallel, **resolved)
    return dataclasses.replace(cfg, parallel=parallel), choice


def choose_strategy(cfg: JobConfig, nproc: int, nnodes: int, device: str) -> StrategyChoice:
    """'auto' from the memory plan; a forced strategy is checked against it (ConfigError unless it fits
    or ``parallel.force``). A model the planner cannot profile keeps a forced strategy, with a warning."""
    if cfg.checkpoint.create_seed:
        return StrategyChoice("single", "seed checkpoint: one process")
    layout = Layout(
        nproc,
        nnodes,
        resolve_device_memory(cfg.parallel.device_memory, device, nproc),
        cfg.parallel.memory_headroom,
    )
    try:
        est = plan_job(cfg, layout, cross_entropy)
    except ConfigError as e:
        if cfg.parallel.strategy == "auto" or (isinstance(e, MetaDeviceError) and cfg.parallel.strategy in SHARDED):
            raise
        print(f"disttrain: warning: no memory plan ({e})", file=sys.stderr)
        return StrategyChoice(resolve_strategy(cfg.parallel.strategy, nproc * nnodes), "forced; no memory plan")
    strategy, reason, tuned = decide(cfg, est)
    return StrategyChoice(strategy, reason, render(est), est.to_json(), tuned)
