"""The strategy registry: one :class:`Strategy` object per name, and the plan's columns (a strategy with the
options the plan compares: FSDP without reshard, FSDP with offload).

This is the one place strategy names are looked up; everywhere else holds a :class:`Strategy` (or a
:class:`PlanColumn`) and asks it. ``single``, ``ddp``, ``fsdp``, ``hsdp``: one module each.
"""

from __future__ import annotations

from dataclasses import dataclass

from disttrain.errors import ConfigError
from disttrain.parallel.strategies.base import Strategy, WrapSettings
from disttrain.parallel.strategies.ddp import DDP
from disttrain.parallel.strategies.fsdp import FSDP
from disttrain.parallel.strategies.hsdp import HSDP
from disttrain.parallel.strategies.single import Single

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


def resolve_name(name: str, world_size: int, tp: int = 1) -> str:
    """'auto' without a memory plan: ddp over several data-parallel ranks (fsdp with tensor parallelism, which
    DDP does not compose with), single alone (``disttrain run`` and the Trainer decide 'auto' from the plan
    instead: :func:`disttrain.plan.choose.decide`). ``world_size`` counts data-parallel ranks (world / tp)."""
    if name == "auto":
        if world_size == 1:
            return "single"
        return "fsdp" if tp > 1 else "ddp"
    return get(name).name


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
    "NAMES",
    "SHARDED",
    "SHARDED_COLUMNS",
    "STRATEGIES",
    "PlanColumn",
    "Strategy",
    "WrapSettings",
    "column_for",
    "get",
    "resolve_name",
]
