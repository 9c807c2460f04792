"""Training straight from raw files (``--data.path corpus.jsonl --data.tokenizer T``, no prepare step).

The corpus is cut into the units ``data prepare`` would cut (:mod:`disttrain.data.units`); loader worker processes
tokenize them ahead of need (:mod:`disttrain.data.unit_tokens`). A unit's train ids and its windows are exactly a
prepared folder's shard and windows; the order differs (:mod:`disttrain.data.stream_order`: blocks of units, shuffled
within a block). Global sample position p maps to a window through unit token counts only, so a resume (after
``kill -9``, at another world size) continues with the same windows. A resume past the first block counts the
blocks before it again (tokenizing them: the counts are not stored).
"""

from __future__ import annotations

import bisect
import time
from concurrent.futures import Future
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch.utils.data import Dataset

from disttrain.data.shards import INDEX, dtype_for
from disttrain.data.sources import Unit, find_sources, plan_units
from disttrain.data.stream_order import BLOCK_BYTES, block_permutation, epoch_blocks, windows_of
from disttrain.data.tokenizers import TextTokenizer, load_tokenizer
from disttrain.data.unit_tokens import TokenizerPool, TokenizeSpec, UnitTokens, default_workers, tokenizer_path
from disttrain.data.units import SHARD_TOKENS, unit_bytes
from disttrain.errors import ConfigError

Window = tuple[torch.Tensor, torch.Tensor]
TEXT_FIELD = "text"
"""The field of a .jsonl record (the column of a .parquet file) that holds a document."""


class ArrayWindows(Dataset[Window]):
    """Next-token windows ``[i*T, i*T + T + 1)`` of in-memory token arrays (one per unit, never crossing one)."""

    def __init__(self, arrays: list[np.ndarray], context: int) -> None:
        self.arrays = [a for a in arrays if windows_of(len(a), context)]
        self.context = context
        self.starts = [0]
        for a in self.arrays:
            self.starts.append(self.starts[-1] + windows_of(len(a), context))

    def __len__(self) -> int:
        return self.starts[-1]

    def __getitem__(self, i: int) -> Window:
        k = bisect.bisect_right(self.starts, i) - 1
        return window(self.arrays[k], i - self.starts[k], self.context)


def window(tokens: np.ndarray, i: int, context: int) -> Window:
    w = torch.from_numpy(tokens[i * context : i * context + context + 1].astype(np.int64))
    return w[:-1], w[1:]


class Pace:
    """What the loader's workers did: tokens, their seconds, and the seconds the rank waited for them."""

    def __init__(self, workers: int) -> None:
        self.workers = max(workers, 1)
        self.tokens = 0
        self.seconds = self.waited = 0.0

    def add(self, done: UnitTokens) -> None:
        self.tokens += len(done.train) + len(done.val)
        self.seconds += done.seconds

    def tokens_per_s(self) -> float:
        """The workers' rate together (each one's measured rate times their number)."""
        return self.workers * self.tokens / self.seconds if self.seconds > 0 else float("inf")


class PaceWatch:
    """Times a job's first steps on raw files: the model's rate is the step time less the time spent waiting for
    tokens; :meth:`StreamWindows.pace_line` compares the loader's with it."""

    STEPS = 3
    """Steps timed after the first (which holds the start-up)."""

    def __init__(self, data: StreamWindows, tokens_per_step: int) -> None:
        self.data, self.tokens_per_step = data, tokens_per_step
        self.steps = 0
        self.t0 = self.waited0 = 0.0

    def step_done(self) -> str | None:
        """The pace line after the timed steps, None before and after."""
        self.steps += 1
        if self.steps == 1:
            self.t0, self.waited0 = time.perf_counter(), self.data.pace.waited
        if self.steps != 1 + self.STEPS:
            return None
        busy = time.perf_counter() - self.t0 - (self.data.pace.waited - self.waited0)
        return self.data.pace_line(self.STEPS * self.tokens_per_step / max(busy, 1e-9))


class StreamWindows(Dataset[Window]):
    """A raw corpus's training windows, addressed by global sample position (:meth:`at_positions`)."""

    def __init__(
        self, units: list[Unit], pool: TokenizerPool, context: int, seed: int, vocab_size: int, block_bytes: int
    ) -> None:
        self.units, self.pool, self.context = units, pool, context
        self.seed, self.vocab_size = seed, vocab_size
        self.block_bytes = block_bytes
        self.counts: dict[int, int] = {}  # unit -> training windows
        self.resident: dict[int, UnitTokens] = {}
        self.pending: dict[int, Future[UnitTokens]] = {}
        self.pace = Pace(pool.workers)
        self._blocks: dict[tuple[int, int], list[list[int]]] = {}
        self._perm: tuple[tuple[int, int, int], torch.Tensor, list[int]] | None = None
        self._serving: tuple[int, int, int] | None = None

    # -- tokens ----------------------------------------------------------------------------------
    def _fetch(self, units: list[int]) -> None:
        for u in units:
            if u not in self.resident and u not in self.pending:
                self.pending[u] = self.pool.submit(self.units[u])

    def tokens(self, u: int) -> UnitTokens:
        """Unit ``u``'s ids, waiting for its worker when they are not here yet."""
        if u not in self.resident:
            self._fetch([u])
            t0 = time.perf_counter()
            done = self.pending.pop(u).result()  # a ConfigError of the worker (bad JSON line, ...) comes out here
            self.pace.waited += time.perf_counter() - t0
            self.pace.add(done)
            self.resident[u] = done
            self.counts[u] = windows_of(len(done.train), self.context)
        return self.resident[u]

    def _windows(self, block: list[int]) -> int:
        self._fetch([u for u in block if u not in self.counts])
        for u in block:
            if u not in self.counts:
                self.tokens(u)
        return sum(self.counts[u] for u in block)

    # -- positions -------------------------------------------------------------------------------
    def total(self) -> int | None:
        """Training windows of the whole corpus, once every unit has been counted."""
        return sum(self.counts.values()) if len(self.counts) == len(self.units) else None

    def blocks(self, seed: int, epoch: int) -> list[list[int]]:
        key = (seed, epoch)
        if key not in self._blocks:
            self._blocks = {key: epoch_blocks([u.size for u in self.units], seed, epoch, self.block_bytes)}
        return self._blocks[key]

    def locate(self, p: int, seed: int) -> tuple[int, int, int]:
        """(epoch, block, offset in the block's order) of global position ``p``."""
        total = self.total()
        if total == 0:
            raise ConfigError(
                f"data.path: the corpus has no window of {self.context + 1} training tokens; use more data or a "
                "shorter --model.context"
            )
        epoch, off = divmod(p, total) if total else (0, p)
        for b, block in enumerate(self.blocks(seed, epoch)):
            n = self._windows(block)
            if off < n:
                return epoch, b, off
            off -= n
            if (seed, epoch, b) != self._serving:
                for u in block:  # counted, passed: not kept
                    self.resident.pop(u, None)
        return self.locate(p, seed)  # epoch 0 walked to its end: every unit is counted now

    def _next_block(self, seed: int, epoch: int, b: int) -> list[int]:
        blocks = self.blocks(seed, epoch)
        return (
            blocks[b + 1]
            if b + 1 < len(blocks)
            else epoch_blocks([u.size for u in self.units], seed, epoch + 1, self.block_bytes)[0]
        )

    def _serve(self, seed: int, epoch: int, b: int) -> None:
        """Entering a block: its next one is tokenized ahead; tokens of any other block are let go."""
        if self._serving == (seed, epoch, b):
            return
        self._serving = (seed, epoch, b)
        keep = set(self.blocks(seed, epoch)[b]) | set(self._next_block(seed, epoch, b))
        self.resident = {u: t for u, t in self.resident.items() if u in keep}
        self._fetch(sorted(keep, key=lambda u: u not in self.blocks(seed, epoch)[b]))

    def at(self, p: int, seed: int) -> Window:
        """The window at global position ``p`` under ``seed``'s order."""
        epoch, b, off = self.locate(p, seed)
        self._serve(seed, epoch, b)
        block = self.blocks(seed, epoch)[b]
        if self._perm is None or self._perm[0] != (seed, epoch, b):
            starts = [0]
            for u in block:
                starts.append(starts[-1] + self.counts[u])
            self._perm = ((seed, epoch, b), block_permutation(starts[-1], seed, epoch, b), starts)
        _, perm, starts = self._perm
        j = int(perm[off])
        k = bisect.bisect_right(starts, j) - 1
        return window(self.tokens(block[k]).train, j - starts[k], self.context)

    def at_positions(self, positions: list[int], seed: int) -> list[Window]:
        """The windows at these global positions (what :class:`~disttrain.data.loader.GlobalBatchLoader` asks)."""
        return [self.at(p, seed) for p in positions]

    def __getitem__(self, i: int) -> Window:
        return self.at(i, self.seed)

    def __len__(self) -> int:
        """The corpus's training windows (those counted so far, until every unit has been)."""
        return self.total() or max(sum(self.counts.values()), 1)

    def validation(self) -> ArrayWindows | None:
        """The held-out windows of the units of the first block (of epoch 0 under the job's seed)."""
        first = self.blocks(self.seed, 0)[0]
        self._fetch(first)
        found = ArrayWindows([self.tokens(u).val for u in sorted(first)], self.context)
        return found if len(found) else None

    def pace_line(self, trainer_tokens_per_s: float) -> str:
        """Whether the loader or the model sets the pace, from the first steps' figures."""
        rate = self.pace.tokens_per_s()
        ratio = rate / max(trainer_tokens_per_s, 1e-9)
        head = (
            f"data: tokenized on the fly at {rate:,.0f} tokens/s per rank ({self.pace.workers} worker(s)), "
            f"{ratio:.1f}x the {trainer_tokens_per_s:,.0f} tokens/s the model trains"
        )
        if ratio >= 1.5:
            return head + f"; waited {self.pace.waited:.1f}s for tokens so far"
        return (
            head + ": the loader sets the pace; tokenize once with `disttrain data prepare INPUT --tokenizer T "
            "--out DIR`, then --data.path DIR"
        )

    def pace_watch(self, tokens_per_step: int) -> PaceWatch:
        """A watch on the job's first steps (the Trainer prints its line once)."""
        return PaceWatch(self, tokens_per_step)

    def __getstate__(self) -> dict[str, Any]:  # tokens and futures stay in the process that made them
        return {**self.__dict__, "resident": {}, "pending": {}}


def is_raw(path: str | None, tokenizer: str | None) -> bool:
    """Whether ``data.path`` is trained on straight from raw files: a tokenizer other than ``chars`` (the bundled
    demo's character reading) given with files that are not a prepared folder."""
    return path is not None and tokenizer not in (None, "chars") and not (Path(path) / INDEX).is_file()


def raw_windows(
    path: str,
    tokenizer: str,
    context: int,
    seed: int,
    val_fraction: float,
    workers: int | None = None,
    block_bytes: int = BLOCK_BYTES,
) -> tuple[StreamWindows, ArrayWindows | None]:
    """The raw corpus at ``path`` (a file or folder) as training windows tokenized on the fly and the held-out
    windows of its first block; ConfigError (one line) for what :func:`check_raw` finds."""
    units, tok = plan_raw(path, tokenizer)
    spec = TokenizeSpec(tokenizer_path(tokenizer), TEXT_FIELD, val_fraction, dtype_for(tok.vocab_size))
    pool = TokenizerPool(spec, default_workers() if workers is None else workers)
    train = StreamWindows(units, pool, context, seed, tok.vocab_size, block_bytes)
    return train, train.validation()


def plan_raw(path: str, tokenizer: str) -> tuple[list[Unit], TextTokenizer]:
    """The units ``data prepare`` would cut ``path`` into, and the tokenizer; what the parent checks up front (the
    files, the tokenizer, the first MiB of documents, parquet columns)."""
    try:
        sources = find_sources([path])
        tok = load_tokenizer(tokenizer, "data.tokenizer")
        size = unit_bytes(sources, tok, TEXT_FIELD, SHARD_TOKENS, path)
        return plan_units(sources, size, TEXT_FIELD), tok
    except ConfigError as e:
        raise ConfigError(f"data.path: {e}" if str(e).startswith("input ") else str(e)) from None


def check_size(train: StreamWindows, global_batch: int) -> None:
    """A corpus counted whole (its first block is all of it) must fill one global batch, as a prepared one must."""
    total = train.total()
    if total is not None and total < global_batch:
        raise ConfigError(
            f"data.path has {total} training windows of {train.context + 1} tokens, fewer than one global batch "
            f"({global_batch}); use more data, a shorter --model.context or a smaller --train.global-batch"
        )
