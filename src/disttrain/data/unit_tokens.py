"""One unit of a raw corpus turned into its train and val token arrays, in loader worker processes: what
:class:`~disttrain.data.shards.UnitWriter` writes into a unit's shards, kept in memory instead.

The same documents, the same held-out rule and the same pieces give the same ids as ``data prepare``. Workers are
forked from the rank (no second import of torch), load the tokenizer once, die with their rank
(``PR_SET_PDEATHSIG``: a ``kill -9`` of the rank leaves no orphan) and tokenize on one core each.
"""

from __future__ import annotations

import contextlib
import ctypes
import dataclasses
import multiprocessing
import os
import signal
import time
from concurrent.futures import Future, ProcessPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np

from disttrain.data.shards import BATCH_CHARS, held_out
from disttrain.data.sources import Unit, documents, pieces
from disttrain.data.tokenizers import TextTokenizer, load_tokenizer

_PR_SET_PDEATHSIG = 1


@dataclasses.dataclass(frozen=True)
class UnitTokens:
    """A unit's train and val ids (each document followed by the end-of-text id) and the seconds they took."""

    index: int
    train: np.ndarray
    val: np.ndarray
    seconds: float


@dataclasses.dataclass(frozen=True)
class TokenizeSpec:
    """What a worker needs to tokenize units the way ``data prepare`` does."""

    tokenizer: str
    """A tokenizer.json, a save_pretrained folder or bytes."""
    text_field: str
    val_fraction: float
    dtype: str


def tokenize_unit(unit: Unit, tok: TextTokenizer, spec: TokenizeSpec) -> UnitTokens:
    """The unit's documents encoded (in batches of about :data:`BATCH_CHARS`), split by :func:`held_out`."""
    t0 = time.perf_counter()
    out: dict[bool, list[np.ndarray]] = {True: [], False: []}
    batch: list[tuple[str, bool, bool]] = []  # (piece, held out, last piece of its document)
    size = 0
    for n, doc in enumerate(documents(unit, spec.text_field)):
        kept = held_out(unit.index, n, spec.val_fraction)
        parts = pieces(doc)
        batch += [(p, kept, i == len(parts) - 1) for i, p in enumerate(parts)]
        size += len(doc)
        if size >= BATCH_CHARS:
            _encode(tok, batch, out)
            batch, size = [], 0
    _encode(tok, batch, out)
    dtype = np.dtype(spec.dtype)
    train, val = (np.concatenate(out[k]).astype(dtype) if out[k] else np.zeros(0, dtype) for k in (False, True))
    return UnitTokens(unit.index, train, val, time.perf_counter() - t0)


def _encode(tok: TextTokenizer, batch: list[tuple[str, bool, bool]], out: dict[bool, list[np.ndarray]]) -> None:
    if not batch:
        return
    eot = np.array([tok.eot_id], dtype=np.int64)
    for (_, val, last), ids in zip(batch, tok.encode_batch([p for p, _, _ in batch]), strict=True):
        out[val].append(np.concatenate([ids, eot]) if last else ids)


_TOKENIZER: TextTokenizer | None = None
_SPEC: TokenizeSpec | None = None


def _start_worker(spec: TokenizeSpec) -> None:
    global _TOKENIZER, _SPEC
    with contextlib.suppress(OSError, AttributeError):  # Linux: die with the rank, even on its kill -9
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the rank's to handle
    os.environ["TOKENIZERS_PARALLELISM"] = "false"  # one core per worker: the pool is the parallelism
    _TOKENIZER, _SPEC = load_tokenizer(spec.tokenizer, "data.tokenizer"), spec


def _work(unit: Unit) -> UnitTokens:
    assert _TOKENIZER is not None and _SPEC is not None
    return tokenize_unit(unit, _TOKENIZER, _SPEC)


class TokenizerPool:
    """Units tokenized ahead in ``workers`` forked processes (0: in the calling process, when asked for)."""

    def __init__(self, spec: TokenizeSpec, workers: int) -> None:
        self.spec, self.workers = spec, workers
        self._pool: ProcessPoolExecutor | None = None
        self._local: TextTokenizer | None = None

    def submit(self, unit: Unit) -> Future[UnitTokens]:
        if self.workers == 0:
            return self._here(unit)
        if self._pool is None:
            ctx = multiprocessing.get_context("fork")
            self._pool = ProcessPoolExecutor(self.workers, ctx, _start_worker, (self.spec,))
        return self._pool.submit(_work, unit)

    def _here(self, unit: Unit) -> Future[UnitTokens]:
        fut: Future[UnitTokens] = Future()
        if self._local is None:
            self._local = load_tokenizer(self.spec.tokenizer, "data.tokenizer")
        try:
            fut.set_result(tokenize_unit(unit, self._local, self.spec))
        except Exception as e:  # handed over as a worker's would be
            fut.set_exception(e)
        return fut

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)
            self._pool = None

    def __getstate__(self) -> dict[str, Any]:  # a copy sent to another process starts its own pool
        return {**self.__dict__, "_pool": None, "_local": None}


def default_workers() -> int:
    """Tokenizer processes per rank: this machine's cores over its ranks (torchrun's LOCAL_WORLD_SIZE), 1 to 4;
    0 (tokenize in this process) outside a torchrun worker, e.g. the parent's planner reading the first sample."""
    if "LOCAL_RANK" not in os.environ:
        return 0
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    ranks = int(os.environ.get("LOCAL_WORLD_SIZE", "1") or 1)
    return max(1, min(4, cores // max(ranks, 1)))


def tokenizer_path(spec: str) -> str:
    """``spec`` with a path made absolute (the workers may start elsewhere)."""
    return spec if spec == "bytes" else str(Path(spec).expanduser().resolve())
