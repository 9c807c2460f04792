"""The on-disk layout of a checkpoints folder: folder and file names, listing, checking and finding checkpoints.

Under the checkpoints folder::

    step-00000100/    a complete checkpoint: DCP files + rng/ + manifest.json + COMMITTED (written last)

A save in progress (or one that crashed) lives in a hidden temporary folder, ``TMP_PREFIX`` followed by the
eight-digit step, and is never resumed from. Also owns the small file primitives of a commit (CRC32 of a file,
a synced write, an fsync of a folder).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import sys
import tomllib
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from disttrain.errors import CheckpointError

STEP_RE = re.compile(r"^step-(\d{8})$")
TMP_PREFIX = ".tmp-step-"  # the temporary folder of a save in progress: TMP_PREFIX + eight-digit step
MARKER = "COMMITTED"
MANIFEST = "manifest.json"
METADATA = ".metadata"
CHECKSUMS = ".checksums"  # per-rank CRC32 sidecars inside a save's temporary folder, merged into the manifest
RNG_FILE = "rng/rank{}.pt"
FORMAT_VERSION = 1


def step_dir_name(step: int) -> str:
    """The folder name of the complete checkpoint of ``step``."""
    return f"step-{step:08d}"


def tmp_dir_name(step: int) -> str:
    """The folder name of a save of ``step`` in progress."""
    return f"{TMP_PREFIX}{step:08d}"


def is_tmp_dir_name(name: str) -> bool:
    return name.startswith(TMP_PREFIX)


def is_step_dir(p: Path) -> bool:
    """A ``step-N`` / temporary folder, or any folder holding checkpoint files (a renamed copy)."""
    named = STEP_RE.match(p.name) is not None or is_tmp_dir_name(p.name)
    return p.is_dir() and (named or any((p / f).exists() for f in (MARKER, MANIFEST, METADATA)))


def step_of(p: Path) -> int:
    """The step in a checkpoint folder's name, or -1."""
    tail = p.name.rsplit("-", 1)[-1]
    return int(tail) if tail.isdigit() else -1


# -- files ------------------------------------------------------------------------------------------
def crc32_file(path: Path, chunk: int = 1 << 22) -> int:
    crc = 0
    with open(path, "rb") as f:
        while block := f.read(chunk):
            crc = zlib.crc32(block, crc)
    return crc


def fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_synced(path: Path, data: bytes) -> None:
    with open(path, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())


def manifest_files(tmp: Path) -> dict[str, dict[str, int]]:
    """Size and CRC32 of every file of the save in ``tmp``: the ranks checksummed their shards while writing
    them (their sidecars, merged and removed here); the rest (``.metadata``) is small and read here."""
    sums = _collect_checksums(tmp)
    files = {}
    for p in sorted(tmp.rglob("*")):
        if not p.is_file():
            continue
        name, size = str(p.relative_to(tmp)), p.stat().st_size
        known = sums.get(name)
        if known is not None and known[0] != size:
            raise CheckpointError(
                f"{p}: {size} bytes on disk, but its writer wrote {known[0]}: the file changed or was "
                "cut short after it was written; not committing this checkpoint (check the disk)"
            )
        files[name] = {"size": size, "crc32": known[1] if known is not None else crc32_file(p)}
    return files


def _collect_checksums(tmp: Path) -> dict[str, tuple[int, int]]:
    """Merge (and remove) the ranks' checksum sidecars of a save in progress: relative path -> (size, crc32)."""
    merged: dict[str, tuple[int, int]] = {}
    folder = tmp / CHECKSUMS
    if not folder.is_dir():
        return merged
    for f in sorted(folder.glob("rank*.json")):
        for name, meta in json.loads(f.read_text()).items():
            merged[name] = (int(meta["size"]), int(meta["crc32"]))
    shutil.rmtree(folder)
    return merged


# -- checking and listing ---------------------------------------------------------------------------
@dataclass(frozen=True)
class CheckpointInfo:
    path: Path
    step: int
    complete: bool
    problem: str | None
    manifest: dict[str, Any] | None

    @property
    def usable(self) -> bool:
        return self.complete and self.problem is None


def unfinished(path: Path, step: int) -> CheckpointInfo:
    """What a temporary folder is: an unfinished save."""
    return CheckpointInfo(path, step, False, "unfinished save (temporary folder)", None)


def inspect_folder(path: Path, checksums: bool = False) -> CheckpointInfo:
    """Is ``path`` a complete, intact checkpoint? (sizes always; CRC32s when ``checksums``)."""
    m = STEP_RE.match(path.name)
    step = int(m.group(1)) if m else -1
    if not (path / MARKER).is_file():
        return CheckpointInfo(path, step, False, "no COMMITTED marker (the save did not finish)", None)
    try:
        manifest = json.loads((path / MANIFEST).read_text())
    except (OSError, ValueError) as e:
        return CheckpointInfo(path, step, True, f"manifest.json unreadable ({e})", None)
    for name, meta in manifest["files"].items():
        f = path / name
        if not f.is_file():
            return CheckpointInfo(path, step, True, f"{name} is missing", manifest)
        size = f.stat().st_size
        if size != meta["size"]:
            return CheckpointInfo(path, step, True, f"{name} has {size} bytes, expected {meta['size']}", manifest)
        if checksums and crc32_file(f) != meta["crc32"]:
            return CheckpointInfo(path, step, True, f"{name} fails its CRC32 check (corrupted)", manifest)
    from disttrain.checkpoint.reader import read_metadata_safely  # DCP's import (a second) only with a checkpoint

    try:
        read_metadata_safely(path)
    except CheckpointError as e:
        return CheckpointInfo(path, step, True, str(e).split(": ", 1)[-1], manifest)
    return CheckpointInfo(path, step, True, None, manifest)


def folder_info(path: Path) -> CheckpointInfo:
    """:func:`inspect_folder` for one folder the user named; a temporary folder is an unfinished save."""
    if is_tmp_dir_name(path.name):
        return unfinished(path, step_of(path))
    return inspect_folder(path)


def list_checkpoints(folder: Path, checksums: bool = False) -> list[CheckpointInfo]:
    """Every ``step-N`` and temporary folder, oldest first."""
    if not folder.is_dir():
        return []
    found = []
    for p in folder.iterdir():
        if not p.is_dir():
            continue
        if is_tmp_dir_name(p.name):
            found.append(unfinished(p, int(p.name.rsplit("-", 1)[-1])))
        elif STEP_RE.match(p.name):
            found.append(inspect_folder(p, checksums))
    return sorted(found, key=lambda i: (i.step, i.path.name))


def resume_target(folder: Path, spec: str) -> CheckpointInfo:
    """The usable checkpoint a step number or path in ``checkpoint.resume`` names (steps are looked up in
    ``folder``); CheckpointError naming the steps there are, or what is wrong with the one named."""
    path = folder / step_dir_name(int(spec)) if spec.isdigit() else Path(spec)
    if spec.isdigit() and not path.exists():
        steps = [str(i.step) for i in list_checkpoints(folder) if i.usable]
        there = f"the steps there are {', '.join(steps)}" if steps else "there are no complete checkpoints there"
        raise CheckpointError(
            f"checkpoint.resume={spec!r}: there is no checkpoint for step {int(spec)} in {folder}; {there}"
        )
    if not path.exists():
        raise CheckpointError(f"checkpoint.resume={spec!r}: {path} does not exist; give a checkpoint folder (step-N)")
    info = inspect_folder(path)
    if not info.usable:
        raise CheckpointError(f"checkpoint.resume={spec!r}: {path} cannot be used: {info.problem}")
    return info


# -- finding the checkpoint a path means ------------------------------------------------------------
def checkpoints_folder(path: Path) -> Path:
    """The folder holding ``step-N`` folders that ``path`` (a run or checkpoints folder) means."""
    if not path.exists():
        raise CheckpointError(f"{path} does not exist")
    if not path.is_dir():
        raise CheckpointError(f"{path} is not a folder; give a run folder, a checkpoints folder or a step-N folder")
    sub = path / "checkpoints"
    if (path / "config.toml").is_file():  # a run folder: its config says where its checkpoints went
        try:
            folder = tomllib.loads((path / "config.toml").read_text()).get("checkpoint", {}).get("folder")
            sub = path / folder if folder else sub
        except (OSError, ValueError):
            pass
    if sub.is_dir():
        return sub
    if (path / "config.toml").is_file():
        raise CheckpointError(f"{path} is a run folder with no checkpoints yet (none at {sub})")
    if any(is_step_dir(p) for p in path.iterdir()):
        return path
    raise CheckpointError(f"{path} is not a checkpoint folder: no checkpoints/ subfolder and no step-N folders in it")


def find_checkpoint(path: Path, step: int | None = None, want: Literal["complete", "usable"] = "usable") -> Path:
    """One step folder: ``path`` itself, its ``step``, or the newest complete (marker) / usable (intact) one."""
    if path.is_dir() and is_step_dir(path):
        if step is not None and step_of(path) != step:
            raise CheckpointError(f"{path} is step {step_of(path)}, not --step {step}")
        return path
    folder = checkpoints_folder(path)
    infos = list_checkpoints(folder)
    if not infos:
        raise CheckpointError(f"{folder} holds no checkpoints yet")
    if step is not None:
        match = [i.path for i in infos if i.step == step]
        if not match:
            raise CheckpointError(f"no checkpoint of step {step} in {folder}; steps there: {_steps(infos)}")
        return sorted(match, key=lambda p: p.name.startswith("."))[0]  # step-N before its temporary folder
    for info in reversed(infos):
        if info.usable or (want == "complete" and info.complete):
            return info.path
        if info.complete:
            print(f"disttrain: warning: skipping {info.path.name}: {info.problem}", file=sys.stderr)
    raise CheckpointError(f"no complete checkpoint in {folder}; steps there: {_steps(infos)}")


def _steps(infos: list[CheckpointInfo]) -> str:
    return ", ".join(f"{i.step} ({'complete' if i.usable else i.problem})" for i in infos)
