"""What runs on a parameter server: its table shards, addressed by table name, behind remote calls.

The functions here are called through :mod:`disttrain.rpc.transport` by trainers; each server process holds
its shards in this module's registry (one server per process).
"""

from __future__ import annotations

from typing import Any

import torch

from disttrain.errors import ConfigError
from disttrain.ps.table import ShardTable

_TABLES: dict[str, ShardTable] = {}


def create(name: str, global_ids: torch.Tensor, dim: int, options: dict[str, Any]) -> int:
    """Create (or replace) this server's shard of table ``name``; the number of rows it holds."""
    _TABLES[name] = ShardTable(global_ids, dim, **options)
    return len(global_ids)


def _table(name: str) -> ShardTable:
    table = _TABLES.get(name)
    if table is None:
        raise ConfigError(f"no table {name!r} on this server (it has {sorted(_TABLES) or 'none'}); create it first")
    return table


def pull(name: str, rows: torch.Tensor) -> torch.Tensor:
    return _table(name).pull(rows)


def push(name: str, rows: torch.Tensor, grads: torch.Tensor) -> int:
    """Apply one sparse update; the table's update count after it."""
    table = _table(name)
    table.push(rows, grads)
    return table.updates


def state(name: str) -> dict[str, torch.Tensor]:
    return {k: v.clone() for k, v in _table(name).state_dict().items()}
