"""The atomic commit of a checkpoint written by hand (the parameter server's, the RL learner's), with the
training checkpoints' folder names: files go into ``<run>/checkpoints/.tmp-step-N/``, then ``manifest.json``
(sizes, CRC32s) and ``COMMITTED``, then one rename to ``step-N``; a crash leaves no half checkpoint behind,
and :func:`latest` skips a broken one."""

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


def begin(run_dir: Path, step: int) -> Path:
    """An empty temporary folder for step ``step``'s files."""
    tmp = run_dir / "checkpoints" / tmp_dir_name(step)
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    return tmp


def save_synced(obj: Any, path: Path) -> None:
    """``torch.save`` to ``path``, flushed to disk."""
    with open(path, "wb") as fh:
        torch.save(obj, fh)
        fh.flush()
        os.fsync(fh.fileno())


def commit(tmp: Path, step: int, **manifest: Any) -> Path:
    """Seal :func:`begin`'s folder (manifest with ``manifest`` fields, marker) and rename it into place."""
    write_synced(
        tmp / MANIFEST, json.dumps({"step": step, **manifest, "files": manifest_files(tmp)}, indent=2).encode()
    )
    write_synced(tmp / MARKER, b"")
    final = tmp.parent / step_dir_name(step)
    os.replace(tmp, final)
    fsync_dir(tmp.parent)
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


def resume_hint(run_dir: Path, whose: str) -> str:
    """How a stopped job goes on: the newest complete ``whose`` checkpoint and the command, or that there is none."""
    last = latest(run_dir)
    if last is None:
        return f"no {whose} checkpoint yet (--checkpoint.interval N)"
    return f"the newest {whose} checkpoint is {last.name}: run again with --run.name {run_dir.name} to resume"
