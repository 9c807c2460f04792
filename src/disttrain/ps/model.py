"""The dense half of a DLRM-style click model; the embeddings live on the parameter servers.

bottom MLP(dense features) -> one vector; with the looked-up embedding of each categorical feature, all
pairwise dot products (the interaction) -> concatenated with the bottom vector -> top MLP -> one logit.
"""

from __future__ import annotations

import torch
from torch import nn


def mlp(sizes: list[int]) -> nn.Sequential:
    layers: list[nn.Module] = []
    for i in range(len(sizes) - 1):
        layers.append(nn.Linear(sizes[i], sizes[i + 1]))
        if i < len(sizes) - 2:
            layers.append(nn.ReLU())
    return nn.Sequential(*layers)


class DenseArch(nn.Module):
    """Everything but the embedding tables: ``forward(dense, embs)`` with ``embs`` (batch, tables, dim)."""

    def __init__(self, n_dense: int, n_tables: int, dim: int, hidden: int = 64) -> None:
        super().__init__()
        self.bottom = mlp([n_dense, hidden, dim])
        n = n_tables + 1
        self.pairs = torch.triu_indices(n, n, offset=1)
        self.top = mlp([dim + n * (n - 1) // 2, hidden, 1])

    def forward(self, dense: torch.Tensor, embs: torch.Tensor) -> torch.Tensor:
        x = self.bottom(dense)
        feats = torch.cat([x.unsqueeze(1), embs], dim=1)  # (batch, 1 + tables, dim)
        dots = feats @ feats.transpose(1, 2)
        inter = dots[:, self.pairs[0], self.pairs[1]]
        return self.top(torch.cat([x, inter], dim=1)).squeeze(1)
