"""Training from a prepared folder (``--data.path DIR`` with ``DIR/index.json``): memory-mapped next-token windows.

Window i of a shard is its tokens ``[i*T, i*T + T + 1)`` (T = ``model.context``): inputs the first T, targets the
last T. Windows never cross a shard's edge (a shard's last ``< T + 1`` tokens are not trained on; shards hold
millions of tokens, so that is a rounding). Shards are opened with ``np.memmap`` when first read: memory holds
only the pages of the windows in use, whatever the corpus's size. The held-out split is the index's val shards.
"""

from __future__ import annotations

import bisect
import dataclasses
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch.utils.data import Dataset

from disttrain.data.shards import INDEX, Shard, read_index, shards_of
from disttrain.data.tokenizers import TextTokenizer, load_tokenizer, saved_tokenizer
from disttrain.errors import ConfigError


def is_prepared(path: str | Path | None) -> bool:
    """Whether ``path`` is a folder made by ``disttrain data prepare`` (it holds an index)."""
    return path is not None and Path(path).is_dir() and (Path(path) / INDEX).is_file()


class ShardWindows(Dataset[tuple[torch.Tensor, torch.Tensor]]):
    """The next-token windows of ``context`` tokens over a list of shard files, memory-mapped."""

    def __init__(self, folder: Path, shards: list[Shard], dtype: str, context: int, vocab_size: int) -> None:
        self.folder, self.context, self.vocab_size = folder, context, vocab_size
        self.dtype = np.dtype(dtype).newbyteorder("<")
        self.shards = [s for s in shards if s.tokens > context]
        self.starts = [0]
        for s in self.shards:
            self.starts.append(self.starts[-1] + (s.tokens - 1) // context)
        self._maps: dict[int, np.ndarray] = {}

    def __len__(self) -> int:
        return self.starts[-1]

    def _map(self, k: int) -> np.ndarray:
        if k not in self._maps:
            shard = self.shards[k]
            self._maps[k] = np.memmap(self.folder / shard.file, dtype=self.dtype, mode="r", shape=(shard.tokens,))
        return self._maps[k]

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        if not 0 <= i < len(self):
            raise IndexError(f"window {i} of {len(self)}")
        k = bisect.bisect_right(self.starts, i) - 1
        at = (i - self.starts[k]) * self.context
        w = torch.from_numpy(self._map(k)[at : at + self.context + 1].astype(np.int64))
        return w[:-1], w[1:]

    def __getstate__(self) -> dict[str, Any]:  # memory maps are reopened in a process it is sent to
        return {**self.__dict__, "_maps": {}}


@dataclasses.dataclass
class PreparedData:
    """A prepared folder as train and val windows, with its index."""

    folder: Path
    index: dict[str, Any]
    train: ShardWindows
    val: ShardWindows | None

    @property
    def vocab_size(self) -> int:
        return int(self.index["vocab_size"])

    def tokenizer(self) -> TextTokenizer:
        return prepared_tokenizer(self.folder)


def prepared_tokenizer(path: str | Path) -> TextTokenizer:
    """The tokenizer the prepared folder at ``path`` was made with (its ``tokenizer.json``)."""
    folder = Path(path)
    tok = read_index(folder)["tokenizer"]
    return saved_tokenizer(folder, tok["spec"], int(tok["eot_id"]))


def check_tokenizer(folder: Path, index: dict[str, Any], spec: str | None) -> None:
    """``data.tokenizer`` (when given) must be the tokenizer the folder was prepared with."""
    made = index["tokenizer"]
    if spec is None or spec == made["spec"]:
        return
    same = False
    if spec not in ("chars",) and not spec.startswith("bpe:"):
        same = load_tokenizer(spec, "data.tokenizer").hash == made["sha256"]
    if not same:
        raise ConfigError(
            f"data.tokenizer {spec!r} is not the tokenizer {str(folder)!r} was prepared with ({made['spec']!r}, "
            f"sha256 {made['sha256'][:12]}); drop --data.tokenizer, or prepare the corpus again with {spec!r}"
        )


def load_prepared(path: str | Path, context: int, tokenizer: str | None = None, global_batch: int = 1) -> PreparedData:
    """The prepared folder at ``path`` as windows of ``context`` tokens; ConfigError (one line) for a folder that
    is not one, another tokenizer than ``tokenizer``, or fewer training windows than one global batch."""
    folder = Path(path)
    index = read_index(folder)
    check_tokenizer(folder, index, tokenizer)
    vocab, dtype = int(index["vocab_size"]), index["dtype"]
    train = ShardWindows(folder, shards_of(index, "train"), dtype, context, vocab)
    val = ShardWindows(folder, shards_of(index, "val"), dtype, context, vocab)
    if len(train) < global_batch:
        tokens = sum(s.tokens for s in shards_of(index, "train"))
        raise ConfigError(
            f"data.path {str(folder)!r} has {len(train)} training windows of {context + 1} tokens ({tokens} tokens), "
            f"fewer than one global batch ({global_batch}); use more data, a shorter --model.context or a smaller "
            "--train.global-batch"
        )
    for shard in (*train.shards, *val.shards):
        size = (folder / shard.file).stat().st_size if (folder / shard.file).is_file() else -1
        if size != shard.tokens * train.dtype.itemsize:
            raise ConfigError(
                f"data.path {str(folder)!r}: shard {shard.file} is missing or of the wrong size ({size} bytes, "
                f"the index says {shard.tokens * train.dtype.itemsize}); run `disttrain data verify {folder}`"
            )
    return PreparedData(folder, index, train, val if len(val) else None)
