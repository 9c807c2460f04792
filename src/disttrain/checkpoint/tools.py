"""``disttrain ckpt ls|inspect|verify|export``: look into, check and convert checkpoints, with no process group.

Owns the listing (``ls``), the per-key / per-rank view of the DCP metadata (``inspect``) and the report of a
full verification (``verify``, the checks themselves in :mod:`~disttrain.checkpoint.verify`); ``export`` is
:mod:`~disttrain.checkpoint.export`'s. Finding the checkpoint a path means (run folder, checkpoints folder or
one ``step-N`` folder) and the on-disk format belong to :mod:`~disttrain.checkpoint.layout`.

Nothing here unpickles without restrictions: ``.metadata`` goes through ``read_metadata_safely`` (DCP's
reader would use plain ``pickle``) and every stored item through ``torch.load(weights_only=True)`` (DCP's
planner would load non-tensor items with ``weights_only=False``).
"""

from __future__ import annotations

import json
import re
import sys
import time
from pathlib import Path
from typing import Any

import torch
from torch.distributed.checkpoint.metadata import MetadataIndex, TensorStorageMetadata

from disttrain.checkpoint.export import export
from disttrain.checkpoint.layout import (
    checkpoints_folder,
    find_checkpoint,
    folder_info,
    is_step_dir,
    list_checkpoints,
)
from disttrain.checkpoint.reader import read_metadata_safely
from disttrain.checkpoint.verify import verify_checkpoint
from disttrain.errors import CheckpointError
from disttrain.utils.fmt import fmt_bytes

__all__ = ["describe", "export", "inspect", "list_rows", "ls", "verify"]

SHARD_RE = re.compile(r"^__(\d+)_\d+\.distcp$")


# -- ls ---------------------------------------------------------------------------------------------
def _folder_bytes(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def list_rows(path: Path) -> list[dict[str, Any]]:
    """One row per checkpoint (oldest first): step, status, size, world size and strategy it was written with."""
    infos = [folder_info(path)] if is_step_dir(path) else list_checkpoints(checkpoints_folder(path))
    rows = []
    for i in infos:
        m = i.manifest or {}
        status = "complete" if i.usable else ("incomplete" if not i.complete else "broken")
        rows.append(
            {
                "step": i.step,
                "path": str(i.path),
                "status": status,
                "problem": i.problem,
                "size_bytes": _folder_bytes(i.path),
                "world_size": m.get("world_size"),
                "strategy": m.get("strategy"),
                "torch": m.get("torch"),
                "time": m.get("time"),
            }
        )
    return rows


def _console() -> Any:
    from rich.console import Console

    return Console() if sys.stdout.isatty() else Console(width=200, no_color=True)


def ls(path: Path, as_json: bool = False) -> int:
    rows = list_rows(path)
    if as_json:
        print(json.dumps(rows, indent=1))
        return 0
    from rich.table import Table

    table = Table(title=f"checkpoints in {path}", title_justify="left")
    for col in ("step", "status", "size", "world size", "strategy", "torch", "saved"):
        table.add_column(col, justify="right" if col in ("step", "size", "world size") else "left")
    for r in rows:
        status = r["status"] + (f": {r['problem']}" if r["problem"] else "")
        saved = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(r["time"])) if r["time"] else "-"
        cells = (r["step"], status, fmt_bytes(r["size_bytes"], 1), r["world_size"], r["strategy"], r["torch"], saved)
        table.add_row(*("-" if c is None else str(c) for c in cells))
    _console().print(table)
    if not rows:
        print("no checkpoints yet")
    return 0


# -- inspect ----------------------------------------------------------------------------------------
def _rank_of(rel: str) -> int | str:
    m = SHARD_RE.match(rel)
    return int(m.group(1)) if m else rel


def describe(ckpt: Path) -> dict[str, Any]:
    """Keys (shape, dtype, which rank stores which chunk) and per-rank shard files, from the metadata alone."""
    md = read_metadata_safely(ckpt)
    info = folder_info(ckpt)
    ranks: dict[str, dict[str, Any]] = {}

    def stored(index: MetadataIndex, nbytes: int) -> int | str | None:
        si = md.storage_data.get(index)
        if si is None:
            return None
        r = ranks.setdefault(si.relative_path, {"file": si.relative_path, "rank": _rank_of(si.relative_path)})
        r["items"] = r.get("items", 0) + 1
        r["tensor_bytes"] = r.get("tensor_bytes", 0) + nbytes
        return r["rank"]

    keys: list[dict[str, Any]] = []
    for fqn, entry in md.state_dict_metadata.items():
        if not isinstance(entry, TensorStorageMetadata):
            chunk = {"rank": stored(MetadataIndex(fqn), 0)}
            keys.append({"key": fqn, "kind": "object", "shape": None, "dtype": None, "chunks": [chunk]})
            continue
        itemsize = torch.empty((), dtype=entry.properties.dtype).element_size()
        chunks = [
            {
                "rank": stored(MetadataIndex(fqn, c.offsets), torch.Size(c.sizes).numel() * itemsize),
                "offsets": list(c.offsets),
                "sizes": list(c.sizes),
            }
            for c in entry.chunks
        ]
        dtype = str(entry.properties.dtype).removeprefix("torch.")
        keys.append({"key": fqn, "kind": "tensor", "shape": list(entry.size), "dtype": dtype, "chunks": chunks})
    order = {k: i for i, k in enumerate(md.planner_data or {})}  # the model's own order, not the storage order
    keys.sort(key=lambda k: order.get(k["key"], len(order)))
    for r in ranks.values():
        f = ckpt / r["file"]
        r["size_bytes"] = f.stat().st_size if f.is_file() else None
    m = info.manifest or {}
    return {
        "path": str(ckpt),
        "step": info.step,
        "status": "complete" if info.usable else (info.problem or "incomplete"),
        "world_size": m.get("world_size"),
        "strategy": m.get("strategy"),
        "torch": m.get("torch"),
        "keys": keys,
        "ranks": sorted(ranks.values(), key=lambda r: (isinstance(r["rank"], str), str(r["rank"]).zfill(8))),
    }


def _chunk_text(k: dict[str, Any]) -> str:
    if k["kind"] != "tensor":
        return f"r{k['chunks'][0]['rank']}"
    if len(k["chunks"]) == 1 and k["chunks"][0]["sizes"] == k["shape"]:
        return f"r{k['chunks'][0]['rank']} (whole)"
    return ", ".join(f"r{c['rank']} {'x'.join(map(str, c['sizes'])) or 'scalar'}" for c in k["chunks"])


def inspect(path: Path, step: int | None = None, as_json: bool = False, prefix: str = "") -> int:
    d = describe(find_checkpoint(path, step))
    d["keys"] = [k for k in d["keys"] if k["key"].startswith(prefix)]
    if as_json:
        print(json.dumps(d, indent=1))
        return 0
    from rich.table import Table

    console = _console()
    console.print(
        f"{d['path']}\nstep {d['step']} | {d['status']} | world size {d['world_size']} | "
        f"strategy {d['strategy']} | torch {d['torch']} | {len(d['keys'])} keys",
        highlight=False,
    )
    keys = Table("key", "shape", "dtype", "stored by rank (chunk)")
    for k in d["keys"]:
        shape = "x".join(map(str, k["shape"])) or "scalar" if k["kind"] == "tensor" else "(object)"
        keys.add_row(k["key"], shape, k["dtype"] or "-", _chunk_text(k))
    console.print(keys)
    ranks = Table("rank", "file", "size on disk", "items", "tensor bytes")
    for r in d["ranks"]:
        size = "MISSING" if r["size_bytes"] is None else fmt_bytes(r["size_bytes"], 1)
        ranks.add_row(str(r["rank"]), r["file"], size, str(r["items"]), fmt_bytes(r["tensor_bytes"], 1))
    console.print(ranks)
    return 0


# -- verify -----------------------------------------------------------------------------------------
def verify(path: Path, step: int | None = None, as_json: bool = False, every: bool = False) -> int:
    """Exit 0 if intact, 1 if anything is broken (one line per problem: which file, what is wrong)."""
    if every and not is_step_dir(path):
        folder = checkpoints_folder(path)
        targets = [i.path for i in list_checkpoints(folder)]
        if not targets:
            raise CheckpointError(f"{folder} holds no checkpoints yet")
    else:
        targets = [find_checkpoint(path, step, want="complete")]
    results = [verify_checkpoint(t) for t in targets]
    if as_json:
        print(json.dumps(results if every else results[0], indent=1))
    else:
        for r in results:
            name = Path(r["path"]).name
            for p in r["problems"]:
                print(f"{name}/{p['file']}: {p['problem']}")
            verdict = "OK" if r["ok"] else f"BROKEN ({len(r['problems'])} problem(s))"
            print(
                f"{verdict}: {r['path']}: {r['files_matching_manifest']} files match manifest.json (size, CRC32), "
                f"{r['items_read']} stored items read back (weights_only)"
            )
    return 0 if all(r["ok"] for r in results) else 1
