"""What runs on a parameter server: its table shards, addressed by table name, behind remote calls.

The functions here are called through :mod:`disttrain.rpc.transport` by trainers; each server process holds
its shards in this module's registry (one server per process).
"""

from __future__ import annotations

import os
import signal
import threading
from typing import Any

import torch
from torch.futures import Future

from disttrain.errors import ConfigError
from disttrain.ps.table import ShardTable
from disttrain.rpc import transport
from disttrain.utils.faults import fault_matches

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


def state(name: str) -> dict[str, torch.Tensor]:
    return {k: v.clone() for k, v in _table(name).state_dict().items()}


_PENDING: dict[tuple[str, int], list[tuple[int, torch.Tensor, torch.Tensor, Future[int]]]] = {}
_LOCK = threading.Lock()


@transport.async_execution
def push_together(name: str, rows: torch.Tensor, grads: torch.Tensor, clock: int, trainer: int, n: int) -> Future[int]:
    """BSP: the pushes of all ``n`` trainers for one clock become one update (in trainer order, so the sum
    is the same every run), and every caller is answered once it is applied."""
    fut: Future[int] = Future()
    with _LOCK:
        pending = _PENDING.setdefault((name, clock), [])
        pending.append((trainer, rows, grads, fut))
        ready = _PENDING.pop((name, clock)) if len(pending) == n else None
    if ready is not None:
        ready.sort(key=lambda p: p[0])
        table = _table(name)
        table.push(torch.cat([p[1] for p in ready]), torch.cat([p[2] for p in ready]))
        if fault_matches("ps_server_kill", table.updates, int(os.environ.get("RANK", -1))):
            os.kill(os.getpid(), signal.SIGKILL)  # tests: a server dies mid-run (after update k of a table)
        for p in ready:
            p[3].set_result(table.updates)
    return fut


# -- clocks for SSP (kept by server 0) ----------------------------------------------------------------------
_CLOCKS: dict[int, int] = {}
_WAITERS: list[tuple[int, Future[int]]] = []


def _slowest(n: int) -> int:
    return min(_CLOCKS.get(t, 0) for t in range(n))


def tick(trainer: int, clock: int, n: int) -> int:
    """Trainer ``trainer`` finished its step ``clock`` (pushes applied); the slowest trainer's clock."""
    with _LOCK:
        _CLOCKS[trainer] = clock
        slowest = _slowest(n)
        ready = [w for w in _WAITERS if w[0] <= slowest]
        _WAITERS[:] = [w for w in _WAITERS if w[0] > slowest]
    for _, fut in ready:
        fut.set_result(slowest)
    return slowest


@transport.async_execution
def wait_for_clock(needed: int, n: int) -> Future[int]:
    """Answered (with the slowest clock) once every one of the ``n`` trainers has reached clock ``needed``."""
    fut: Future[int] = Future()
    with _LOCK:
        slowest = _slowest(n)
        if slowest < needed:
            _WAITERS.append((needed, fut))
            return fut
    fut.set_result(slowest)
    return fut


# -- the dense part, kept on server 0 for SSP / ASP ---------------------------------------------------------
_DENSE: dict[str, Any] = {}


def create_dense(flat: torch.Tensor, lr: float) -> int:
    """Hold the dense part's parameters (one flat vector) and their Adam state; its length."""
    param = torch.nn.Parameter(flat.clone())
    _DENSE.update(param=param, opt=torch.optim.Adam([param], lr=lr))
    return param.numel()


def pull_dense() -> torch.Tensor:
    return _DENSE["param"].detach().clone()


def push_dense(grad: torch.Tensor) -> None:
    """One Adam step with one trainer's gradient, applied as it arrives."""
    with _LOCK:
        _DENSE["param"].grad = grad
        _DENSE["opt"].step()


# -- checkpoints --------------------------------------------------------------------------------------------
def save_shards(path: str) -> int:
    """Write this server's rows and optimizer state of every table to ``path`` (synced); bytes written."""
    with _LOCK:
        state = {name: {k: v.clone() for k, v in t.state_dict().items()} for name, t in _TABLES.items()}
    tmp = path + ".part"
    with open(tmp, "wb") as f:
        torch.save(state, f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    return os.path.getsize(path)


def load_shards(path: str) -> int:
    """Load what :func:`save_shards` wrote into this server's tables; the number of tables."""
    state = torch.load(path, weights_only=True)
    for name, table_state in state.items():
        _table(name).load_state_dict(table_state)
    return len(state)


# -- every table in one call per server ---------------------------------------------------------------------
def pull_many(names: list[str], rows: list[torch.Tensor]) -> list[torch.Tensor]:
    return [_table(n).pull(r) for n, r in zip(names, rows, strict=True)]


def push_many(names: list[str], rows: list[torch.Tensor], grads: list[torch.Tensor]) -> None:
    """ASP / SSP: one sparse update per table, applied as it arrives (one after the other)."""
    with _LOCK:
        for n, r, g in zip(names, rows, grads, strict=True):
            _table(n).push(r, g)


@transport.async_execution
def push_many_together(
    names: list[str], rows: list[torch.Tensor], grads: list[torch.Tensor], clock: int, trainer: int, n: int
) -> Future[int]:
    """BSP for every table at once: :func:`push_together`, one call per server and step instead of one per table."""
    futs = [push_together(name, r, g, clock, trainer, n) for name, r, g in zip(names, rows, grads, strict=True)]
    return torch.futures.collect_all(futs).then(lambda done: min(f.wait() for f in done.wait()))
