"""ParallelDims: the data-parallel layout (replicate x shard degrees), validated once; builds the DeviceMesh.

Callers ask ``dims.impl`` (the :class:`Strategy`), ``dims.dp_size``, ``dims.shard``; nobody else redoes the arithmetic
(after torchtitan's ``distributed/parallel_dims.py``). Every rank sees different data (``dp_size`` is the
world size); what differs between strategies is how parameters, gradients and optimizer state are spread:
DDP replicates them on every rank, FSDP shards them over all ranks, HSDP shards them within a group of
``shard`` ranks (a node, by default) and replicates the groups (``replicate`` of them).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from torch.distributed.device_mesh import DeviceMesh

from disttrain.config import ParallelConfig, ResolvedJob
from disttrain.errors import ConfigError
from disttrain.parallel import strategies
from disttrain.parallel.strategies import Strategy


@dataclass
class ParallelDims:
    """``strategy`` over ``world_size`` ranks. ``replicate`` / ``shard`` may be -1 ("the rest"); after
    construction both are resolved by the strategy: single/ddp = (world, 1), fsdp = (1, world), hsdp =
    (world / shard, shard) with ``shard`` defaulting to ``local_world_size`` (the ranks of one node)."""

    strategy: str
    world_size: int
    replicate: int = -1
    shard: int = -1
    local_world_size: int | None = None
    _mesh: DeviceMesh | None = field(default=None, init=False, repr=False)

    @classmethod
    def from_config(
        cls, parallel: ParallelConfig, world_size: int, local_world_size: int | None = None, strategy: str | None = None
    ) -> ParallelDims:
        """The job's layout: ``strategy`` (default: ``parallel.strategy``, 'auto' resolved without a plan by
        :func:`~disttrain.parallel.strategies.resolve_name`) with ``parallel.replicate`` / ``parallel.shard``."""
        chosen = strategies.resolve_name(strategy or parallel.strategy, world_size)
        return cls(chosen, world_size, parallel.replicate, parallel.shard, local_world_size=local_world_size)

    @classmethod
    def of(cls, job: ResolvedJob) -> ParallelDims:
        """The layout a resolved job decided, as it is (nothing re-derived)."""
        return cls(job.strategy, job.world_size, job.replicate, job.shard, local_world_size=job.nproc)

    def __post_init__(self) -> None:
        self.strategy = strategies.get(self.strategy).canonical(self.replicate)
        self.replicate, self.shard = self.impl.degrees(
            self.world_size, self.replicate, self.shard, self.local_world_size
        )

    @property
    def impl(self) -> Strategy:
        """The strategy object that wraps, syncs, casts and clips for this layout."""
        return strategies.get(self.strategy)

    @property
    def dp_size(self) -> int:
        """Ranks that see different data (every rank, for pure data parallelism)."""
        return self.world_size

    @property
    def fsdp_enabled(self) -> bool:
        """Parameters are sharded (FSDP or HSDP)."""
        return self.impl.shards_parameters

    def describe(self) -> str:
        if self.replicate > 1 and self.impl.shards_parameters:
            return f"{self.strategy} ({self.replicate} replicas x {self.shard} shards)"
        return self.strategy

    def mesh(self, device_type: str) -> DeviceMesh:
        """The DeviceMesh, built on first use: 1-D ('dp',) or 2-D ('replicate', 'shard') for HSDP."""
        if self._mesh is None:
            mesh = self.impl.mesh(self, device_type)
            if mesh is None:
                raise ConfigError(f"strategy {self.strategy!r} shards over no mesh")
            self._mesh = mesh
        return self._mesh
