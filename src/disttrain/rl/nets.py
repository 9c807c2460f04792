"""The networks: a Q-network (DQN) and a policy (REINFORCE) with an MLP body for vector observations, the
Nature-DQN convolutional Q-network for stacked frames (Atari); choosing actions from either."""

from __future__ import annotations

import torch
from torch import nn

from disttrain.errors import ConfigError
from disttrain.rl.envs import EnvSpec


def mlp(obs_dim: int, hidden: int, out: int) -> nn.Sequential:
    layers = [nn.Linear(obs_dim, hidden), nn.ReLU(), nn.Linear(hidden, hidden), nn.ReLU(), nn.Linear(hidden, out)]
    return nn.Sequential(*layers)


class NatureCNN(nn.Module):
    """Mnih et al. 2015's Q-network: conv 32 8x8 stride 4, 64 4x4 stride 2, 64 3x3 stride 1, fc 512, one output
    per action, ReLU between; input ``(N, 4, 84, 84)`` uint8 frames, scaled by 1/255 here (so observations
    travel and are stored as bytes)."""

    def __init__(self, shape: tuple[int, ...], n_actions: int) -> None:
        super().__init__()
        c, h, w = shape
        self.body = nn.Sequential(
            nn.Conv2d(c, 32, 8, stride=4),
            nn.ReLU(),
            nn.Conv2d(32, 64, 4, stride=2),
            nn.ReLU(),
            nn.Conv2d(64, 64, 3, stride=1),
            nn.ReLU(),
            nn.Flatten(),
        )
        with torch.no_grad():
            flat = self.body(torch.zeros(1, c, h, w)).shape[1]  # 3136 for 84x84
        self.head = nn.Sequential(nn.Linear(flat, 512), nn.ReLU(), nn.Linear(512, n_actions))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.body(x.float() / 255.0))


def make_net(obs_dim: int, n_actions: int, hidden: int, seed: int) -> nn.Module:
    """Q-values (dqn) or action logits (reinforce) for a batch of vector observations; seeded."""
    torch.manual_seed(seed)
    return mlp(obs_dim, hidden, n_actions)


def make_net_for(spec: EnvSpec, hidden: int, seed: int, algo: str = "dqn") -> nn.Module:
    """The network an environment's observations call for: the MLP for vectors, the Nature-DQN CNN for frames
    (dqn only); seeded."""
    check_algo(spec, algo)
    if not spec.image:
        return make_net(spec.obs_dim, spec.n_actions, hidden, seed)
    torch.manual_seed(seed)
    return NatureCNN(spec.obs_shape, spec.n_actions)


def check_algo(spec: EnvSpec, algo: str) -> None:
    """ConfigError unless ``algo`` can learn from ``spec``'s observations (reinforce: vectors only)."""
    if spec.image and algo != "dqn":
        raise ConfigError(
            f"rl.algo {algo} takes vector observations; frames (the Atari games) need --rl.algo dqn (the "
            "Nature-DQN Q-network)"
        )


def as_input(obs: torch.Tensor, spec: EnvSpec) -> torch.Tensor:
    """Observations as the network takes them: float32 vectors, uint8 frames (the network scales them)."""
    return obs if spec.image else obs.float()


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
