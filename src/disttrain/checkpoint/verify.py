"""Full verification of one checkpoint folder with no process group (``verify_checkpoint``): the marker, every
file the manifest lists (presence, size, CRC32), the metadata, and every stored item read back
(``torch.load(weights_only=True)``) and compared with the metadata; one problem per broken file."""

from __future__ import annotations

import io
import json
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import IO, Any

import torch
from torch.distributed.checkpoint import FileSystemReader
from torch.distributed.checkpoint.metadata import Metadata, MetadataIndex, TensorStorageMetadata

from disttrain.checkpoint.layout import MANIFEST, MARKER, TMP_PREFIX, crc32_file, is_tmp_dir_name, step_of
from disttrain.checkpoint.reader import read_metadata_safely
from disttrain.errors import CheckpointError


@dataclass(frozen=True)
class Problem:
    file: str
    problem: str


def first_line(e: BaseException) -> str:
    text = str(e).strip().splitlines()
    return f"{type(e).__name__}: {text[0][:200] if text else ''}"


def _check_manifest(ckpt: Path) -> tuple[list[Problem], set[str], int]:
    """Marker, manifest, and every listed file's presence, size and CRC32; the files missing; how many match."""
    out: list[Problem] = []
    if is_tmp_dir_name(ckpt.name):
        out.append(Problem(".", f"unfinished save (temporary {TMP_PREFIX.rstrip('-')} folder): never resumed from"))
    if not (ckpt / MARKER).is_file():
        out.append(Problem(MARKER, "missing: the save did not finish"))
    try:
        files = json.loads((ckpt / MANIFEST).read_text())["files"]
    except FileNotFoundError:
        return [*out, Problem(MANIFEST, "missing: sizes and checksums cannot be checked")], set(), 0
    except (OSError, ValueError, KeyError, TypeError) as e:
        return [*out, Problem(MANIFEST, f"unreadable ({first_line(e)})")], set(), 0
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
        problem, n = _check_file(ckpt, rel, items, rel in missing, md, reader)
        out += [problem] if problem else []
        n_read += n
    out += _check_coverage(md)
    return out, n_read


def _check_file(
    ckpt: Path, rel: str, items: list[tuple[MetadataIndex, Any]], known_missing: bool, md: Metadata, reader: Any
) -> tuple[Problem | None, int]:
    """One data file read back item by item: its problem (if any) and how many items matched."""
    path = ckpt / rel
    if Path(rel).is_absolute() or ".." in Path(rel).parts:
        return Problem(".metadata", f"points outside the checkpoint folder ({rel!r})"), 0
    if not path.is_file():
        return (None if known_missing else Problem(rel, f"missing: .metadata says it holds {len(items)} items")), 0
    bad, size, n_read = [], path.stat().st_size, 0
    with open(path, "rb") as f:
        for idx, si in sorted(items, key=lambda it: it[1].offset):
            try:
                obj = _load_item(f, size, si, reader)
                _match(obj, md.state_dict_metadata.get(idx.fqn), idx)
                n_read += 1
            except Exception as e:
                bad.append(f"{idx.fqn} ({first_line(e)})")
    if not bad:
        return None, n_read
    more = f" and {len(bad) - 3} more" if len(bad) > 3 else ""
    return Problem(rel, f"{len(bad)} of {len(items)} stored items unreadable: {'; '.join(bad[:3])}{more}"), n_read


def _check_coverage(md: Metadata) -> list[Problem]:
    """Tensors whose stored chunks do not cover them."""
    out = []
    for fqn, entry in md.state_dict_metadata.items():
        if isinstance(entry, TensorStorageMetadata):
            covered = sum(torch.Size(c.sizes).numel() for c in entry.chunks)
            if covered != entry.size.numel() or any(
                MetadataIndex(fqn, c.offsets) not in md.storage_data for c in entry.chunks
            ):
                out.append(
                    Problem(".metadata", f"{fqn}: chunks do not cover the tensor {list(entry.size)} or are not stored")
                )
    return out


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
            problems.append(Problem(str(rng.relative_to(ckpt)), f"unreadable ({first_line(e)})"))
    return {
        "path": str(ckpt),
        "step": step_of(ckpt),
        "ok": not problems,
        "files_matching_manifest": n_match,
        "items_read": n_read,
        "problems": [asdict(p) for p in problems],
    }
