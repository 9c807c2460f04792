"""ParallelDims: the data-parallel layout (replicate x shard degrees), validated once; builds the DeviceMesh.

Callers ask ``dims.fsdp_enabled`` / ``dims.dp_size``; nobody else redoes the arithmetic
(after torchtitan's ``distributed/parallel_dims.py``).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from torch.distributed.device_mesh import DeviceMesh, init_device_mesh

from disttrain.config import ConfigError

STRATEGIES = ("single", "ddp", "fsdp")


@dataclass
class ParallelDims:
    """``strategy`` over ``world_size`` ranks; FSDP meshes are (replicate x shard)."""

    strategy: str
    world_size: int
    replicate: int = 1
    _mesh: DeviceMesh | None = field(default=None, init=False, repr=False)

    def __post_init__(self) -> None:
        if self.strategy not in STRATEGIES:
            raise ConfigError(f"strategy must be one of {STRATEGIES}, got {self.strategy!r}")
        if self.strategy == "single" and self.world_size != 1:
            raise ConfigError(
                f"strategy 'single' runs one process, but the world size is {self.world_size}; "
                "use --parallel.strategy ddp or fsdp, or --parallel.nproc 1"
            )
        if self.world_size % self.replicate:
            raise ConfigError(
                f"parallel.replicate ({self.replicate}) must divide the world size ({self.world_size})"
            )
        if self.replicate > 1 and self.strategy != "fsdp":
            raise ConfigError(f"parallel.replicate > 1 needs strategy 'fsdp', got {self.strategy!r}")

    @property
    def shard(self) -> int:
        return self.world_size // self.replicate if self.fsdp_enabled else 1

    @property
    def dp_size(self) -> int:
        """Ranks that see different data (every rank, for pure data parallelism)."""
        return self.world_size

    @property
    def fsdp_enabled(self) -> bool:
        return self.strategy == "fsdp"

    @property
    def ddp_enabled(self) -> bool:
        return self.strategy == "ddp"

    def mesh(self, device_type: str) -> DeviceMesh:
        """The DeviceMesh, built on first use: 1-D ('shard',) or 2-D ('replicate', 'shard')."""
        if self._mesh is None:
            if self.replicate > 1:
                self._mesh = init_device_mesh(
                    device_type, (self.replicate, self.shard), mesh_dim_names=("replicate", "shard")
                )
            else:
                self._mesh = init_device_mesh(device_type, (self.world_size,), mesh_dim_names=("dp",))
        return self._mesh
