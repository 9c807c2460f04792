"""n-step returns folded on the actor, per environment of a vector: the learner receives transitions
``(obs, action, R, next_obs, done, discount)`` with ``R = r_0 + g r_1 + ... + g^(k-1) r_(k-1)`` and
bootstraps with ``discount = g^k`` (k = n, or fewer at an episode's end), and episode returns and lengths."""

from __future__ import annotations

from collections import deque

import numpy as np
import torch

Step = tuple[np.ndarray, int, float]  # (obs, action, reward)


class NStepFolder:
    """Collects a vector of ``n_envs`` environments' steps; :meth:`take` empties what is ready."""

    def __init__(self, n_envs: int, n: int, gamma: float) -> None:
        self.n, self.gamma = n, gamma
        self.pending: list[deque[Step]] = [deque() for _ in range(n_envs)]
        self.out: list[tuple[np.ndarray, int, float, np.ndarray, float, float]] = []
        self.ep_return = np.zeros(n_envs)
        self.ep_len = np.zeros(n_envs, dtype=np.int64)
        self.episodes: list[tuple[float, int]] = []

    def _emit(self, e: int, next_obs: np.ndarray, done: bool) -> None:
        steps = self.pending[e]
        ret = sum(r * self.gamma**k for k, (_, _, r) in enumerate(steps))
        obs, action, _ = steps[0]
        self.out.append((obs, action, ret, next_obs, float(done), self.gamma ** len(steps)))
        steps.popleft()

    def add(
        self,
        obs: np.ndarray,
        actions: np.ndarray,
        rewards: np.ndarray,
        next_obs: np.ndarray,
        terminated: np.ndarray,
        truncated: np.ndarray,
    ) -> None:
        """One step of every environment; ``next_obs`` is each one's true next observation (the final one
        where an episode ended)."""
        self.ep_return += rewards
        self.ep_len += 1
        for e in range(len(self.pending)):
            self.pending[e].append((obs[e], int(actions[e]), float(rewards[e])))
            if terminated[e] or truncated[e]:
                while self.pending[e]:  # a terminal state is not bootstrapped; a time limit is
                    self._emit(e, next_obs[e], bool(terminated[e]))
                self.episodes.append((float(self.ep_return[e]), int(self.ep_len[e])))
                self.ep_return[e], self.ep_len[e] = 0.0, 0
            elif len(self.pending[e]) == self.n:
                self._emit(e, next_obs[e], False)

    def take(self) -> tuple[dict[str, torch.Tensor] | None, list[tuple[float, int]]]:
        """The transitions ready so far as a batch of tensors (None if none), and the episodes finished."""
        out, episodes = self.out, self.episodes
        self.out, self.episodes = [], []
        if not out:
            return None, episodes
        obs, action, ret, nxt, done, disc = zip(*out, strict=True)
        batch = {
            "obs": _obs(obs),
            "action": torch.tensor(action, dtype=torch.int64),
            "reward": torch.tensor(ret, dtype=torch.float32),
            "next_obs": _obs(nxt),
            "done": torch.tensor(done, dtype=torch.float32),
            "discount": torch.tensor(disc, dtype=torch.float32),
        }
        return batch, episodes


def _obs(rows: tuple[np.ndarray, ...]) -> torch.Tensor:
    """Observations as they travel to the learner: uint8 frames stay bytes, vectors become float32."""
    t = torch.from_numpy(np.stack(rows))
    return t if t.dtype == torch.uint8 else t.float()
