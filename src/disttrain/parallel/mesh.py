"""ParallelDims: the parallel layout (replicate x shard x tp degrees), validated once; builds the DeviceMesh.

Callers ask ``dims.impl`` (the :class:`Strategy`), ``dims.dp_size``, ``dims.dp_rank(rank)``, ``dims.shard``,
``dims.tp``; nobody else redoes the arithmetic (after torchtitan's ``distributed/parallel_dims.py``). The ranks
of one tensor-parallel group (``tp`` adjacent ranks: the innermost mesh dimension) see the same data; the
``dp_size = world / tp`` groups see different data. What differs between data-parallel strategies is how
parameters, gradients and optimizer state are spread over the groups: DDP replicates them, FSDP shards them
over all groups, HSDP shards them within ``shard`` groups (a node, by default) and replicates those
(``replicate`` of them).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from torch.distributed.device_mesh import DeviceMesh, init_device_mesh

from disttrain.config import ParallelConfig, ResolvedJob
from disttrain.errors import ConfigError
from disttrain.parallel import strategies
from disttrain.parallel.strategies import Strategy


@dataclass
class ParallelDims:
    """``strategy`` over ``world_size`` ranks. ``replicate`` / ``shard`` may be -1 ("the rest"); after
    construction both are resolved by the strategy: single/ddp = (world, 1), fsdp = (1, world), hsdp =
    (world / shard, shard) with ``shard`` defaulting to ``local_world_size`` (the ranks of one node); with
    ``tp`` > 1 the same over ``world / tp`` data-parallel groups (``tp`` must divide the world size)."""

    strategy: str
    world_size: int
    replicate: int = -1
    shard: int = -1
    local_world_size: int | None = None
    tp: int = 1
    _mesh: DeviceMesh | None = field(default=None, init=False, repr=False)
    _world_mesh: DeviceMesh | None = field(default=None, init=False, repr=False)

    @classmethod
    def from_config(
        cls, parallel: ParallelConfig, world_size: int, local_world_size: int | None = None, strategy: str | None = None
    ) -> ParallelDims:
        """The job's layout: ``strategy`` (default: ``parallel.strategy``, 'auto' resolved without a plan by
        :func:`~disttrain.parallel.strategies.resolve_name`) with ``parallel.replicate`` / ``parallel.shard``."""
        tp = parallel.tp
        check_tp(tp, world_size)
        chosen = strategies.resolve_name(strategy or parallel.strategy, world_size // tp, tp)
        return cls(chosen, world_size, parallel.replicate, parallel.shard, local_world_size=local_world_size, tp=tp)

    @classmethod
    def of(cls, job: ResolvedJob) -> ParallelDims:
        """The layout a resolved job decided, as it is (nothing re-derived)."""
        tp = job.config.parallel.tp
        return cls(job.strategy, job.world_size, job.replicate, job.shard, local_world_size=job.nproc, tp=tp)

    def __post_init__(self) -> None:
        check_tp(self.tp, self.world_size)
        self.strategy = strategies.get(self.strategy).canonical(self.replicate)
        local_dp = None if self.local_world_size is None else max(self.local_world_size // self.tp, 1)
        self.replicate, self.shard = self.impl.degrees(self.dp_size, self.replicate, self.shard, local_dp)
        self.impl.check_tp(self.dp_size, self.tp)

    @property
    def impl(self) -> Strategy:
        """The strategy object that wraps, syncs, casts and clips for this layout."""
        return strategies.get(self.strategy)

    @property
    def dp_size(self) -> int:
        """Groups of ranks that see different data (every rank, for pure data parallelism; world / tp)."""
        return self.world_size // self.tp

    def dp_rank(self, rank: int) -> int:
        """The data-parallel group of global ``rank`` (TP is the innermost mesh dimension: adjacent ranks)."""
        return rank // self.tp

    @property
    def tp_enabled(self) -> bool:
        return self.tp > 1

    @property
    def fsdp_enabled(self) -> bool:
        """Parameters are sharded (FSDP or HSDP)."""
        return self.impl.shards_parameters

    def describe(self) -> str:
        out = self.strategy
        if self.replicate > 1 and self.impl.shards_parameters:
            out = f"{self.strategy} ({self.replicate} replicas x {self.shard} shards)"
        return f"{out} x tp {self.tp}" if self.tp > 1 else out

    def mesh(self, device_type: str) -> DeviceMesh:
        """The data-parallel DeviceMesh, built on first use: 1-D ('dp',) or 2-D ('replicate', 'shard') for HSDP;
        with tp > 1, those dimensions of :meth:`world_mesh`."""
        if self._mesh is None:
            if self.tp > 1:
                names = self.impl.mesh_layout(self)[1]
                mesh: DeviceMesh | None = self.world_mesh(device_type)[names if len(names) > 1 else names[0]]
            else:
                mesh = self.impl.mesh(self, device_type)
            if mesh is None:
                raise ConfigError(f"strategy {self.strategy!r} shards over no mesh")
            self._mesh = mesh
        return self._mesh

    def world_mesh(self, device_type: str) -> DeviceMesh:
        """Every dimension, TP innermost: ('dp', 'tp') or ('replicate', 'shard', 'tp') (as torchtitan lays them)."""
        if self._world_mesh is None:
            shape, names = self.impl.mesh_layout(self)
            self._world_mesh = init_device_mesh(device_type, (*shape, self.tp), mesh_dim_names=(*names, "tp"))
        return self._world_mesh

    def tp_mesh(self, device_type: str) -> DeviceMesh:
        """The 1-D mesh of this rank's tensor-parallel group."""
        return self.world_mesh(device_type)["tp"]


def check_tp(tp: int, world_size: int) -> None:
    """``tp`` divides the world size, or a ConfigError naming both and the degrees that would."""
    if tp < 1 or world_size % tp:
        fits = ", ".join(str(d) for d in range(1, world_size + 1) if world_size % d == 0)
        raise ConfigError(
            f"parallel.tp ({tp}) must divide the world size ({world_size}); use one of {fits}, "
            f"or change --parallel.nproc to a multiple of {tp}"
        )
