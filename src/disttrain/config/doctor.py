"""``disttrain doctor``'s job: what it checks, over how many local processes and nodes."""

from __future__ import annotations

import dataclasses

from disttrain.config.parallel import LaunchConfig
from disttrain.config.values import check


@dataclasses.dataclass
class DoctorConfig:
    """What doctor checks beyond versions, devices and backends."""

    nproc: int | None = None
    """Local processes for the multi-process checks (default: the GPUs here, or 2 on CPU)."""
    port: int | None = None
    """Check that this port is free (default: the rendezvous endpoint's, or MASTER_PORT's)."""
    quick: bool = False
    """Skip the multi-process checks (bandwidth, the link figures the planner caches, RPC)."""

    def __post_init__(self) -> None:
        check(self.nproc is None or self.nproc >= 1, f"doctor.nproc must be >= 1, got {self.nproc}")
        check(self.port is None or 0 < self.port < 65536, f"doctor.port must be in 1..65535, got {self.port}")


@dataclasses.dataclass
class DoctorJobConfig:
    """Is this machine (or cluster) ready to train? Across nodes, run it on each with the same
    ``--launch.rdzv-endpoint`` and its own ``--launch.node-rank``."""

    doctor: DoctorConfig = dataclasses.field(default_factory=DoctorConfig)
    launch: LaunchConfig = dataclasses.field(default_factory=LaunchConfig)
