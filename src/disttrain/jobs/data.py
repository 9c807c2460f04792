"""``disttrain data prepare`` and ``data verify``: a corpus tokenized once into token shards, on every core.

The parent finds the input files, makes or loads the tokenizer, cuts the corpus into units
(:mod:`disttrain.data.sources`), writes ``prepare.json`` (what is being prepared) and ``tokenizer.json``, then hands
the units not yet done to a pool of worker processes, each writing its unit's shards
(:mod:`disttrain.data.shards`). ``index.json`` comes last. A re-run of the same command skips the units whose
shards are complete (and match the index, if there is one), so ``kill -9`` mid-prepare loses only the units in
flight; a mistake in the input is one line, and a folder this run made is removed again.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import multiprocessing
import os
import shutil
import sys
import time
from pathlib import Path
from typing import Any

from disttrain.data import units as unit_sizes
from disttrain.data.shards import FORMAT, INDEX, Shard, UnitWriter, completed, crc_of, dtype_for, read_index, write_json
from disttrain.data.sources import Source, Unit, find_sources, plan_units
from disttrain.data.tokenizers import TextTokenizer, load_tokenizer, saved_tokenizer
from disttrain.errors import ConfigError
from disttrain.utils.fmt import fmt_duration

PLAN = "prepare.json"


@dataclasses.dataclass(frozen=True)
class PrepareConfig:
    """``disttrain data prepare``'s settings."""

    inputs: tuple[str, ...]
    """Text files, .jsonl, .parquet (and .gz of text and jsonl), or folders of them."""
    tokenizer: str
    """A tokenizer.json, a save_pretrained folder, bytes, chars or bpe:VOCAB."""
    out: str
    """The folder the shards, the tokenizer and the index go to."""
    text_field: str = "text"
    """The field (jsonl) or column (parquet) holding a document's text."""
    val_fraction: float = 0.01
    """Share of the documents held out for validation."""
    shard_tokens: int = unit_sizes.SHARD_TOKENS
    """About this many tokens per shard, at most (smaller ones when that gives every core work)."""
    workers: int = 0
    """Worker processes (0: one per core)."""

    def __post_init__(self) -> None:
        if not 0 <= self.val_fraction < 0.5:
            raise ConfigError(f"--val-fraction must be in [0, 0.5), got {self.val_fraction}")
        if self.shard_tokens < 1024:
            raise ConfigError(f"--shard-tokens must be >= 1024, got {self.shard_tokens}")
        if self.workers < 0:
            raise ConfigError(f"--workers must be >= 0 (0: one per core), got {self.workers}")
        if not self.text_field:
            raise ConfigError("--text-field must not be empty; e.g. --text-field text")


def prepare(cfg: PrepareConfig) -> int:
    """Prepare ``cfg.out``; a ConfigError leaves no half-written folder behind (one this run made is removed)."""
    sources = find_sources(list(cfg.inputs))
    folder = Path(cfg.out).expanduser()
    made = check_out(folder)
    folder.mkdir(parents=True, exist_ok=True)
    try:
        return _prepare(cfg, sources, folder)
    except ConfigError:
        if made:
            shutil.rmtree(folder, ignore_errors=True)
        raise
    finally:
        for tmp in folder.glob("*.tmp"):
            tmp.unlink(missing_ok=True)


def check_out(folder: Path) -> bool:
    """True when ``folder`` is new; ConfigError when it holds anything but an earlier prepare."""
    if not folder.exists():
        return True
    if not folder.is_dir():
        raise ConfigError(f"--out {str(folder)!r} is a file; name a new folder")
    if any(folder.iterdir()) and not (folder / PLAN).is_file():
        raise ConfigError(f"--out {str(folder)!r} holds other files, not a prepared corpus; name a new folder")
    return False


def _prepare(cfg: PrepareConfig, sources: list[Source], folder: Path) -> int:
    tok = make_tokenizer(cfg, sources, folder)
    dtype = dtype_for(tok.vocab_size)
    units = plan_units(sources, unit_bytes(cfg, sources, tok), cfg.text_field)
    plan = plan_of(cfg, sources, tok, dtype, len(units))
    if (folder / PLAN).is_file() and json.loads((folder / PLAN).read_text()) != plan:
        raise ConfigError(
            f"--out {str(folder)!r} holds a prepare of other inputs or settings; name a new folder, or delete it to "
            "start again"
        )
    tok.save(folder)
    write_json(folder / PLAN, plan)
    shards, todo = resume_state(folder, units, dtype, tok.eot_id)
    if todo:
        shards += run_units(cfg, folder, tok, dtype, todo, skipped=len(units) - len(todo))
    shards.sort(key=lambda s: (s.file.split("-")[1], s.split))
    if not any(s.documents for s in shards):
        raise ConfigError(
            f"the corpus ({', '.join(cfg.inputs)}) holds no documents once empty ones are left out; "
            "give files with text"
        )
    index = {**plan, "shards": [dataclasses.asdict(s) for s in shards]}
    write_json(folder / INDEX, index)
    print(summary(folder, index), flush=True)
    return 0


def make_tokenizer(cfg: PrepareConfig, sources: list[Source], folder: Path) -> TextTokenizer:
    """The tokenizer asked for; ``chars`` and ``bpe:`` are made from the corpus once and read back on a re-run."""
    if (folder / PLAN).is_file() and (folder / "tokenizer.json").is_file():
        made = json.loads((folder / PLAN).read_text()).get("tokenizer", {})
        if made.get("spec") == cfg.tokenizer and (cfg.tokenizer == "chars" or cfg.tokenizer.startswith("bpe:")):
            return saved_tokenizer(folder, cfg.tokenizer, int(made["eot_id"]))
    return load_tokenizer(cfg.tokenizer, "--tokenizer", unit_sizes.corpus_documents(sources, cfg.text_field))


def unit_bytes(cfg: PrepareConfig, sources: list[Source], tok: TextTokenizer) -> int:
    """Bytes of input per unit (:func:`disttrain.data.unit_sizes.unit_bytes`: the raw-file loader cuts the same)."""
    return unit_sizes.unit_bytes(sources, tok, cfg.text_field, cfg.shard_tokens, ", ".join(cfg.inputs))


def plan_of(cfg: PrepareConfig, sources: list[Source], tok: TextTokenizer, dtype: str, units: int) -> dict[str, Any]:
    """What is being prepared: a re-run must find the same to continue."""
    return {
        "format": FORMAT,
        "inputs": [[str(Path(s.path).resolve()), s.size] for s in sources],
        "text_field": cfg.text_field,
        "val_fraction": cfg.val_fraction,
        "shard_tokens": cfg.shard_tokens,
        "units": units,
        "dtype": dtype,
        "vocab_size": tok.vocab_size,
        "tokenizer": {"spec": cfg.tokenizer, "sha256": tok.hash, "eot_id": tok.eot_id, "file": "tokenizer.json"},
    }


def resume_state(folder: Path, units: list[Unit], dtype: str, eot_id: int) -> tuple[list[Shard], list[Unit]]:
    """The shards of units an earlier run completed (and, with an index, that match it), and the units to do."""
    indexed: set[tuple[Any, ...]] | None = None
    if (folder / INDEX).is_file():
        indexed = {tuple(s.values()) for s in read_index(folder, "--out")["shards"]}
    shards: list[Shard] = []
    todo: list[Unit] = []
    for unit in units:
        done = completed(folder, unit.index, dtype, eot_id)
        if done is None or (indexed is not None and any(tuple(dataclasses.astuple(s)) not in indexed for s in done)):
            todo.append(unit)
        else:
            shards += done
    return shards, todo


_WRITER: UnitWriter | None = None


def _start_worker(folder: str, spec: str, eot_id: int, field: str, val_fraction: float, dtype: str) -> None:
    global _WRITER
    os.environ["TOKENIZERS_PARALLELISM"] = "false"  # one core per worker: the pool is the parallelism
    tok = saved_tokenizer(Path(folder), spec, eot_id)
    _WRITER = UnitWriter(tok, Path(folder), field, val_fraction, dtype)


def _write_unit(unit: Unit) -> tuple[Unit, list[Shard]]:
    assert _WRITER is not None
    return unit, _WRITER.write(unit)


def run_units(
    cfg: PrepareConfig, folder: Path, tok: TextTokenizer, dtype: str, todo: list[Unit], skipped: int
) -> list[Shard]:
    """``todo``'s shards, written by a pool of workers (in this process with one worker), with a progress line."""
    workers = min(cfg.workers or len(os.sched_getaffinity(0)), len(todo))
    progress = Progress(sum(u.size for u in todo), skipped)
    args = (str(folder), cfg.tokenizer, tok.eot_id, cfg.text_field, cfg.val_fraction, dtype)
    shards: list[Shard] = []
    if workers == 1:
        _start_worker(*args)
        results: Any = map(_write_unit, todo)
        for unit, done in results:
            shards += done
            progress.update(unit.size, sum(s.tokens for s in done))
    else:
        with multiprocessing.get_context("spawn").Pool(workers, _start_worker, args) as pool:
            for unit, done in pool.imap_unordered(_write_unit, todo):
                shards += done
                progress.update(unit.size, sum(s.tokens for s in done))
    progress.close()
    return shards


class Progress:
    """One line on stderr: share done, MB/s, tokens/s and ETA (redrawn on a terminal, every 5 s otherwise)."""

    def __init__(self, total: int, skipped: int) -> None:
        self.total, self.done, self.tokens = max(total, 1), 0, 0
        self.t0 = self.last = time.perf_counter()
        self.tty = sys.stderr.isatty()
        if skipped:
            print(f"prepare: {skipped} unit(s) already done, continuing", file=sys.stderr, flush=True)

    def update(self, size: int, tokens: int) -> None:
        self.done += size
        self.tokens += tokens
        now = time.perf_counter()
        if now - self.last >= (0.5 if self.tty else 5.0):
            self.last = now
            print(self.line(), end="\r" if self.tty else "\n", file=sys.stderr, flush=True)

    def line(self) -> str:
        dt = max(time.perf_counter() - self.t0, 1e-9)
        rate = self.done / dt
        eta = (self.total - self.done) / rate if rate > 0 else 0.0
        return (
            f"prepare: {100 * self.done / self.total:3.0f}% {self.done / 1e6:.1f} of {self.total / 1e6:.1f} MB, "
            f"{rate / 1e6:.1f} MB/s, {self.tokens / dt / 1e6:.2f}M tokens/s, ETA {fmt_duration(eta)}"
        )

    def close(self) -> None:
        print(self.line().replace("ETA 0s", f"in {fmt_duration(time.perf_counter() - self.t0)}"), file=sys.stderr)


def summary(folder: Path, index: dict[str, Any]) -> str:
    parts = []
    for split in ("train", "val"):
        mine = [s for s in index["shards"] if s["split"] == split]
        tokens, docs = sum(s["tokens"] for s in mine), sum(s["documents"] for s in mine)
        parts.append(f"{split} {tokens:,} tokens / {docs:,} documents")
    tok = index["tokenizer"]
    return (
        f"prepared {folder}: {', '.join(parts)}; {len(index['shards'])} shards of {index['dtype']}; tokenizer "
        f"{tok['spec']} ({index['vocab_size']:,} ids, sha256 {tok['sha256'][:12]})"
    )


def verify(folder: Path, as_json: bool = False) -> int:
    """Every shard of the index there, of its size and CRC32: 0, or 1 naming the shards that are not."""
    index = read_index(folder, "data verify")
    itemsize = 2 if index["dtype"] == "uint16" else 4
    bad = []
    for s in (Shard(**d) for d in index["shards"]):
        path = folder / s.file
        if not path.is_file():
            bad.append(f"{s.file}: missing")
        elif path.stat().st_size != s.tokens * itemsize:
            bad.append(f"{s.file}: {path.stat().st_size} bytes, the index says {s.tokens * itemsize}")
        elif (crc := crc_of(path)) != s.crc32:
            bad.append(f"{s.file}: CRC32 {crc:08x} does not match the index ({s.crc32:08x}): corrupt")
    tok = folder / "tokenizer.json"
    if not tok.is_file() or hashlib.sha256(tok.read_bytes()).hexdigest() != index["tokenizer"]["sha256"]:
        bad.append("tokenizer.json: missing or not the tokenizer the index names")
    if as_json:
        print(json.dumps({"folder": str(folder), "shards": len(index["shards"]), "problems": bad}))
    for line in bad if not as_json else []:
        print(f"disttrain data verify: {folder / line}", file=sys.stderr)
    if not bad and not as_json:
        tokens = sum(s["tokens"] for s in index["shards"])
        print(f"ok: {folder}: {len(index['shards'])} shards, {tokens:,} tokens, every CRC32 matches")
    if bad and not as_json:
        print(f"{len(bad)} problem(s); `disttrain data prepare` with the same arguments rewrites the damaged shards")
    return 1 if bad else 0
