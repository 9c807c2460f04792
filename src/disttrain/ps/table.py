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

    @torch.no_grad()
    def push(self, rows: torch.Tensor, grads: torch.Tensor) -> None:
        """Apply one step for the gradient rows ``grads`` of local rows ``rows`` (duplicates summed)."""
        if grads.shape != (len(rows), self.weight.shape[1]):
            raise ConfigError(f"push: {len(rows)} rows but gradients of shape {tuple(grads.shape)}")
        uniq, inverse = torch.unique(rows, return_inverse=True)
        g = torch.zeros(len(uniq), self.weight.shape[1], dtype=self.weight.dtype).index_add_(0, inverse, grads)
        if self.sum_sq is not None:
            sum_sq = self.sum_sq[uniq] + g * g  # gathered once (the same values as sum_sq[uniq] += g * g)
            self.sum_sq[uniq] = sum_sq
            self.weight.index_add_(0, uniq, -(self.lr * g / (sum_sq.sqrt() + self.eps)))
        else:
            self.weight.index_add_(0, uniq, -(self.lr * g))
        self.updates += 1

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
