"""A trainer's view of sharded tables: :class:`TableClient` creates (and gathers) one table; :class:`TableGroup`
pulls the rows a batch needs from all tables and pushes their gradients back.

Ids are deduplicated before they travel (hot ids appear many times in a batch), split by owner, and sent to
all servers at once (one async call per server for every table); the answers are scattered back into batch order.
"""

from __future__ import annotations

from typing import Any

import torch

from disttrain.ps import exchange as step_exchange
from disttrain.ps import server
from disttrain.ps.sharding import RowSharding
from disttrain.rpc import transport


class TableClient:
    """Table ``name`` of ``rows`` x ``dim``, sharded over the workers ``servers`` by ``sharding``."""

    def __init__(self, name: str, rows: int, dim: int, servers: list[str], scheme: str = "mod") -> None:
        self.name, self.dim, self.servers = name, dim, servers
        self.sharding = RowSharding(rows, len(servers), scheme)

    def create(self, **options: Any) -> None:
        """Create every server's shard (rows initialised from their global ids: any sharding starts equal)."""
        futs = [self.create_shard(k, **options) for k in range(len(self.servers))]
        for s, f in zip(self.servers, futs, strict=True):
            transport.wait(f, s, server.create)

    def create_shard(self, k: int, **options: Any) -> Any:
        """Start creating shard ``k`` on the process that holds it now; a Future."""
        return transport.call_async(
            self.servers[k], server.create, self.name, self.sharding.global_ids(k), self.dim, options
        )

    def full(self) -> torch.Tensor:
        """The whole table gathered from the servers (tests, checkpoints of small tables)."""
        out = torch.empty(self.sharding.rows, self.dim)
        for i, s in enumerate(self.servers):
            out[self.sharding.global_ids(i)] = transport.call(s, server.state, self.name)["weight"]
        return out


Split = tuple[torch.Tensor, torch.Tensor, list[tuple[torch.Tensor, torch.Tensor]]]
Routes = list[list[tuple[torch.Tensor, torch.Tensor]]]
"""Per table, per server: (positions among the table's ids, the server's local rows) (:meth:`RowSharding.split`)."""
"""One table's part of a batch: distinct ids, each column id's index among them, per-server (positions, rows)."""


class TableGroup:
    """All of a model's tables on the same servers: one pull and one push call per server and step, for
    every table at once (instead of one per table and server)."""

    def __init__(self, tables: list[TableClient]) -> None:
        self.tables = tables
        self.servers = tables[0].servers
        self.names = [t.name for t in tables]
        self.bytes_moved = 0
        self._last: tuple[torch.Tensor, list[Split]] | None = None

    def _split(self, ids: torch.Tensor) -> list[Split]:
        """Per table: (distinct ids, where each id of the column is among them, per-server parts); the
        split of the last pull is kept for the push of the same ids."""
        if self._last is not None and self._last[0] is ids:
            return self._last[1]
        out = []
        for i, t in enumerate(self.tables):
            uniq, inverse = torch.unique(ids[:, i], return_inverse=True)
            out.append((uniq, inverse, t.sharding.split(uniq)))
        self._last = (ids, out)
        return out

    def pull(self, ids: torch.Tensor) -> torch.Tensor:
        """(batch, tables) ids -> (batch, tables, dim) rows."""
        split = self._split(ids)
        futs = []
        for k, s in enumerate(self.servers):
            local = [parts[k][1] for _, _, parts in split]
            futs.append(
                transport.call_async(s, server.pull_many, self.names, torch.cat(local), [len(r) for r in local])
            )
        rows = [torch.empty(len(uniq), t.dim) for (uniq, _, _), t in zip(split, self.tables, strict=True)]
        for k, (s, f) in enumerate(zip(self.servers, futs, strict=True)):
            got = transport.wait(f, s, server.pull_many).split([len(parts[k][1]) for _, _, parts in split])
            for i, g in enumerate(got):
                rows[i][split[i][2][k][0]] = g
        self.bytes_moved += sum(u.numel() * 8 + r.numel() * 4 for (u, _, _), r in zip(split, rows, strict=True))
        return torch.stack([r[inv] for r, (_, inv, _) in zip(rows, split, strict=True)], dim=1)

    def push(
        self,
        ids: torch.Tensor,
        grads: torch.Tensor,
        combine: bool = True,
    ) -> Any:
        """(batch, tables, dim) gradients of the rows :meth:`pull` gave, summed per distinct id of each table,
        applied as they arrive (ssp / asp; ``combine``: with the other pushes that arrive meanwhile; bsp steps
        go through :meth:`exchange`). Server 0's answer."""
        split = self._split(ids)
        summed = [
            torch.zeros(len(uniq), t.dim).index_add_(0, inv, grads[:, i])
            for i, ((uniq, inv, _), t) in enumerate(zip(split, self.tables, strict=True))
        ]
        fn = server.push_many
        futs = []
        for k, s in enumerate(self.servers):
            local = [parts[k][1] for _, _, parts in split]
            part_grads = torch.cat([g[parts[k][0]] for g, (_, _, parts) in zip(summed, split, strict=True)])
            counts = [len(r) for r in local]
            futs.append(transport.call_async(s, fn, self.names, torch.cat(local), part_grads, counts, combine))
        answers = [transport.wait(f, s, fn) for s, f in zip(self.servers, futs, strict=True)]
        self.bytes_moved += sum(u.numel() * 8 + g.numel() * 4 for (u, _, _), g in zip(split, summed, strict=True))
        return answers[0]

    def use_servers(self, servers: list[str]) -> None:
        """The processes that hold the shards now (a spare in a dead server's place)."""
        self.servers = servers
        for t in self.tables:
            t.servers = servers

    def route(self, ids: list[torch.Tensor]) -> Routes:
        """Per table, per server: (positions in the table's ``ids``, local rows) of distinct ids."""
        return [t.sharding.split(i) for t, i in zip(self.tables, ids, strict=True)]

    def exchange(
        self,
        push_ids: list[torch.Tensor],
        push_grads: list[torch.Tensor],
        pull_ids: list[torch.Tensor],
        step: tuple[int, int, int, float],
        dense_grad: torch.Tensor | None = None,
        epoch: int = 0,
        push_routes: Routes | None = None,
        seq: int = 0,
    ) -> PendingStep:
        """BSP's one message per server for a step (:mod:`disttrain.ps.exchange`): per table, the distinct
        ``push_ids`` with their summed gradients, and the distinct ``pull_ids`` to read once every trainer's
        pushes are applied; ``step``: (clock, trainer, trainers, loss); ``dense_grad`` goes to server 0;
        ``push_routes``: :meth:`route` of ``push_ids`` when the caller has it (the pull that read them)."""
        clock, trainer, trainers, loss = step
        push, pull = push_routes or self.route(push_ids), self.route(pull_ids)
        futs = []
        for k, s in enumerate(self.servers):
            msg = step_exchange.StepMessage(
                names=self.names,
                push_rows=torch.cat([parts[k][1] for parts in push]),
                push_grads=torch.cat([g[parts[k][0]] for g, parts in zip(push_grads, push, strict=True)]),
                push_counts=[len(parts[k][1]) for parts in push],
                pull_rows=torch.cat([parts[k][1] for parts in pull]),
                pull_counts=[len(parts[k][1]) for parts in pull],
                clock=clock,
                trainer=trainer,
                trainers=trainers,
                loss=loss,
                dense_grad=dense_grad if k == 0 else None,
                epoch=epoch,
                seq=seq,
            )
            futs.append(transport.call_async(s, step_exchange.exchange, msg))
        self.bytes_moved += sum(i.numel() * 8 + g.numel() * 4 for i, g in zip(push_ids, push_grads, strict=True))
        self.bytes_moved += sum(i.numel() * 8 + i.numel() * self.tables[0].dim * 4 for i in pull_ids)
        return PendingStep(self.servers, futs, pull_ids, pull, self.tables[0].dim)


class PendingStep:
    """The answers of one :meth:`TableGroup.exchange`: :meth:`wait` gives, per table, the rows of its
    ``pull_ids`` (in that order), the step's mean loss and the mean dense gradient."""

    def __init__(
        self,
        servers: list[str],
        futs: list[Any],
        pull_ids: list[torch.Tensor],
        routes: Routes,
        dim: int,
    ) -> None:
        self.servers, self.futs, self.pull_ids, self.routes, self.dim = servers, futs, pull_ids, routes, dim

    def wait(self) -> tuple[list[torch.Tensor], float, torch.Tensor | None]:
        rows = [torch.empty(len(i), self.dim) for i in self.pull_ids]
        loss, dense = 0.0, None
        for k, (s, f) in enumerate(zip(self.servers, self.futs, strict=True)):
            answer = transport.wait(f, s, step_exchange.exchange)
            got = answer.rows.split([len(parts[k][1]) for parts in self.routes])
            for i, g in enumerate(got):
                rows[i][self.routes[i][k][0]] = g
            if k == 0:
                loss, dense = answer.mean_loss, answer.dense_grad
        return rows, loss, dense
