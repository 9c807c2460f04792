"""Corpus sources for ``disttrain data prepare``: which files the inputs name, how they are cut into units of
work, and the documents of one unit.

Kinds by name (``.gz`` of each allowed, except parquet, which compresses inside): ``.jsonl`` / ``.ndjson`` (one
JSON object per line, its text field a document), ``.parquet`` (a string column, one document per row), anything
else UTF-8 text (one document per file). Folders are walked in sorted order (hidden entries skipped).

A unit is a byte range of an uncompressed text or jsonl file cut at a line end, a whole ``.gz`` file, or a range of
a parquet file's row groups. Units depend only on the inputs and the unit size, so the shards are the same
whatever the number of workers. A text file larger than one unit is cut at line ends into several documents.
Empty documents (whitespace only) are left out.
"""

from __future__ import annotations

import dataclasses
import gzip
import io
import itertools
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from disttrain.errors import ConfigError

JSONL_SUFFIXES = (".jsonl", ".ndjson")
PIECE_BYTES = 1 << 20
"""Text documents are encoded in pieces of about this much, cut after a newline (bounded memory)."""


@dataclasses.dataclass(frozen=True)
class Source:
    """One input file and what it holds."""

    path: str
    kind: str
    """'text', 'jsonl' or 'parquet'."""
    gz: bool
    size: int
    """Bytes on disk."""


@dataclasses.dataclass(frozen=True)
class Unit:
    """A piece of the corpus one worker turns into one train and one val shard."""

    index: int
    source: Source
    start: int
    """Byte offset (text, jsonl) or first row group (parquet); 0 for a .gz file."""
    end: int
    """Byte offset or row group after the last; -1: to the end (.gz)."""
    size: int
    """Bytes on disk this unit covers, for progress."""


def kind_of(path: Path) -> tuple[str, bool]:
    gz = path.suffix == ".gz"
    inner = path.with_suffix("") if gz else path
    if inner.suffix in JSONL_SUFFIXES:
        return "jsonl", gz
    if inner.suffix == ".parquet":
        if gz:
            raise ConfigError(f"input {str(path)!r}: a gzipped parquet file; parquet compresses inside: gunzip it")
        return "parquet", False
    return "text", gz


def find_sources(inputs: list[str]) -> list[Source]:
    """Every file the inputs name (folders walked, sorted); ConfigError for a missing one or none at all."""
    found: list[Source] = []
    for spec in inputs:
        path = Path(spec).expanduser()
        if path.is_dir():
            files = sorted(p for p in path.rglob("*") if p.is_file() and not _hidden(p.relative_to(path)))
            if not files:
                raise ConfigError(f"input {spec!r} is an empty folder; give text, .jsonl or .parquet files")
        elif path.is_file():
            files = [path]
        else:
            raise ConfigError(f"input {spec!r} does not exist; give text, .jsonl or .parquet files or folders of them")
        for f in files:
            kind, gz = kind_of(f)
            found.append(Source(str(f), kind, gz, f.stat().st_size))
    return found


def _hidden(rel: Path) -> bool:
    return any(part.startswith(".") for part in rel.parts)


def plan_units(sources: list[Source], unit_bytes: int, text_field: str) -> list[Unit]:
    """The corpus cut into units of about ``unit_bytes`` on disk, in input order."""
    units: list[Unit] = []
    for src in sources:
        if src.kind == "parquet":
            ranges = parquet_ranges(src.path, unit_bytes, text_field)
        elif src.gz:
            ranges = [(0, -1, src.size)]
        else:
            ranges = line_ranges(src.path, src.size, unit_bytes)
        units += [Unit(len(units) + i, src, a, b, n) for i, (a, b, n) in enumerate(ranges)]
    return units


def line_ranges(path: str, size: int, unit_bytes: int) -> list[tuple[int, int, int]]:
    """(start, end, bytes) ranges of about ``unit_bytes``, each ending after a newline (or at the end)."""
    cuts = [0]
    with open(path, "rb") as f:
        while cuts[-1] + unit_bytes < size:
            f.seek(cuts[-1] + unit_bytes)
            f.readline()  # to the end of the line the cut fell in
            at = f.tell()
            if at >= size:
                break
            cuts.append(at)
    cuts.append(size)
    return [(a, b, b - a) for a, b in itertools.pairwise(cuts) if b > a] or [(0, 0, 0)]


def parquet_ranges(path: str, unit_bytes: int, field: str) -> list[tuple[int, int, int]]:
    """Row-group ranges of about ``unit_bytes`` (compressed); ConfigError when the column is missing."""
    meta = parquet_file(path).metadata
    names = meta.schema.names
    if field not in names:
        raise ConfigError(
            f"{path}: parquet file has no column {field!r} (its columns: {', '.join(names[:8])}); "
            "name the text column with --text-field"
        )
    out: list[tuple[int, int, int]] = []
    start, acc = 0, 0
    for g in range(meta.num_row_groups):
        acc += meta.row_group(g).total_byte_size
        if acc >= unit_bytes or g == meta.num_row_groups - 1:
            out.append((start, g + 1, acc))
            start, acc = g + 1, 0
    return out or [(0, 0, 0)]


def parquet_file(path: str) -> Any:
    try:
        import pyarrow.parquet as pq
    except ImportError:
        raise ConfigError(f"{path}: reading parquet needs pyarrow: pip install 'disttrain[data]'") from None
    try:
        return pq.ParquetFile(path)
    except Exception as e:  # pyarrow's ArrowInvalid and friends
        raise ConfigError(f"{path}: not a readable parquet file ({str(e).splitlines()[0][:160]})") from None


def documents(unit: Unit, text_field: str) -> Iterator[str]:
    """The unit's documents, in order (empty ones left out); text comes in pieces of one document: see
    :func:`pieces`."""
    kind = unit.source.kind
    if kind == "parquet":
        yield from _parquet_docs(unit, text_field)
    elif kind == "jsonl":
        yield from _jsonl_docs(unit, text_field)
    else:
        text = _decode(_read(unit), unit)
        if text.strip():
            yield text


def pieces(text: str) -> list[str]:
    """A document cut after newlines into pieces of about :data:`PIECE_BYTES` characters, encoded one by one."""
    if len(text) <= PIECE_BYTES:
        return [text]
    out, at = [], 0
    while at < len(text):
        cut = text.find("\n", at + PIECE_BYTES)
        end = len(text) if cut < 0 else cut + 1
        out.append(text[at:end])
        at = end
    return out


def _read(unit: Unit) -> bytes:
    src = unit.source
    try:
        if src.gz:
            with gzip.open(src.path, "rb") as g:
                return g.read()
        with open(src.path, "rb") as f:
            f.seek(unit.start)
            return f.read(unit.end - unit.start)
    except (OSError, EOFError) as e:
        raise ConfigError(f"{src.path}: cannot be read ({e})") from None


def _decode(raw: bytes, unit: Unit) -> str:
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise ConfigError(f"{unit.source.path}: not UTF-8 text ({e.reason} at byte {unit.start + e.start})") from None


def _lines(unit: Unit) -> Iterator[bytes]:
    src = unit.source
    if src.gz:
        try:
            with gzip.open(src.path, "rb") as g:
                yield from io.BufferedReader(g)  # type: ignore[arg-type]
        except (OSError, EOFError) as e:
            raise ConfigError(f"{src.path}: cannot be read ({e})") from None
        return
    yield from _read(unit).split(b"\n")


def _jsonl_docs(unit: Unit, field: str) -> Iterator[str]:
    for n, line in enumerate(_lines(unit)):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except ValueError as e:
            where = f"{unit.source.path}:{line_number(unit, n)}"
            raise ConfigError(
                f"{where}: not a JSON line ({e}); each line of a .jsonl file is one JSON object"
            ) from None
        text = record.get(field) if isinstance(record, dict) else None
        if not isinstance(text, str):
            where = f"{unit.source.path}:{line_number(unit, n)}"
            has = f"its keys: {', '.join(list(record)[:8])}" if isinstance(record, dict) else "not a JSON object"
            what = "no text field" if text is None else f"a {type(text).__name__} in field"
            raise ConfigError(f"{where}: {what} {field!r} ({has}); name the field with --text-field")
        if text.strip():
            yield text


def line_number(unit: Unit, n: int) -> int:
    """The 1-based line number of line ``n`` of the unit in its file (counted only when an error needs it)."""
    if unit.source.gz or unit.start == 0:
        return n + 1
    with open(unit.source.path, "rb") as f:
        before = f.read(unit.start).count(b"\n")
    return before + n + 1


def _parquet_docs(unit: Unit, field: str) -> Iterator[str]:
    pf = parquet_file(unit.source.path)
    for g in range(unit.start, unit.end):
        column = pf.read_row_group(g, columns=[field]).column(0)
        values = column.to_pylist()
        bad = next((v for v in values if v is not None and not isinstance(v, str)), None)
        if bad is not None:
            raise ConfigError(
                f"{unit.source.path}: column {field!r} holds {column.type}, not strings; name the text column with "
                "--text-field"
            )
        yield from (v for v in values if v and v.strip())
