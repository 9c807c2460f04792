"""Generated multi-document corpora for the data tests: distinct documents of a few to a few hundred words
(some multi-line, some beyond ASCII), as .jsonl (gzipped when the name ends in .gz)."""

from __future__ import annotations

import gzip
import json
import random
from pathlib import Path

WORDS = [
    "the",
    "quick",
    "brown",
    "fox",
    "jumps",
    "over",
    "a",
    "lazy",
    "dog;",
    "seven",
    "wise",
    "owls",
    "sing",
    "of",
    "rivers,",
    "mountains",
    "and",
    "élan",
    "—",
    "日本",
    "🙂",
]


def make_docs(n: int, seed: int = 0) -> list[str]:
    """``n`` distinct documents of a few to a few hundred words (some multi-line, some unicode)."""
    rng = random.Random(seed)
    return [
        f"doc {i}: " + " ".join(rng.choice(WORDS) for _ in range(rng.randint(3, 120))) + "\n" * (i % 3)
        for i in range(n)
    ]


def write_jsonl(path: Path, docs: list[str], field: str = "text") -> Path:
    lines = [json.dumps({"id": i, field: d}) for i, d in enumerate(docs)]
    data = ("\n".join(lines) + "\n").encode()
    path.write_bytes(gzip.compress(data) if path.suffix == ".gz" else data)
    return path
