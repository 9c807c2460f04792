"""``disttrain ckpt ls|inspect|verify|export``: look into, check and convert checkpoints, with no process group.

Owns: finding the checkpoint a path means (run folder, checkpoints folder or one ``step-N`` folder), the
listing, the per-key / per-rank view of the DCP metadata, full verification (marker, manifest sizes and
CRC32s, metadata, every stored item read back) and export of the model weights to one plain file.
The on-disk format and its primitives belong to :mod:`disttrain.checkpoint.manager`.

Nothing here unpickles without restrictions: ``.metadata`` goes through ``read_metadata_safely`` (DCP's
reader would use plain ``pickle``) and every stored item through ``torch.load(weights_only=True)`` (DCP's
planner would load non-tensor items with ``weights_only=False``).
"""

from __future__ import annotations

import io
import json
import re
import sys
import time
import tomllib
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import IO, Any, Literal

import torch
from torch.distributed.checkpoint import FileSystemReader
from torch.distributed.checkpoint.default_planner import _EmptyStateDictLoadPlanner
from torch.distributed.checkpoint.metadata import Metadata, MetadataIndex, TensorStorageMetadata
from torch.distributed.checkpoint.state_dict_loader import _load_state_dict

from disttrain.checkpoint.manager import (
    MANIFEST,
    MARKER,
    STEP_RE,
    CheckpointError,
    CheckpointInfo,
    crc32_file,
    inspect_folder,
    list_checkpoints,
    write_weights,
)
from disttrain.checkpoint.reader import SafeFileSystemReader, WeightsOnlyBytes, read_metadata_safely
from disttrain.config import DTYPES
from disttrain.errors import ConfigError
from disttrain.utils.fmt import fmt_bytes

MODEL_PREFIX = ("app", "model")  # the Trainer saves {"app": ModelOptimState, "train": ...}
SHARD_RE = re.compile(r"^__(\d+)_\d+\.distcp$")


# -- finding checkpoints ----------------------------------------------------------------------------
def _is_step_dir(p: Path) -> bool:
    """A ``step-N`` / ``.tmp-step-N`` folder, or any folder holding checkpoint files (a renamed copy)."""
    named = STEP_RE.match(p.name) is not None or p.name.startswith(".tmp-step-")
    return p.is_dir() and (named or any((p / f).exists() for f in (MARKER, MANIFEST, ".metadata")))


def _step_of(p: Path) -> int:
    tail = p.name.rsplit("-", 1)[-1]
    return int(tail) if tail.isdigit() else -1


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
    if any(_is_step_dir(p) for p in path.iterdir()):
        return path
    raise CheckpointError(f"{path} is not a checkpoint folder: no checkpoints/ subfolder and no step-N folders in it")


def _info(path: Path) -> CheckpointInfo:
    info = inspect_folder(path)
    if path.name.startswith(".tmp-step-"):
        return CheckpointInfo(path, _step_of(path), False, "unfinished save (temporary folder)", None)
    return info


def find_checkpoint(path: Path, step: int | None = None, want: Literal["complete", "usable"] = "usable") -> Path:
    """One step folder: ``path`` itself, its ``step``, or the newest complete (marker) / usable (intact) one."""
    if path.is_dir() and _is_step_dir(path):
        if step is not None and _step_of(path) != step:
            raise CheckpointError(f"{path} is step {_step_of(path)}, not --step {step}")
        return path
    folder = checkpoints_folder(path)
    infos = list_checkpoints(folder)
    if not infos:
        raise CheckpointError(f"{folder} holds no checkpoints yet")
    if step is not None:
        match = [i.path for i in infos if i.step == step]
        if not match:
            raise CheckpointError(f"no checkpoint of step {step} in {folder}; steps there: {_steps(infos)}")
        return sorted(match, key=lambda p: p.name.startswith("."))[0]  # step-N before .tmp-step-N
    for info in reversed(infos):
        if info.usable or (want == "complete" and info.complete):
            return info.path
        if info.complete:
            print(f"disttrain: warning: skipping {info.path.name}: {info.problem}", file=sys.stderr)
    raise CheckpointError(f"no complete checkpoint in {folder}; steps there: {_steps(infos)}")


def _steps(infos: list[CheckpointInfo]) -> str:
    return ", ".join(f"{i.step} ({'complete' if i.usable else i.problem})" for i in infos)


# -- ls ---------------------------------------------------------------------------------------------
def _folder_bytes(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def list_rows(path: Path) -> list[dict[str, Any]]:
    """One row per checkpoint (oldest first): step, status, size, world size and strategy it was written with."""
    infos = [_info(path)] if _is_step_dir(path) else list_checkpoints(checkpoints_folder(path))
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
    info = _info(ckpt)
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
@dataclass(frozen=True)
class Problem:
    file: str
    problem: str


def _first_line(e: BaseException) -> str:
    text = str(e).strip().splitlines()
    return f"{type(e).__name__}: {text[0][:200] if text else ''}"


def _check_manifest(ckpt: Path) -> tuple[list[Problem], set[str], int]:
    """Marker, manifest, and every listed file's presence, size and CRC32; the files missing; how many match."""
    out: list[Problem] = []
    if ckpt.name.startswith(".tmp-step-"):
        out.append(Problem(".", "unfinished save (temporary .tmp-step folder): never resumed from"))
    if not (ckpt / MARKER).is_file():
        out.append(Problem(MARKER, "missing: the save did not finish"))
    try:
        files = json.loads((ckpt / MANIFEST).read_text())["files"]
    except FileNotFoundError:
        return [*out, Problem(MANIFEST, "missing: sizes and checksums cannot be checked")], set(), 0
    except (OSError, ValueError, KeyError, TypeError) as e:
        return [*out, Problem(MANIFEST, f"unreadable ({_first_line(e)})")], set(), 0
    missing, n_bad = set(), len(out)
    for name, meta in files.items():
        f = ckpt / name
        if not f.is_file():
            out.append(Problem(name, f"missing (manifest.json lists {meta['size']} bytes)"))
            missing.add(name)
        elif (size := f.stat().st_size) != meta["size"]:
            what = "truncated" if size < meta["size"] else "too long"
            out.append(Problem(name, f"{what}: {size} bytes, manifest.json says {meta['size']}"))
        elif crc32_file(f) != meta["crc32"]:
            out.append(Problem(name, f"CRC32 {crc32_file(f):08x} does not match manifest.json's {meta['crc32']:08x}"))
    return out, missing, len(files) - (len(out) - n_bad)


def _load_item(f: IO[bytes], size: int, si: Any, reader: FileSystemReader) -> Any:
    if si.offset + si.length > size:
        raise EOFError(f"needs bytes {si.offset}..{si.offset + si.length}, the file ends at {size}")
    f.seek(si.offset)
    stream: IO[bytes] = io.BytesIO(f.read(si.length))
    if getattr(si, "transform_descriptors", None):
        stream = io.BytesIO(reader.transforms.transform_load_stream(None, si.transform_descriptors, stream).read())  # type: ignore[arg-type]
    return torch.load(stream, map_location="cpu", weights_only=True)


def _check_items(ckpt: Path, md: Metadata, missing: set[str]) -> tuple[list[Problem], int]:
    """Read back every stored item (weights_only) and compare it with the metadata; one line per bad file."""
    out: list[Problem] = []
    by_file: dict[str, list[tuple[MetadataIndex, Any]]] = {}
    for idx, si in md.storage_data.items():
        by_file.setdefault(si.relative_path, []).append((idx, si))
    reader, n_read = FileSystemReader(ckpt), 0
    for rel, items in sorted(by_file.items()):
        path = ckpt / rel
        if Path(rel).is_absolute() or ".." in Path(rel).parts:
            out.append(Problem(".metadata", f"points outside the checkpoint folder ({rel!r})"))
            continue
        if not path.is_file():
            if rel not in missing:
                out.append(Problem(rel, f"missing: .metadata says it holds {len(items)} items"))
            continue
        bad, size = [], path.stat().st_size
        with open(path, "rb") as f:
            for idx, si in sorted(items, key=lambda it: it[1].offset):
                try:
                    obj = _load_item(f, size, si, reader)
                    _match(obj, md.state_dict_metadata.get(idx.fqn), idx)
                    n_read += 1
                except Exception as e:
                    bad.append(f"{idx.fqn} ({_first_line(e)})")
        if bad:
            more = f" and {len(bad) - 3} more" if len(bad) > 3 else ""
            out.append(Problem(rel, f"{len(bad)} of {len(items)} stored items unreadable: {'; '.join(bad[:3])}{more}"))
    for fqn, entry in md.state_dict_metadata.items():
        if isinstance(entry, TensorStorageMetadata):
            covered = sum(torch.Size(c.sizes).numel() for c in entry.chunks)
            if covered != entry.size.numel() or any(
                MetadataIndex(fqn, c.offsets) not in md.storage_data for c in entry.chunks
            ):
                out.append(
                    Problem(".metadata", f"{fqn}: chunks do not cover the tensor {list(entry.size)} or are not stored")
                )
    return out, n_read


def _match(obj: Any, entry: Any, idx: MetadataIndex) -> None:
    if not isinstance(entry, TensorStorageMetadata):
        return
    if not isinstance(obj, torch.Tensor):
        raise TypeError(f"stored a {type(obj).__name__}, metadata says tensor")
    chunk = next((c for c in entry.chunks if torch.Size(c.offsets) == idx.offset), None)
    want = torch.Size(chunk.sizes) if chunk else None
    if obj.shape != want or obj.dtype != entry.properties.dtype:
        raise ValueError(
            f"read {list(obj.shape)} {obj.dtype}, metadata says {want and list(want)} {entry.properties.dtype}"
        )


def verify_checkpoint(ckpt: Path) -> dict[str, Any]:
    """Everything that is wrong with one step folder (empty ``problems`` = intact), and what was checked."""
    problems, missing, n_match = _check_manifest(ckpt)
    n_read = 0
    if not any(ckpt.glob("__*.distcp")) and not missing:
        problems.append(Problem("__<rank>_0.distcp", "no shard files: the tensors are gone"))
    if ".metadata" in missing:
        problems = [
            p if p.file != ".metadata" else Problem(p.file, p.problem + "; no tensor can be located") for p in problems
        ]
    elif not (ckpt / ".metadata").is_file():
        problems.append(Problem(".metadata", "missing; no tensor can be located"))
    else:
        try:
            md = read_metadata_safely(ckpt)
        except CheckpointError as e:
            problems.append(Problem(".metadata", str(e).removeprefix(f"{ckpt}: ").removeprefix(".metadata is ")))
        else:
            item_problems, n_read = _check_items(ckpt, md, missing)
            problems += item_problems
    for rng in sorted(ckpt.glob("rng/*.pt")):
        try:
            torch.load(rng, map_location="cpu", weights_only=True)
        except Exception as e:
            problems.append(Problem(str(rng.relative_to(ckpt)), f"unreadable ({_first_line(e)})"))
    return {
        "path": str(ckpt),
        "step": _step_of(ckpt),
        "ok": not problems,
        "files_matching_manifest": n_match,
        "items_read": n_read,
        "problems": [asdict(p) for p in problems],
    }


def verify(path: Path, step: int | None = None, as_json: bool = False, every: bool = False) -> int:
    """Exit 0 if intact, 1 if anything is broken (one line per problem: which file, what is wrong)."""
    if every and not _is_step_dir(path):
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


# -- export -----------------------------------------------------------------------------------------
class _SafeEmptyPlanner(WeightsOnlyBytes, _EmptyStateDictLoadPlanner):
    """Rebuilds the saved state dict from the metadata; non-tensor items are loaded ``weights_only``."""


def load_state(ckpt: Path, keys: set[str] | None = None) -> dict[str, Any]:
    """The saved state (nested as saved, e.g. ``{"app": {"model": ..., "optim": ...}, "train": ...}``), in memory,
    without a process group. ``keys`` limits it to those dotted prefixes (``{"app.model"}``)."""
    read_metadata_safely(ckpt)  # a clean error before DCP starts (its reader re-reads it, safely, below)
    sd: dict[str, Any] = {}
    try:
        _load_state_dict(
            sd, storage_reader=SafeFileSystemReader(ckpt), planner=_SafeEmptyPlanner(keys=keys), no_dist=True
        )
    except CheckpointError:
        raise
    except Exception as e:
        raise CheckpointError(
            f"{ckpt}: cannot be read ({_first_line(e)}); run `disttrain ckpt verify {ckpt}`"
        ) from None
    return sd


def load_model_weights(ckpt: Path) -> dict[str, torch.Tensor]:
    """``{fqn: tensor}`` of the model in a checkpoint written by the Trainer (full tensors, whatever the sharding)."""
    sd = load_state(ckpt, keys={".".join(MODEL_PREFIX)})
    model = sd.get(MODEL_PREFIX[0], {}).get(MODEL_PREFIX[1])
    if not model:
        raise CheckpointError(f"{ckpt}: no model weights in it (keys {'.'.join(MODEL_PREFIX)}.*)")
    return {k: v for k, v in model.items() if isinstance(v, torch.Tensor)}


def export(
    path: Path, step: int | None = None, fmt: str | None = None, dtype: str = "fp32", out: Path | None = None
) -> int:
    """Write the model weights of one checkpoint to one file (``torch.load(weights_only=True)`` / safetensors)."""
    if dtype not in DTYPES:
        raise ConfigError(f"--dtype must be one of {', '.join(DTYPES)}, got {dtype!r}")
    if fmt is None:
        fmt = "safetensors" if out is None or out.suffix == ".safetensors" else "torch"
    if fmt not in ("torch", "safetensors"):
        raise ConfigError(f"--format must be torch or safetensors, got {fmt!r}")
    if out is not None and (out.suffix == ".safetensors") != (fmt == "safetensors"):
        raise ConfigError(
            f"--out {out} does not fit --format {fmt}: safetensors files end in .safetensors, others must not"
        )
    ckpt = find_checkpoint(path, step)
    info = _info(ckpt)
    if not info.usable:
        raise CheckpointError(f"{ckpt} cannot be exported: {info.problem}; see `disttrain ckpt verify {ckpt}`")
    weights = load_model_weights(ckpt)
    target = out or ckpt.resolve().parent.parent / ("model.safetensors" if fmt == "safetensors" else "model.pt")
    write_weights(weights, target, dtype)
    n = sum(t.numel() for t in weights.values())
    print(f"wrote {target}: {len(weights)} tensors, {n:,} parameters, {dtype}, from {ckpt}")
    return 0
