"""Parameter-server checkpoints, with the training checkpoints' atomic commit and folder names.

``<run>/checkpoints/step-N/`` holds one file per shard (``server<k>.pt``: the rows and optimizer state of every
table that server k, or the spare in its place, holds) and
``trainer.pt`` (the dense part, its optimizer, the step), then ``manifest.json`` (sizes, CRC32s) and
``COMMITTED``; it is written as ``.tmp-step-N`` and renamed when complete, so a crash leaves no half
checkpoint behind. Saved by trainer 0 under BSP, between steps: no push of the next step is applied
until trainer 0 pushes it, so every server holds exactly the state after step N.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from disttrain.checkpoint.commit import begin, commit, latest, save_synced
from disttrain.ps import server
from disttrain.rpc import transport

__all__ = ["latest", "load_servers", "save", "trainer_state"]


def save(run_dir: Path, step: int, servers: list[str], trainer_state: dict[str, Any]) -> Path:
    tmp = begin(run_dir, step)
    futs = [transport.call_async(s, server.save_shards, str(tmp / shard_file(k))) for k, s in enumerate(servers)]
    for s, f in zip(servers, futs, strict=True):
        transport.wait(f, s, server.save_shards)
    save_synced(trainer_state, tmp / "trainer.pt")
    return commit(tmp, step, servers=servers)


def shard_file(k: int) -> str:
    """Shard ``k``'s file, whichever process holds it (a spare that took a dead server's place)."""
    return f"server{k}.pt"


def load_servers(path: Path, servers: list[str]) -> None:
    futs = [transport.call_async(s, server.load_shards, str(path / shard_file(k))) for k, s in enumerate(servers)]
    for s, f in zip(servers, futs, strict=True):
        transport.wait(f, s, server.load_shards)


def trainer_state(path: Path) -> dict[str, Any]:
    return torch.load(path / "trainer.pt", weights_only=True)
