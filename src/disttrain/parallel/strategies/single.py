"""``single``: one process, the model as it is."""

from __future__ import annotations

from disttrain.errors import ConfigError
from disttrain.parallel.strategies.base import Strategy


class Single(Strategy):
    name = "single"
    alone = True

    def degrees(self, world: int, replicate: int, shard: int, local_world: int | None) -> tuple[int, int]:
        if world != 1:
            raise ConfigError(
                f"strategy 'single' runs one process (one tensor-parallel group with --parallel.tp), but the "
                f"data-parallel size is {world}; use --parallel.strategy ddp or fsdp, or --parallel.nproc 1"
            )
        return super().degrees(world, replicate, shard, local_world)
