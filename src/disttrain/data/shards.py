"""Prepared token shards: the files one unit of the corpus becomes, and the folder's ``index.json``.

A unit (:class:`~disttrain.data.sources.Unit`) becomes ``train-NNNNN.bin`` and ``val-NNNNN.bin``: flat
little-endian ``uint16`` ids (``uint32`` for a vocabulary above 65,536), each document followed by the
end-of-text id. A document goes to val when a hash of (unit, document number in the unit) falls under the val
fraction: the same documents on every run. Each file is written under a temporary name and renamed, val first,
train last, so an existing ``train-NNNNN.bin`` means the unit is complete (``kill -9`` loses nothing). The index,
written last (atomically), lists every shard with its tokens, documents and CRC32, and the tokenizer's hash.
"""

from __future__ import annotations

import dataclasses
import json
import os
import zlib
from pathlib import Path
from typing import Any

import numpy as np

from disttrain.data.sources import Unit, documents, pieces
from disttrain.data.tokenizers import TextTokenizer
from disttrain.errors import ConfigError

INDEX = "index.json"
FORMAT = 1
SPLITS = ("train", "val")
BATCH_CHARS = 1 << 20
"""Documents are tokenized in batches of about this much text (bounded memory per worker)."""
_MASK = (1 << 64) - 1


def dtype_for(vocab_size: int) -> str:
    return "uint16" if vocab_size <= 1 << 16 else "uint32"


def held_out(unit: int, doc: int, fraction: float) -> bool:
    """Whether document ``doc`` of unit ``unit`` is held out (splitmix64 of its number: spread, stable)."""
    z = ((unit << 32) + doc + 0x9E3779B97F4A7C15) & _MASK
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK
    return ((z ^ (z >> 31)) >> 11) < fraction * (1 << 53)


@dataclasses.dataclass(frozen=True)
class Shard:
    """One shard file of the index."""

    file: str
    split: str
    tokens: int
    documents: int
    crc32: int


def shard_name(split: str, unit: int) -> str:
    return f"{split}-{unit:05d}.bin"


class _Out:
    """One shard being written: a temporary file, its CRC and counts."""

    def __init__(self, folder: Path, split: str, unit: int, dtype: str, eot_id: int) -> None:
        self.path = folder / shard_name(split, unit)
        self.tmp = self.path.with_name(self.path.name + ".tmp")
        self.f = open(self.tmp, "wb")  # noqa: SIM115 - closed in finish()
        self.split, self.dtype = split, np.dtype(dtype).newbyteorder("<")
        self.tokens = self.documents = self.crc = 0
        self.eot_id = eot_id

    def add(self, ids: np.ndarray) -> None:
        data = ids.astype(self.dtype).tobytes()
        self.f.write(data)
        self.crc = zlib.crc32(data, self.crc)
        self.tokens += len(ids)
        self.documents += int((ids == self.eot_id).sum())  # as a resumed run counts them: see completed()

    def finish(self) -> Shard:
        self.f.flush()
        os.fsync(self.f.fileno())
        self.f.close()
        self.tmp.replace(self.path)
        return Shard(self.path.name, self.split, self.tokens, self.documents, self.crc)


@dataclasses.dataclass
class UnitWriter:
    """Turns units into their shard files (one per worker process; the tokenizer is loaded once)."""

    tokenizer: TextTokenizer
    folder: Path
    text_field: str
    val_fraction: float
    dtype: str

    def write(self, unit: Unit) -> list[Shard]:
        """The unit's val and train shards, written (val renamed first, train last)."""
        outs = {s: _Out(self.folder, s, unit.index, self.dtype, self.tokenizer.eot_id) for s in SPLITS}
        try:
            batch: list[tuple[str, _Out, bool]] = []
            size = 0
            for n, doc in enumerate(documents(unit, self.text_field)):
                out = outs["val" if held_out(unit.index, n, self.val_fraction) else "train"]
                parts = pieces(doc)
                batch += [(p, out, i == len(parts) - 1) for i, p in enumerate(parts)]
                size += len(doc)
                if size >= BATCH_CHARS:
                    self._encode(batch)
                    batch, size = [], 0
            self._encode(batch)
            return [outs["val"].finish(), outs["train"].finish()]
        finally:
            for out in outs.values():
                out.f.close()
                out.tmp.unlink(missing_ok=True)

    def _encode(self, batch: list[tuple[str, _Out, bool]]) -> None:
        """Encode the pieces; a document's last piece is followed by the end-of-text id."""
        if not batch:
            return
        eot = np.array([self.tokenizer.eot_id], dtype=np.int64)
        ids = self.tokenizer.encode_batch([text for text, _, _ in batch])
        for (_, out, last), piece in zip(batch, ids, strict=True):
            out.add(np.concatenate([piece, eot]) if last else piece)


def completed(folder: Path, unit: int, dtype: str, eot_id: int) -> list[Shard] | None:
    """The shards of a unit an earlier run finished (train renamed last, so its file means both are there); None
    when it has to be written (again). Counts and CRC are read back from the files."""
    paths = [folder / shard_name(s, unit) for s in SPLITS]
    if not all(p.is_file() for p in paths):
        return None
    found = []
    for split, path in zip(SPLITS, paths, strict=True):
        data = path.read_bytes()
        if len(data) % np.dtype(dtype).itemsize:
            return None
        ids = np.frombuffer(data, dtype=np.dtype(dtype).newbyteorder("<"))
        found.append(Shard(path.name, split, len(ids), int((ids == eot_id).sum()), zlib.crc32(data)))
    return found


def crc_of(path: Path) -> int:
    crc = 0
    with open(path, "rb") as f:
        while chunk := f.read(1 << 24):
            crc = zlib.crc32(chunk, crc)
    return crc


def write_json(path: Path, data: dict[str, Any]) -> None:
    """``data`` as JSON at ``path``, atomically (a temporary name, fsync, rename)."""
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "w") as f:
        f.write(json.dumps(data, indent=1) + "\n")
        f.flush()
        os.fsync(f.fileno())
    tmp.replace(path)


def read_index(folder: Path, what: str = "data.path") -> dict[str, Any]:
    """A prepared folder's index; ConfigError one line when it is missing or not one."""
    path = folder / INDEX
    if not path.is_file():
        raise ConfigError(
            f"{what} {str(folder)!r} has no {INDEX}: not a folder made by `disttrain data prepare` (or the prepare "
            "did not finish: run it again, it continues)"
        )
    try:
        index = json.loads(path.read_text())
        assert isinstance(index, dict) and index["format"] == FORMAT and isinstance(index["shards"], list)
        for s in index["shards"]:
            Shard(**s)
    except (OSError, ValueError, KeyError, TypeError, AssertionError):
        raise ConfigError(f"{what} {str(folder)!r}: {INDEX} is damaged; prepare the folder again") from None
    return index


def shards_of(index: dict[str, Any], split: str) -> list[Shard]:
    return [Shard(**s) for s in index["shards"] if s["split"] == split]
