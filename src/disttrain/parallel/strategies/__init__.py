"""The strategy registry: one :class:`Strategy` object per name, what a config's strategy name means in degrees
(:func:`dims_for`, the one place a name becomes a :class:`~disttrain.parallel.mesh.ParallelDims`), which strategy
carries out a layout (:func:`for_dims`: from its degrees), and the plan's columns (a strategy with the options
the plan compares: FSDP without reshard, FSDP with offload).

This is the one place strategy names are looked up; everywhere else holds a :class:`Strategy` (or a
:class:`PlanColumn`, or a ``ParallelDims``) and asks it. ``single``, ``ddp``, ``fsdp``, ``hsdp``: one module each.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from disttrain.errors import ConfigError
from disttrain.parallel.mesh import ParallelDims, check_pp, check_tp
from disttrain.parallel.strategies.base import Strategy, WrapSettings
from disttrain.parallel.strategies.ddp import DDP
from disttrain.parallel.strategies.fsdp import FSDP
from disttrain.parallel.strategies.hsdp import HSDP
from disttrain.parallel.strategies.single import Single

if TYPE_CHECKING:
    from disttrain.config import ParallelConfig, ResolvedJob

STRATEGIES: dict[str, Strategy] = {s.name: s for s in (Single(), DDP(), FSDP(), HSDP())}
"""Every strategy, simplest first (the order a tie in the plan is broken in)."""
NAMES = tuple(STRATEGIES)
SHARDED = tuple(name for name, s in STRATEGIES.items() if s.shards_parameters)
"""Strategies that shard parameters (the model is built on the meta device for them)."""


def get(name: str) -> Strategy:
    """The strategy called ``name``, or a ConfigError listing the names there are."""
    try:
        return STRATEGIES[name]
    except KeyError:
        raise ConfigError(f"strategy must be one of {NAMES} (or auto), got {name!r}") from None


def resolve_name(name: str, world_size: int, tp: int = 1, pp: int = 1) -> str:
    """'auto' without a memory plan: ddp over several data-parallel ranks (fsdp with tensor or pipeline
    parallelism, which DDP does not compose with), single alone (``disttrain run`` and the Trainer decide 'auto'
    from the plan instead: :func:`disttrain.plan.choose.decide`). ``world_size`` counts data-parallel ranks
    (world / (tp x pp))."""
    if name == "auto":
        if world_size == 1:
            return "single"
        return "fsdp" if tp > 1 or pp > 1 else "ddp"
    return get(name).name


def dims_for(
    name: str,
    world_size: int,
    replicate: int = -1,
    shard: int = -1,
    local_world_size: int | None = None,
    tp: int = 1,
    pp: int = 1,
) -> ParallelDims:
    """The degrees strategy ``name`` (not 'auto') with the config's ``replicate`` / ``shard`` (-1: the rest) means
    over ``world_size`` ranks in data-parallel groups of ``tp`` (``pp`` such groups per pipeline): single/ddp
    replicate over the ``world / (tp x pp)`` groups, fsdp shards over them, hsdp shards within ``shard`` of them
    (a node's, by default) and replicates across; a ConfigError naming the degrees and the fix where they do not fit."""
    check_tp(tp, world_size)
    check_pp(pp, world_size // tp)
    dp = world_size // (tp * pp)
    chosen = get(get(name).canonical(replicate))
    local_dp = None if local_world_size is None else max(local_world_size // tp, 1)
    dp_replicate, dp_shard = chosen.degrees(dp, replicate, shard, local_dp)
    chosen.check_tp(dp, tp)
    return ParallelDims(world_size, dp_replicate, dp_shard, tp, pp, fsdp=chosen.shards_parameters)


def dims_from_config(
    parallel: ParallelConfig, world_size: int, local_world_size: int | None = None, strategy: str | None = None
) -> ParallelDims:
    """The layout of ``parallel`` over ``world_size`` ranks: ``strategy`` (default: ``parallel.strategy``,
    'auto' decided without a plan by :func:`resolve_name`) with ``parallel.replicate`` / ``parallel.shard``."""
    tp, pp = parallel.tp, parallel.pp
    check_tp(tp, world_size)
    check_pp(pp, world_size // tp)
    chosen = resolve_name(strategy or parallel.strategy, world_size // (tp * pp), tp, pp)
    return dims_for(chosen, world_size, parallel.replicate, parallel.shard, local_world_size, tp, pp)


def dims_of(job: ResolvedJob) -> ParallelDims:
    """The layout a resolved job decided: its strategy and degrees as they are (an elastic job at another size,
    :meth:`~disttrain.config.ResolvedJob.at_world`, has the user's -1s back, filled in here)."""
    par = job.config.parallel
    return dims_for(job.strategy, job.world_size, job.replicate, job.shard, job.nproc, par.tp, par.pp)


def for_dims(dims: ParallelDims) -> Strategy:
    """The strategy that carries out ``dims``: HSDP where parameters are sharded and replicated, FSDP where they
    are sharded, DDP where whole copies are replicated, single otherwise (one data-parallel group)."""
    if dims.fsdp_enabled:
        return STRATEGIES["hsdp"] if dims.dp_replicate > 1 else STRATEGIES["fsdp"]
    return STRATEGIES["ddp"] if dims.dp_replicate > 1 else STRATEGIES["single"]


@dataclass(frozen=True)
class PlanColumn:
    """One column of the memory and step-time plan: a strategy with the options that change its figures."""

    key: str
    strategy: Strategy
    reshard: bool = True
    """Parameters are freed after forward and gathered again in backward (FSDP's default)."""
    offload: bool = False
    """Sharded state lives in host memory."""
    label: str = ""

    @property
    def sharded(self) -> bool:
        return self.strategy.shards_parameters

    def shard_degree(self, nproc: int, nnodes: int) -> int:
        return self.strategy.state_ranks(nproc, nnodes)

    def distinct_at(self, nproc: int, nnodes: int) -> bool:
        """This column means something of its own at this layout (HSDP only across nodes of several ranks)."""
        return not self.strategy.across_nodes_only or (nnodes > 1 and nproc > 1)


COLUMNS: dict[str, PlanColumn] = {
    c.key: c
    for c in (
        PlanColumn("ddp", STRATEGIES["ddp"], label="DDP"),
        PlanColumn("fsdp", STRATEGIES["fsdp"], label="FSDP"),
        PlanColumn("fsdp_no_reshard", STRATEGIES["fsdp"], reshard=False, label="FSDP no-reshard"),
        PlanColumn("hsdp", STRATEGIES["hsdp"], label="HSDP"),
        PlanColumn("fsdp_offload", STRATEGIES["fsdp"], offload=True, label="FSDP+offload"),
    )
}
SHARDED_COLUMNS = tuple(k for k, c in COLUMNS.items() if c.sharded)
LABELS = {key: column.label for key, column in COLUMNS.items()}
"""Each plan column's name in tables and messages."""


def label(column: str, tp: int = 1) -> str:
    """A plan column's name, with the tensor-parallel degree when there is one: ``FSDP x tp 2``."""
    return f"{LABELS[column]} x tp {tp}" if tp > 1 else LABELS[column]


def column_for(strategy: str, reshard_after_forward: str, offload: bool) -> PlanColumn:
    """The plan column a strategy runs as, with these settings."""
    s = get(strategy)
    if not s.shards_parameters:
        return COLUMNS["ddp"]
    if offload:
        return COLUMNS["fsdp_offload"]
    if s is STRATEGIES["hsdp"]:
        return COLUMNS["hsdp"]
    return COLUMNS["fsdp_no_reshard" if reshard_after_forward == "never" else "fsdp"]


__all__ = [
    "COLUMNS",
    "LABELS",
    "NAMES",
    "SHARDED",
    "SHARDED_COLUMNS",
    "STRATEGIES",
    "PlanColumn",
    "Strategy",
    "WrapSettings",
    "column_for",
    "dims_for",
    "dims_from_config",
    "dims_of",
    "for_dims",
    "get",
    "label",
    "resolve_name",
]
