"""Click logs: a synthetic generator with a known ground truth, and a streaming reader of the Criteo format.

The generator draws categorical ids with a Zipf-like skew (a few ids are hot, as in real logs) and labels
from a hidden logistic model over per-id weights and dense features, so the best achievable AUC is known.
The Criteo display-ads format is one sample per line, tab-separated: the label, 13 integer features and 26
hexadecimal categorical hashes, any feature possibly empty; ids are hashed into each table's rows.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import torch

from disttrain.errors import ConfigError

CRITEO_DENSE, CRITEO_SPARSE = 13, 26


@dataclass
class Batch:
    dense: torch.Tensor
    """(batch, n_dense) float features."""
    ids: torch.Tensor
    """(batch, n_tables) int64 row ids, each within its table."""
    label: torch.Tensor
    """(batch,) float 0/1."""


class ClickLog:
    """A synthetic click log: ``tables`` rows per categorical feature, ``n_dense`` dense features."""

    def __init__(self, tables: list[int], n_dense: int = 13, *, skew: float = 1.05, seed: int = 0) -> None:
        self.tables, self.n_dense = tables, n_dense
        gen = torch.Generator().manual_seed(seed)
        self.ranks_to_ids = [torch.randperm(rows, generator=gen) for rows in tables]
        popularity = [1.0 / torch.arange(1, rows + 1, dtype=torch.float64) ** skew for rows in tables]
        # inverse-CDF sampling: one searchsorted per draw, not a pass over the whole table as multinomial makes
        self.cdf = [(p.cumsum(0) / p.sum()).clamp_(max=1.0) for p in popularity]
        self.id_weight = [torch.randn(rows, generator=gen) * 0.8 for rows in tables]  # the hidden model
        self.dense_weight = torch.randn(n_dense, generator=gen) * 0.5
        self.bias = -1.0

    def logits(self, dense: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
        """The hidden model's logit for each sample (the ceiling any learner can reach)."""
        z = self.bias + dense @ self.dense_weight
        for t, w in enumerate(self.id_weight):
            z = z + w[ids[:, t]]
        return z

    def held_out(self, n: int, seed: int) -> Batch:
        return self.batch(n, torch.Generator().manual_seed(seed + 999_983))

    def ceiling(self, b: Batch) -> float:
        """The AUC of the hidden model itself on ``b``."""
        return auc(self.logits(b.dense, b.ids), b.label)

    def batch(self, size: int, gen: torch.Generator) -> Batch:
        ids = torch.stack(
            [
                r2i[
                    torch.searchsorted(cdf, torch.rand(size, generator=gen, dtype=torch.float64)).clamp_(
                        max=len(cdf) - 1
                    )
                ]
                for r2i, cdf in zip(self.ranks_to_ids, self.cdf, strict=True)
            ],
            dim=1,
        )
        dense = torch.randn(size, self.n_dense, generator=gen)
        p = torch.sigmoid(self.logits(dense, ids))
        return Batch(dense, ids, torch.bernoulli(p, generator=gen))


def parse_criteo_line(line: str, tables: list[int], where: str) -> tuple[float, list[float], list[int]]:
    """(label, dense, ids) of one line; ConfigError naming ``where`` (file:line) if it is malformed."""
    fields = line.rstrip("\n").split("\t")
    if len(fields) != 1 + CRITEO_DENSE + CRITEO_SPARSE:
        raise ConfigError(f"{where}: {len(fields)} tab-separated fields, the Criteo format has 40 (label, 13, 26)")
    try:
        label = float(int(fields[0]))
        dense = [math.log1p(max(int(v), 0)) if v else 0.0 for v in fields[1 : 1 + CRITEO_DENSE]]
        hashes = [int(v, 16) if v else 0 for v in fields[1 + CRITEO_DENSE :]]
    except ValueError as e:
        raise ConfigError(f"{where}: not a Criteo line ({e})") from None
    if label not in (0.0, 1.0):
        raise ConfigError(f"{where}: the label must be 0 or 1, got {fields[0]!r}")
    return label, dense, [h % tables[t % len(tables)] for t, h in enumerate(hashes)]


def read_criteo(path: str | Path, tables: list[int], batch_size: int, skip: int = 0) -> Iterator[Batch]:
    """Stream batches from a Criteo-format file (never loaded whole), after its first ``skip`` samples;
    ``tables`` rows per categorical feature (one size for all 26, or 26 sizes)."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"data.path {path} does not exist; point it at a Criteo-format .tsv file")
    rows: list[tuple[float, list[float], list[int]]] = []
    with open(path, encoding="utf-8", errors="strict") as f:
        for n, line in enumerate(f, start=1):
            if not line.strip():
                continue
            if skip:
                skip -= 1
                continue
            rows.append(parse_criteo_line(line, tables, f"{path}:{n}"))
            if len(rows) == batch_size:
                yield _to_batch(rows)
                rows = []
    if rows:
        yield _to_batch(rows)


def _to_batch(rows: list[tuple[float, list[float], list[int]]]) -> Batch:
    labels, dense, ids = zip(*rows, strict=True)
    return Batch(torch.tensor(dense), torch.tensor(ids, dtype=torch.int64), torch.tensor(labels))


class CriteoFile:
    """Batches from a Criteo-format file with the same interface as :class:`ClickLog`: the first ``held_out``
    samples are the evaluation set, training reads the rest in order (from the start again at the end)."""

    def __init__(self, path: str | Path, tables: list[int], held_out: int) -> None:
        self.path = Path(path)
        self.tables = tables if len(tables) == CRITEO_SPARSE else tables[:1] * CRITEO_SPARSE
        self.n_eval = held_out
        self._stream: Iterator[Batch] | None = None

    def held_out(self, n: int, seed: int) -> Batch:
        return next(read_criteo(self.path, self.tables, n))

    def ceiling(self, b: Batch) -> float:
        return float("nan")  # real data: no known ground truth

    def seek(self, batches: int, size: int) -> None:
        """Go on after ``batches`` batches of ``size``, as an uninterrupted run would (a resumed job)."""
        with open(self.path, encoding="utf-8", errors="strict") as f:
            samples = sum(1 for line in f if line.strip())
        per_pass = max((samples - self.n_eval) // size, 1)
        self._stream = read_criteo(self.path, self.tables, size, skip=self.n_eval + (batches % per_pass) * size)

    def batch(self, size: int, gen: torch.Generator) -> Batch:
        while True:
            if self._stream is None:
                self._stream = read_criteo(self.path, self.tables, size, skip=self.n_eval)
            b = next(self._stream, None)
            if b is not None and len(b.label) == size:
                return b
            self._stream = None  # the end (or a short last batch): start again


def write_criteo(path: Path, log: ClickLog, n: int, seed: int = 0) -> None:
    """A Criteo-format file of ``n`` samples from ``log`` (dense features as non-negative integers)."""
    b = log.batch(n, torch.Generator().manual_seed(seed))
    with open(path, "w") as f:
        for i in range(n):
            dense = [str(int(abs(v) * 10)) for v in b.dense[i, :CRITEO_DENSE].tolist()]
            dense += [""] * (CRITEO_DENSE - len(dense))
            ids = [format(int(v), "x") for v in b.ids[i].tolist()][:CRITEO_SPARSE]
            ids += [""] * (CRITEO_SPARSE - len(ids))
            f.write("\t".join([str(int(b.label[i])), *dense, *ids]) + "\n")


def auc(scores: torch.Tensor, labels: torch.Tensor) -> float:
    """Area under the ROC curve (Mann-Whitney U over ranks, ties given their average rank)."""
    _, inverse, counts = torch.unique(scores, return_inverse=True, return_counts=True)
    ends = torch.cumsum(counts, 0).double()
    ranks = (ends - (counts.double() - 1) / 2)[inverse]
    pos = labels.bool()
    n_pos, n_neg = int(pos.sum()), int((~pos).sum())
    if n_pos == 0 or n_neg == 0:
        return float("nan")
    return float((ranks[pos].sum() - n_pos * (n_pos + 1) / 2) / (n_pos * n_neg))
