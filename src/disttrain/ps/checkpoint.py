"""Parameter-server checkpoints, with the training checkpoints' atomic commit and folder names.

``<run>/checkpoints/step-N/`` holds one file per server (its rows and optimizer state of every table) and
``trainer.pt`` (the dense part, its optimizer, the step), then ``manifest.json`` (sizes, CRC32s) and
``COMMITTED``; it is written as ``.tmp-step-N`` and renamed when complete, so a crash leaves no half
checkpoint behind. Saved by trainer 0 under BSP, between steps: no push of the next step is applied
until trainer 0 pushes it, so every server holds exactly the state after step N.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any

import torch

from disttrain.checkpoint.layout import (
    MANIFEST,
    MARKER,
    STEP_RE,
    fsync_dir,
    manifest_files,
    step_dir_name,
    tmp_dir_name,
    write_synced,
)
from disttrain.ps import server
from disttrain.rpc import transport


def save(run_dir: Path, step: int, servers: list[str], trainer_state: dict[str, Any]) -> Path:
    folder = run_dir / "checkpoints"
    tmp = folder / tmp_dir_name(step)
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    futs = [transport.call_async(s, server.save_shards, str(tmp / f"{s}.pt")) for s in servers]
    for s, f in zip(servers, futs, strict=True):
        transport.wait(f, s, server.save_shards)
    with open(tmp / "trainer.pt", "wb") as fh:
        torch.save(trainer_state, fh)
        fh.flush()
        os.fsync(fh.fileno())
    manifest = {"step": step, "servers": servers, "files": manifest_files(tmp)}
    write_synced(tmp / MANIFEST, json.dumps(manifest, indent=2).encode())
    write_synced(tmp / MARKER, b"")
    final = folder / step_dir_name(step)
    os.replace(tmp, final)
    fsync_dir(folder)
    return final


def complete(path: Path) -> bool:
    """Committed, and every file of its manifest there with its size."""
    try:
        manifest = json.loads((path / MANIFEST).read_text())
    except (OSError, ValueError):
        return False
    files = manifest.get("files", {})
    return (path / MARKER).is_file() and all(
        (path / n).is_file() and (path / n).stat().st_size == m["size"] for n, m in files.items()
    )


def latest(run_dir: Path) -> Path | None:
    """The newest complete checkpoint of the run (broken or unfinished ones are skipped)."""
    folder = run_dir / "checkpoints"
    steps = sorted((p for p in folder.glob("step-*") if STEP_RE.match(p.name)), reverse=True) if folder.is_dir() else []
    return next((p for p in steps if complete(p)), None)


def load_servers(path: Path, servers: list[str]) -> None:
    futs = [transport.call_async(s, server.load_shards, str(path / f"{s}.pt")) for s in servers]
    for s, f in zip(servers, futs, strict=True):
        transport.wait(f, s, server.load_shards)


def trainer_state(path: Path) -> dict[str, Any]:
    return torch.load(path / "trainer.pt", weights_only=True)
