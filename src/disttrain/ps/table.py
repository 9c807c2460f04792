"""One server's rows of one embedding table, with their optimizer state living beside them.

Rows are initialised from their *global* ids (blocks of rows drawn from generators seeded by block), so a
table sharded over any number of servers starts equal to the same table held whole in one process.
Updates are row-sparse: duplicate ids in a push are summed first, then SGD or Adagrad acts on those rows only.
"""

from __future__ import annotations

import torch

from disttrain.errors import ConfigError

OPTIMIZERS = ("adagrad", "sgd")
INIT_BLOCK = 4096


def init_rows(global_ids: torch.Tensor, dim: int, std: float, seed: int) -> torch.Tensor:
    """The initial values of rows ``global_ids``: the same whichever server (or process) draws them."""
    out = torch.empty(len(global_ids), dim)
    blocks = global_ids // INIT_BLOCK
    for b in torch.unique(blocks).tolist():
        gen = torch.Generator().manual_seed(seed * 1_000_003 + int(b))
        chunk = torch.randn(INIT_BLOCK, dim, generator=gen) * std
        here = (blocks == b).nonzero(as_tuple=True)[0]
        out[here] = chunk[global_ids[here] - b * INIT_BLOCK]
    return out


@torch.no_grad()
def sparse_step(
    weight: torch.Tensor, sum_sq: torch.Tensor | None, rows: torch.Tensor, grads: torch.Tensor, lr: float, eps: float
) -> None:
    """One row-sparse step of Adagrad (``sum_sq`` given) or SGD on ``weight``'s ``rows`` (duplicates summed)."""
    uniq, inverse = torch.unique(rows, return_inverse=True)
    g = torch.zeros(len(uniq), weight.shape[1], dtype=weight.dtype).index_add_(0, inverse, grads)
    if sum_sq is not None:
        summed = sum_sq[uniq] + g * g  # gathered once (the same values as sum_sq[uniq] += g * g)
        sum_sq[uniq] = summed
        weight.index_add_(0, uniq, -(lr * g / (summed.sqrt() + eps)))
    else:
        weight.index_add_(0, uniq, -(lr * g))


class ShardTable:
    """Rows ``global_ids`` of a ``dim``-wide table; :meth:`pull` reads rows, :meth:`push` applies gradients."""

    def __init__(
        self,
        global_ids: torch.Tensor,
        dim: int,
        *,
        optimizer: str = "adagrad",
        lr: float = 0.05,
        eps: float = 1e-8,
        init_std: float = 0.01,
        seed: int = 0,
    ) -> None:
        if optimizer not in OPTIMIZERS:
            raise ConfigError(f"ps.optimizer must be one of {', '.join(OPTIMIZERS)}, got {optimizer!r}")
        self.global_ids = global_ids
        self.weight = init_rows(global_ids, dim, init_std, seed)
        self.sum_sq = torch.zeros_like(self.weight) if optimizer == "adagrad" else None
        self.optimizer, self.lr, self.eps = optimizer, lr, eps
        self.updates = 0

    def pull(self, rows: torch.Tensor) -> torch.Tensor:
        return self.weight[rows]

    def push(self, rows: torch.Tensor, grads: torch.Tensor) -> None:
        """Apply one step for the gradient rows ``grads`` of local rows ``rows`` (duplicates summed)."""
        if grads.shape != (len(rows), self.weight.shape[1]):
            raise ConfigError(f"push: {len(rows)} rows but gradients of shape {tuple(grads.shape)}")
        sparse_step(self.weight, self.sum_sq, rows, grads, self.lr, self.eps)
        self.updates += 1

    @property
    def options(self) -> tuple[str, float, float, int]:
        """What must be the same for two tables to be updated as one (:class:`Arena`)."""
        return (self.optimizer, self.lr, self.eps, self.weight.shape[1])

    def state_dict(self) -> dict[str, torch.Tensor]:
        state = {"global_ids": self.global_ids, "weight": self.weight}
        if self.sum_sq is not None:
            state["sum_sq"] = self.sum_sq
        return state

    def load_state_dict(self, state: dict[str, torch.Tensor]) -> None:
        if not torch.equal(state["global_ids"], self.global_ids):
            raise ConfigError("a server checkpoint holds other rows than this server: same servers and sharding?")
        self.weight.copy_(state["weight"])
        if self.sum_sq is not None:
            self.sum_sq.copy_(state["sum_sq"])


class Arena:
    """Several tables of one server updated as one: their rows live in one tensor (each table's ``weight`` and
    ``sum_sq`` become views of it), so a step's pushes of every table are one :func:`sparse_step` and its
    reads one gather, not one per table. The tables must share optimizer, rate and width."""

    def __init__(self, tables: list[ShardTable]) -> None:
        self.tables = tables
        first = tables[0]
        self.lr, self.eps = first.lr, first.eps
        sizes = [len(t.weight) for t in tables]
        self.offsets = torch.tensor([0, *sizes[:-1]]).cumsum(0)
        self.weight = torch.cat([t.weight for t in tables])
        self.sum_sq = torch.cat([t.sum_sq for t in tables]) if first.sum_sq is not None else None  # type: ignore[misc]
        for t, start, n in zip(tables, self.offsets.tolist(), sizes, strict=True):
            t.weight = self.weight[start : start + n]
            if self.sum_sq is not None:
                t.sum_sq = self.sum_sq[start : start + n]

    @staticmethod
    def fits(tables: list[ShardTable]) -> bool:
        return len({t.options for t in tables}) == 1

    def rows(self, parts: list[torch.Tensor]) -> torch.Tensor:
        """Each table's local rows (``parts[i]`` of table i) as rows of the arena."""
        return torch.cat([p + off for p, off in zip(parts, self.offsets.tolist(), strict=True)])

    def push(self, rows: torch.Tensor, grads: torch.Tensor) -> None:
        sparse_step(self.weight, self.sum_sq, rows, grads, self.lr, self.eps)
