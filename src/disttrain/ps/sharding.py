"""Which server owns which rows of a table: ``id mod S`` (spreads hot ids) or contiguous ranges.

A :class:`RowSharding` routes a batch's (deduplicated) ids to servers and back: :meth:`split` gives, per
server, the local row indices to ask for and where the answers go in the batch.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from disttrain.errors import ConfigError

SCHEMES = ("mod", "range")


@dataclass(frozen=True)
class RowSharding:
    rows: int
    servers: int
    scheme: str = "mod"

    def __post_init__(self) -> None:
        if self.rows < 1 or self.servers < 1:
            raise ConfigError(f"a sharded table needs rows >= 1 and servers >= 1, got {self.rows} and {self.servers}")
        if self.scheme not in SCHEMES:
            raise ConfigError(f"ps.sharding must be one of {', '.join(SCHEMES)}, got {self.scheme!r}")
        if self.servers > self.rows:
            raise ConfigError(f"{self.servers} servers for a table of {self.rows} rows: use at most {self.rows}")

    @property
    def _block(self) -> int:
        return -(-self.rows // self.servers)  # ceil: range shards are this long, the last one shorter

    def owner(self, ids: torch.Tensor) -> torch.Tensor:
        """The server of each id."""
        return ids % self.servers if self.scheme == "mod" else ids // self._block

    def local(self, ids: torch.Tensor) -> torch.Tensor:
        """Each id's row index inside its server's shard."""
        return ids // self.servers if self.scheme == "mod" else ids % self._block

    def shard_rows(self, server: int) -> int:
        """How many rows server ``server`` holds."""
        if self.scheme == "mod":
            return len(range(server, self.rows, self.servers))
        return max(0, min(self.rows, (server + 1) * self._block) - server * self._block)

    def global_ids(self, server: int) -> torch.Tensor:
        """The global ids of server ``server``'s rows, in its local order."""
        local = torch.arange(self.shard_rows(server))
        return local * self.servers + server if self.scheme == "mod" else local + server * self._block

    def split(self, ids: torch.Tensor) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """Per server: (positions in ``ids``, local row indices) of the ids it owns."""
        low, high = torch.aminmax(ids) if ids.numel() else (torch.tensor(0), torch.tensor(0))
        if int(low) < 0 or int(high) >= self.rows:
            bad = ids[(ids < 0) | (ids >= self.rows)][0]
            raise ConfigError(f"id {int(bad)} is outside the table's {self.rows} rows (hash ids into range first)")
        owner, local = self.owner(ids), self.local(ids)
        out = []
        for s in range(self.servers):
            pos = (owner == s).nonzero(as_tuple=True)[0]
            out.append((pos, local[pos]))
        return out
