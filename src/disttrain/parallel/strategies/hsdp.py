"""``hsdp``: FSDP2 within groups of ``shard`` ranks (a node, by default), replicated across the groups."""

from __future__ import annotations

from disttrain.errors import ConfigError
from disttrain.parallel.strategies.fsdp import FSDP


class HSDP(FSDP):
    name = "hsdp"
    across_nodes_only = True

    def canonical(self, replicate: int) -> str:
        return self.name

    def degrees(self, world: int, replicate: int, shard: int, local_world: int | None) -> tuple[int, int]:
        r, sh = replicate, shard
        if r == -1 and sh == -1:
            sh = local_world or world
        hint = f"degrees that divide {world}: {', '.join(str(d) for d in range(1, world + 1) if world % d == 0)}"
        for name, v in (("replicate", r), ("shard", sh)):
            if v != -1 and world % v:
                raise ConfigError(f"parallel.{name} ({v}) must divide the world size ({world}); {hint}")
        if r == -1:
            r = world // sh
        if sh == -1:
            sh = world // r
        if r * sh != world:
            raise ConfigError(
                f"parallel.replicate ({r}) x parallel.shard ({sh}) = {r * sh}, but the world size is {world}; "
                f"set them so the product is {world}, or one of them to -1 (the rest)"
            )
        return r, sh

    def state_ranks(self, nproc: int, nnodes: int) -> int:
        return nproc  # sharded within a node, replicated across nodes
