"""A dead server's place taken by a spare without restarting anyone (``ps.spare_servers``, bsp, checkpoints).

RPC's group is fixed when it starts, so the dead process cannot come back; a spare process, idle in the
group from the start, holds its shard instead. Every trainer finds out in its step's message (the dead
server's answer fails, or a live server's is refused by the roll-back). Trainer 0 then, for the new *epoch*:
finds which servers do not answer, puts a spare in each one's place (its tables created with the same rows),
tells every server to refuse messages of older epochs and to answer the steps waiting there with a
roll-back, loads every shard from the newest checkpoint, and writes the new placement to the rendezvous
store; the other trainers wait for it there. Then every trainer loads its own state from the same checkpoint
and goes on from its step: BSP again, from the same state, so the rows end as an uninterrupted run's.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

from disttrain.errors import RpcError
from disttrain.ps import checkpoint as ps_checkpoint
from disttrain.ps import exchange, server
from disttrain.ps.client import TableGroup
from disttrain.rpc import transport

PROBE_TIMEOUT_S = 5.0


def key(epoch: int) -> str:
    return f"ps/takeover/{epoch}"


def answers(worker: str) -> bool:
    try:
        transport.call(worker, os.getpid, timeout_s=PROBE_TIMEOUT_S)
        return True
    except RpcError:
        return False


def hand_over(group: TableGroup, spares: list[str], options: dict[str, Any], run_dir: Path, epoch: int) -> Path:
    """Trainer 0: spares (taken from ``spares``) in the place of every server that does not answer, all shards
    back to the newest checkpoint; publishes the placement and returns the checkpoint. RpcError when there is
    nothing to hand over to (no spare left, no checkpoint, or every server answers: the failure was elsewhere)."""
    servers = list(group.servers)
    dead = [k for k, s in enumerate(servers) if not answers(s)]
    ckpt = ps_checkpoint.latest(run_dir)
    if not dead or len(dead) > len(spares) or ckpt is None:
        why = "every server answers" if not dead else "no spare left" if len(dead) > len(spares) else "no checkpoint"
        raise RpcError(f"ps: servers {[servers[k] for k in dead]} are down and cannot be replaced ({why})")
    for k in dead:
        servers[k] = spares.pop(0)
    group.use_servers(servers)
    for k in dead:
        for t in group.tables:
            transport.wait(t.create_shard(k, **options), servers[k], server.create)
    for s in servers:
        transport.call(s, exchange.roll_back, epoch)
    ps_checkpoint.load_servers(ckpt, servers)
    placement = {"servers": servers, "checkpoint": str(ckpt), "dead": dead, "spares": spares}
    store = transport.store()
    store.set(key(epoch), json.dumps(placement))
    return ckpt


def wait_for_hand_over(group: TableGroup, spares: list[str], epoch: int, timeout_s: float) -> Path:
    """Every other trainer: the placement trainer 0 published for ``epoch``; its checkpoint."""
    store, deadline = transport.store(), time.monotonic() + timeout_s
    while not store.check([key(epoch)]):
        if time.monotonic() > deadline:
            raise RpcError(f"ps: trainer 0 did not hand the dead server's shards over within {timeout_s:.0f}s")
        time.sleep(0.05)
    placement = json.loads(store.get(key(epoch)))
    group.use_servers(placement["servers"])
    spares[:] = placement["spares"]
    return Path(placement["checkpoint"])
