"""What runs on a parameter server: its table shards, addressed by table name, behind remote calls.

The functions here are called through :mod:`disttrain.rpc.transport` by trainers; each server process holds
its shards in this module's registry (one server per process).
"""

from __future__ import annotations

import os
import threading
from typing import Any

import torch
from torch.futures import Future

from disttrain.errors import ConfigError
from disttrain.ps.table import Arena, ShardTable
from disttrain.rpc import transport

_TABLES: dict[str, ShardTable] = {}


def create(name: str, global_ids: torch.Tensor, dim: int, options: dict[str, Any]) -> int:
    """Create (or replace) this server's shard of table ``name``; the number of rows it holds."""
    _TABLES[name] = ShardTable(global_ids, dim, **options)
    _ARENAS.clear()
    return len(global_ids)


_ARENAS: dict[tuple[str, ...], Arena | None] = {}


def arena(names: list[str]) -> Arena | None:
    """Tables ``names`` as one :class:`Arena` (made at the first call), or None if they cannot be one."""
    key = tuple(names)
    if key not in _ARENAS:
        tables = [get_table(n) for n in names]
        _ARENAS[key] = Arena(tables) if len(set(names)) == len(names) and Arena.fits(tables) else None
    return _ARENAS[key]


def get_table(name: str) -> ShardTable:
    table = _TABLES.get(name)
    if table is None:
        raise ConfigError(f"no table {name!r} on this server (it has {sorted(_TABLES) or 'none'}); create it first")
    return table


def pull(name: str, rows: torch.Tensor) -> torch.Tensor:
    return get_table(name).pull(rows)


def state(name: str) -> dict[str, torch.Tensor]:
    return {k: v.clone() for k, v in get_table(name).state_dict().items()}


_LOCK = threading.Lock()


# -- clocks for SSP (kept by server 0) ----------------------------------------------------------------------
_CLOCKS: dict[int, int] = {}
_WAITERS: list[tuple[int, Future[int]]] = []


_GONE: set[int] = set()


def _slowest(n: int) -> int:
    live = [_CLOCKS.get(t, 0) for t in range(n) if t not in _GONE]
    return min(live) if live else max(_CLOCKS.values(), default=0)


def retire(trainer: int) -> None:
    """Trainer ``trainer`` is gone (asp: its process died and the others go on): the clocks leave it out."""
    with _LOCK:
        _GONE.add(trainer)


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


# -- the dense part, kept on server 0 (ps.dense = server) --------------------------------------------------
_DENSE: dict[str, Any] = {}
_DENSE_PENDING: dict[int, list[tuple[int, torch.Tensor, Future[None]]]] = {}


def create_dense(flat: torch.Tensor, lr: float) -> int:
    """Hold the dense part's parameters (one flat vector) and their Adam state; its length."""
    param = torch.nn.Parameter(flat.clone())
    _DENSE.update(param=param, opt=torch.optim.Adam([param], lr=lr))
    return param.numel()


def pull_dense() -> torch.Tensor:
    return _DENSE["param"].detach().clone()


def push_dense(grad: torch.Tensor) -> None:
    """ssp / asp: one Adam step with one trainer's gradient, applied as it arrives."""
    with _LOCK:
        _DENSE["param"].grad = grad
        _DENSE["opt"].step()


@transport.async_execution
def push_dense_together(grad: torch.Tensor, clock: int, trainer: int, n: int) -> Future[None]:
    """bsp: the ``n`` trainers' gradients of one clock, averaged (in trainer order), make one Adam step, as
    DDP's all-reduce would; every caller is answered once it is applied."""
    fut: Future[None] = Future()
    with _LOCK:
        pending = _DENSE_PENDING.setdefault(clock, [])
        pending.append((trainer, grad, fut))
        ready = _DENSE_PENDING.pop(clock) if len(pending) == n else None
        if ready is not None:
            ready.sort(key=lambda p: p[0])
            _DENSE["param"].grad = torch.stack([p[1] for p in ready]).sum(0) / n
            _DENSE["opt"].step()
    for p in ready or ():
        p[2].set_result(None)
    return fut


def dense_state() -> dict[str, Any]:
    return {"param": _DENSE["param"].detach().clone(), "opt": _DENSE["opt"].state_dict()}


def load_dense_state(state: dict[str, Any]) -> None:
    with _LOCK:
        _DENSE["param"].data.copy_(state["param"])
        _DENSE["opt"].load_state_dict(state["opt"])


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
        get_table(name).load_state_dict(table_state)
    return len(state)


# -- every table in one call per server ---------------------------------------------------------------------
def pull_many(names: list[str], rows: torch.Tensor, counts: list[int]) -> torch.Tensor:
    """The rows of every table at once: ``rows`` holds ``counts[i]`` local rows of table ``names[i]`` after
    each other (one tensor each way: a message's cost grows with its number of tensors)."""
    fused = arena(names)
    if fused is not None:
        return fused.weight[fused.rows(list(rows.split(counts)))]
    return torch.cat([get_table(n).pull(r) for n, r in zip(names, rows.split(counts), strict=True)])


_QUEUE: list[tuple[list[str], list[torch.Tensor], list[torch.Tensor], Future[int]]] = []
_QLOCK = threading.Lock()
_APPLYING = [False]
_STATS = {"pushes": 0, "updates": 0}


@transport.async_execution
def push_many(
    names: list[str], rows: torch.Tensor, grads: torch.Tensor, counts: list[int], combine: bool = True
) -> Future[int]:
    """ASP / SSP: one sparse update per table, applied as it arrives. One caller at a time applies; pushes
    that arrive meanwhile queue, and (``combine``) the next update applies all of them together (group
    commit: one ``index_add`` and one optimizer step per table instead of one per push). Answers with how
    many pushes its update held."""
    fut: Future[int] = Future()
    with _QLOCK:
        _QUEUE.append((names, list(rows.split(counts)), list(grads.split(counts)), fut))
        if _APPLYING[0]:
            return fut  # the caller that is applying will pick it up
        _APPLYING[0] = True
    while True:
        with _QLOCK:
            batch = list(_QUEUE) if combine else _QUEUE[:1]
            del _QUEUE[: len(batch)]
            if not batch:
                _APPLYING[0] = False
                break
        _apply(batch)
        for b in batch:
            b[3].set_result(len(batch))
    return fut


def _apply(batch: list[tuple[list[str], list[torch.Tensor], list[torch.Tensor], Future[int]]]) -> None:
    per_table: dict[str, tuple[list[torch.Tensor], list[torch.Tensor]]] = {}
    for names, rows, grads, _ in batch:
        for n, r, g in zip(names, rows, grads, strict=True):
            per_table.setdefault(n, ([], []))[0].append(r)
            per_table[n][1].append(g)
    with _LOCK:
        for n, (rs, gs) in per_table.items():
            get_table(n).push(torch.cat(rs), torch.cat(gs))
        _STATS["pushes"] += len(batch)
        _STATS["updates"] += 1


def push_stats() -> dict[str, int]:
    """How many pushes (ssp / asp) arrived, and in how many updates they were applied."""
    with _LOCK:
        return dict(_STATS)
