"""How big a unit of the corpus is: the one rule ``data prepare`` and the raw-file loader share, so both cut a
corpus into the same units (and so the same documents, held-out split and windows)."""

from __future__ import annotations

from collections.abc import Iterator

from disttrain.data.sources import Source, documents, plan_units
from disttrain.data.tokenizers import TextTokenizer
from disttrain.errors import ConfigError

UNITS_PER_CORPUS = 64
"""A corpus is cut into about this many units (at least 4 MiB each, at most one shard's worth): work for every core."""
MIN_UNIT_BYTES = 4 << 20
SAMPLE_CHARS = 1 << 20
SHARD_TOKENS = 1 << 26
"""``data prepare``'s default ``--shard-tokens``."""


def corpus_documents(sources: list[Source], field: str) -> Iterator[str]:
    """Every document of the corpus, in order, read in this process."""
    for unit in plan_units(sources, 1 << 62, field):
        yield from documents(unit, field)


def unit_bytes(sources: list[Source], tok: TextTokenizer, field: str, shard_tokens: int, names: str) -> int:
    """Bytes of input per unit: the corpus over :data:`UNITS_PER_CORPUS` (at least 4 MiB), at most one shard's
    worth at the bytes per token of the corpus's first MiB; ConfigError for a corpus without documents."""
    sample, size = [], 0
    for doc in corpus_documents(sources, field):
        sample.append(doc)
        size += len(doc.encode())
        if size >= SAMPLE_CHARS:
            break
    if not sample:
        raise ConfigError(f"the corpus ({names}) holds no documents once empty ones are left out; give files with text")
    tokens = sum(len(ids) for ids in tok.encode_batch(sample)) or 1
    per_shard = int(shard_tokens * max(size, 1) / tokens)
    total = sum(s.size for s in sources)
    return max(1024, min(per_shard, max(total // UNITS_PER_CORPUS, MIN_UNIT_BYTES)))
