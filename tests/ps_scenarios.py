"""Real RPC processes for the parameter-server tests, run as `disttrain launch -n 3 ps_scenarios.py OUT`.

Rank 0 is the trainer, ranks 1.. are servers. The trainer drives a table sharded over the servers and the
same table held whole in its own process, through the same pulls and pushes, and records how remote
failures read; it writes OUT/ps.json.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path
from typing import Any

import torch

from disttrain.errors import RpcError
from disttrain.ps import server
from disttrain.ps.client import TableClient, TableGroup
from disttrain.ps.table import ShardTable
from disttrain.rpc import transport


def trainer(servers: list[str], scheme: str) -> dict[str, Any]:
    rows, dim = 5000, 4
    client = TableClient("emb", rows, dim, servers, scheme)
    client.create(optimizer="adagrad", lr=0.1, seed=3)
    group = TableGroup([client])
    dense = ShardTable(torch.arange(rows), dim, optimizer="adagrad", lr=0.1, seed=3)
    gen = torch.Generator().manual_seed(0)
    pulls_equal = True
    for _ in range(5):
        ids = torch.randint(0, rows, (96, 1), generator=gen)
        ids[:12] = ids[0]  # hot ids repeat within a batch
        pulls_equal &= torch.equal(group.pull(ids), dense.pull(ids))
        grads = torch.randn(96, 1, dim, generator=gen)
        group.push(ids, grads)
        dense.push(ids.reshape(-1), grads.reshape(-1, dim))
    return {
        "pulls_equal": pulls_equal,
        "tables_equal": torch.equal(client.full(), dense.weight),
        "bytes_moved": group.bytes_moved,
    }


def combined(servers: list[str]) -> dict[str, Any]:
    """ASP pushes in flight together: the server applies the ones that queue during an update as one update
    (with SGD, which is linear, that equals applying them one by one)."""
    rows, dim, n = 200_000, 8, 8
    client = TableClient("big", rows, dim, servers[:1])
    client.create(optimizer="sgd", lr=0.1, seed=5)
    dense = ShardTable(torch.arange(rows), dim, optimizer="sgd", lr=0.1, seed=5)
    gen = torch.Generator().manual_seed(1)
    pushes = [
        (torch.randint(0, rows, (50_000,), generator=gen), torch.randn(50_000, dim, generator=gen)) for _ in range(n)
    ]
    before = transport.call(servers[0], server.push_stats)
    futs = [transport.call_async(servers[0], server.push_many, ["big"], r, g, [len(r)]) for r, g in pushes]
    held = [transport.wait(f, servers[0], server.push_many) for f in futs]
    for r, g in pushes:
        dense.push(r, g)
    stats = {k: v - before[k] for k, v in transport.call(servers[0], server.push_stats).items()}
    return {"held": held, "stats": stats, "equal": bool(torch.allclose(client.full(), dense.weight, atol=1e-6))}


def errors(servers: list[str]) -> dict[str, str]:
    out = {}
    for key, call in {
        "missing_table": lambda: transport.call(servers[0], server.pull, "nope", torch.tensor([0])),
        "timeout": lambda: transport.call(servers[-1], time.sleep, 3, timeout_s=0.5),
    }.items():
        try:
            call()
            out[key] = "no error"
        except RpcError as e:
            out[key] = str(e)
    return out


def main() -> None:
    out_dir = Path(sys.argv[1])
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    servers = [f"server{i}" for i in range(world - 1)]
    transport.init("trainer0" if rank == 0 else servers[rank - 1], rank, world, timeout_s=30)
    if rank == 0:
        result = {scheme: trainer(servers, scheme) for scheme in ("mod", "range")}
        result["errors"] = errors(servers)
        result["combined"] = combined(servers)
        (out_dir / "ps.json").write_text(json.dumps(result))
    transport.shutdown()


def entry(argv: list[str]) -> int:
    """A rank forked by ``disttrain launch -m`` (see disttrain.launch.forked): ``main`` reads ``sys.argv``."""
    main()
    return 0


if __name__ == "__main__":
    main()
