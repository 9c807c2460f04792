"""ParallelDims: the data-parallel layout (replicate x shard degrees), validated once; builds the DeviceMesh.

Callers ask ``dims.fsdp_enabled`` / ``dims.dp_size`` / ``dims.shard``; nobody else redoes the arithmetic
(after torchtitan's ``distributed/parallel_dims.py``). Every rank sees different data (``dp_size`` is the
world size); what differs between strategies is how parameters, gradients and optimizer state are spread:
DDP replicates them on every rank, FSDP shards them over all ranks, HSDP shards them within a group of
``shard`` ranks (a node, by default) and replicates the groups (``replicate`` of them).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from torch.distributed.device_mesh import DeviceMesh, init_device_mesh

from disttrain.config import ParallelConfig
from disttrain.errors import ConfigError
from disttrain.parallel.env import init_single_process_group

STRATEGIES = ("single", "ddp", "fsdp", "hsdp")
SHARDED = ("fsdp", "hsdp")
"""Strategies that shard parameters (the model is built on the meta device for them)."""


@dataclass
class ParallelDims:
    """``strategy`` over ``world_size`` ranks. ``replicate`` / ``shard`` may be -1 ("the rest"); after
    construction both are resolved: single/ddp = (world, 1)-like replication, fsdp = (1, world), hsdp =
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
        :func:`resolve_strategy`) with ``parallel.replicate`` / ``parallel.shard``."""
        chosen = resolve_strategy(strategy or parallel.strategy, world_size)
        return cls(chosen, world_size, parallel.replicate, parallel.shard, local_world_size=local_world_size)

    def __post_init__(self) -> None:
        s, w = self.strategy, self.world_size
        if s not in STRATEGIES:
            raise ConfigError(f"strategy must be one of {STRATEGIES}, got {s!r}")
        if s == "single" and w != 1:
            raise ConfigError(
                f"strategy 'single' runs one process, but the world size is {w}; "
                "use --parallel.strategy ddp or fsdp, or --parallel.nproc 1"
            )
        if s == "fsdp" and self.replicate > 1:
            s = self.strategy = "hsdp"  # fsdp with replica groups is HSDP (the name before HSDP had its own)
        if s in ("single", "ddp"):
            if self.replicate not in (-1, 1, w) or self.shard not in (-1, 1):
                raise ConfigError(
                    f"parallel.replicate/shard ({self.replicate} x {self.shard}) apply to fsdp/hsdp, not {s!r}; "
                    "leave them at -1 or use --parallel.strategy hsdp"
                )
            self.replicate, self.shard = w, 1
            return
        if s == "fsdp":
            if self.shard not in (-1, w):
                raise ConfigError(
                    f"FSDP shards over all {w} ranks, but parallel.shard is {self.shard}; "
                    "use --parallel.strategy hsdp to shard within groups, or leave shard at -1"
                )
            self.replicate, self.shard = 1, w
            return
        self.replicate, self.shard = self._hsdp_degrees()

    def _hsdp_degrees(self) -> tuple[int, int]:
        w, r, sh = self.world_size, self.replicate, self.shard
        if r == -1 and sh == -1:
            sh = self.local_world_size or w
        hint = f"degrees that divide {w}: {', '.join(str(d) for d in range(1, w + 1) if w % d == 0)}"
        for name, v in (("replicate", r), ("shard", sh)):
            if v != -1 and w % v:
                raise ConfigError(f"parallel.{name} ({v}) must divide the world size ({w}); {hint}")
        if r == -1:
            r = w // sh
        if sh == -1:
            sh = w // r
        if r * sh != w:
            raise ConfigError(
                f"parallel.replicate ({r}) x parallel.shard ({sh}) = {r * sh}, but the world size is {w}; "
                f"set them so the product is {w}, or one of them to -1 (the rest)"
            )
        return r, sh

    @property
    def dp_size(self) -> int:
        """Ranks that see different data (every rank, for pure data parallelism)."""
        return self.world_size

    @property
    def fsdp_enabled(self) -> bool:
        """Parameters are sharded (FSDP or HSDP)."""
        return self.strategy in SHARDED

    @property
    def hsdp_enabled(self) -> bool:
        return self.strategy == "hsdp"

    @property
    def ddp_enabled(self) -> bool:
        return self.strategy == "ddp"

    def describe(self) -> str:
        if self.hsdp_enabled:
            return f"hsdp ({self.replicate} replicas x {self.shard} shards)"
        return self.strategy

    def mesh(self, device_type: str) -> DeviceMesh:
        """The DeviceMesh, built on first use: 1-D ('dp',) or 2-D ('replicate', 'shard') for HSDP."""
        if self._mesh is None:
            if self.world_size == 1:
                init_single_process_group(device_type)  # FSDP on one device (e.g. to offload to host memory)
            if self.hsdp_enabled:
                self._mesh = init_device_mesh(
                    device_type, (self.replicate, self.shard), mesh_dim_names=("replicate", "shard")
                )
            else:
                self._mesh = init_device_mesh(device_type, (self.world_size,), mesh_dim_names=("dp",))
        return self._mesh


def resolve_strategy(strategy: str, world_size: int) -> str:
    """'auto' without a memory plan -> ddp over several ranks, single alone (``disttrain run`` and the
    Trainer decide 'auto' from the plan instead: :func:`disttrain.plan.estimate.recommend`)."""
    if strategy == "auto":
        return "ddp" if world_size > 1 else "single"
    return strategy
