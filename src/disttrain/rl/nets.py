"""The networks: a Q-network (DQN) and a policy (REINFORCE), the same MLP body; choosing actions from either."""

from __future__ import annotations

import torch
from torch import nn


def mlp(obs_dim: int, hidden: int, out: int) -> nn.Sequential:
    layers = [nn.Linear(obs_dim, hidden), nn.ReLU(), nn.Linear(hidden, hidden), nn.ReLU(), nn.Linear(hidden, out)]
    return nn.Sequential(*layers)


def make_net(obs_dim: int, n_actions: int, hidden: int, seed: int) -> nn.Module:
    """Q-values (dqn) or action logits (reinforce) for a batch of observations; seeded."""
    torch.manual_seed(seed)
    return mlp(obs_dim, hidden, n_actions)


def choose(out: torch.Tensor, eps: torch.Tensor, algo: str, gen: torch.Generator) -> torch.Tensor:
    """Actions from the network's output for a batch: dqn is greedy except with probability ``eps`` per row
    (uniform then); reinforce samples the policy. The actor always chooses (with its own ``gen``), whether
    the output came from its own copy of the network or from the learner's batched forward, so both give
    the same actions for the same weights and observations."""
    if algo == "reinforce":
        return torch.multinomial(torch.softmax(out, dim=1), 1, generator=gen).squeeze(1)
    greedy = out.argmax(dim=1)
    explore = torch.rand(len(out), generator=gen) < eps
    random = torch.randint(0, out.shape[1], (len(out),), generator=gen)
    return torch.where(explore, random, greedy)
