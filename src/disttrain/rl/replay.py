"""Experience replay for the learner: a ring buffer of n-step transitions, uniform or prioritized (Ape-X).

Transitions arrive in chunks from actors already folded over n steps, so each carries the ``discount``
(gamma**n) the learner bootstraps with, and ``done`` (terminated: no bootstrap). Storage is preallocated
tensors written and read with index tensors; a :class:`SumTree` over the priorities makes prioritized
sampling and priority updates O(log capacity) per transition, vectorised over a whole batch.
Observations are stored in the dtype they arrive in: float32 vectors, or uint8 frames (Atari: 4x84x84 bytes,
28 KB per observation, two per transition; see ``rl.replay_capacity`` for the default capacity per kind).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from torch import Tensor

from disttrain.errors import ConfigError

# key -> (dtype, holds an observation row rather than a scalar)
FIELDS: dict[str, tuple[torch.dtype, bool]] = {
    "obs": (torch.float32, True),
    "action": (torch.int64, False),
    "reward": (torch.float32, False),
    "next_obs": (torch.float32, True),
    "done": (torch.float32, False),
    "discount": (torch.float32, False),
}


def _cpu(x: Tensor, dtype: torch.dtype) -> Tensor:
    """``x`` as a flat CPU tensor of ``dtype``, detached (TD errors may come straight from a GPU loss)."""
    return torch.as_tensor(x).detach().to("cpu", dtype).reshape(-1)


class SumTree:
    """A binary tree whose every node holds the sum of its two children, leaves holding priorities.

    Stored flat in a numpy float64 array of 2*P entries (P = capacity rounded up to a power of two): the root
    at 1, node i's children at 2i and 2i+1, leaf j at P+j. Padding leaves stay 0 and are never found.
    Parents are always recomputed from their children (never patched by deltas), so sums do not drift.
    numpy rather than torch inside: the per-level steps act on a few hundred entries, where numpy's per-call
    cost is several times lower. Indices, priorities and values go in and out as tensors.
    """

    def __init__(self, capacity: int) -> None:
        if capacity < 1:
            raise ConfigError(f"replay: the sum tree's capacity must be >= 1, got {capacity}")
        self.capacity = capacity
        self.leaves = 1 << (capacity - 1).bit_length()
        self.depth = self.leaves.bit_length() - 1  # levels below the root
        self.tree = np.zeros(2 * self.leaves, dtype=np.float64)

    def _leaves(self, indices: Tensor) -> np.ndarray:
        """``indices`` (checked in range) as an int64 array."""
        idx = _cpu(indices, torch.int64).numpy()
        if len(idx) and (int(idx.min()) < 0 or int(idx.max()) >= self.capacity):
            raise ValueError(
                f"replay: leaf indices must be in [0, {self.capacity}), got [{int(idx.min())}, {int(idx.max())}]"
            )
        return idx

    def update(self, indices: Tensor, priorities: Tensor) -> None:
        """Set leaves ``indices`` to ``priorities`` (the last one wins for a repeated index), then their
        ancestors, one vectorised step per level."""
        idx = self._leaves(indices)
        pri = _cpu(priorities, torch.float64).numpy()
        if len(pri) != len(idx):
            raise ValueError(f"replay: {len(idx)} indices but {len(pri)} priorities")
        if not len(idx):
            return
        order = np.argsort(idx, kind="stable")  # keep the last write of each index, as a loop would
        idx, pri = idx[order], pri[order]
        last = np.append(idx[1:] != idx[:-1], True)
        nodes = idx[last] + self.leaves
        self.tree[nodes] = pri[last]
        for _ in range(self.depth):  # a parent listed twice is written twice with the same sum: harmless
            nodes = nodes // 2
            self.tree[nodes] = self.tree[2 * nodes] + self.tree[2 * nodes + 1]

    def total(self) -> float:
        return float(self.tree[1])

    def get(self, indices: Tensor) -> Tensor:
        """The priorities at leaves ``indices`` (float64)."""
        return torch.from_numpy(self.tree[self._leaves(indices) + self.leaves])

    def find(self, values: Tensor) -> Tensor:
        """For each prefix sum in [0, total), the leaf i with cumsum[i-1] <= value < cumsum[i] (int64).

        All values descend together, one level at a time. A value that rounding pushes past a subtree's sum
        goes left rather than into an empty right subtree, so a zero-priority leaf is never returned
        (unless every leaf is zero).
        """
        v = _cpu(values, torch.float64).numpy()
        nodes = np.ones(len(v), dtype=np.int64)
        for _ in range(self.depth):
            left = self.tree[2 * nodes]
            right = (v >= left) & (self.tree[2 * nodes + 1] > 0)
            v = np.where(right, v - left, v)
            nodes = 2 * nodes + right
        return torch.from_numpy(nodes - self.leaves)


class ReplayBuffer:
    """A fixed-capacity ring of transitions, sampled uniformly or in proportion to priority**alpha.

    ``add`` writes a chunk at the write position, wrapping around and overwriting the oldest transitions.
    Prioritized: a transition added without a priority gets the largest seen so far (1.0 at first), so it
    is sampled soon; ``sample`` draws one value per equal segment of the total (stratified) and returns
    importance weights (N * P(i))**-beta over their max. All randomness comes from the buffer's own seeded
    generator, which ``state_dict`` saves, so a restored buffer samples exactly what the original would have.
    """

    def __init__(
        self,
        capacity: int,
        obs_dim: int | tuple[int, ...],
        *,
        prioritized: bool = False,
        alpha: float = 0.6,
        eps: float = 1e-6,
        seed: int = 0,
        obs_dtype: torch.dtype = torch.float32,
    ) -> None:
        shape = (obs_dim,) if isinstance(obs_dim, int) else tuple(obs_dim)
        if capacity < 1:
            raise ConfigError(f"replay: capacity must be >= 1, got {capacity}")
        if not shape or min(shape) < 1:
            raise ConfigError(f"replay: obs_dim must be >= 1, got {obs_dim}")
        if alpha < 0:
            raise ConfigError(f"replay: alpha must be >= 0, got {alpha}")
        if eps < 0:
            raise ConfigError(f"replay: eps must be >= 0, got {eps}")
        self._capacity, self.obs_shape, self.prioritized = capacity, shape, prioritized
        self.obs_dim: int | tuple[int, ...] = shape[0] if len(shape) == 1 else shape
        self.obs_dtype = obs_dtype
        self.alpha, self.eps = float(alpha), float(eps)
        self.storage = {
            k: torch.zeros((capacity, *shape), dtype=obs_dtype) if row else torch.zeros(capacity, dtype=dt)
            for k, (dt, row) in FIELDS.items()
        }
        self.pos = 0  # next slot to write
        self.size = 0
        self._added = 0
        self.max_priority = 1.0  # largest |p| + eps seen, before the power alpha
        self.tree = SumTree(capacity) if prioritized else None
        self.generator = torch.Generator().manual_seed(seed)

    @property
    def nbytes(self) -> int:
        """Bytes the storage holds (observations dominate: two per transition)."""
        return sum(v.numel() * v.element_size() for v in self.storage.values())

    @property
    def capacity(self) -> int:
        return self._capacity

    @property
    def added(self) -> int:
        """Transitions ever added, overwritten ones included."""
        return self._added

    def __len__(self) -> int:
        return self.size

    def _chunk(self, batch: dict[str, Tensor]) -> tuple[int, dict[str, Tensor]]:
        """Check a chunk's keys and shapes; return its length and its fields in storage dtypes."""
        missing = [k for k in FIELDS if k not in batch]
        if missing:
            raise ValueError(f"replay: the chunk lacks {', '.join(missing)} (it needs {', '.join(FIELDS)})")
        obs = torch.as_tensor(batch["obs"])
        n = obs.shape[0] if obs.dim() else 0
        out: dict[str, Tensor] = {}
        for k, (dtype, row) in FIELDS.items():
            v = torch.as_tensor(batch[k])
            if row and tuple(v.shape) != (n, *self.obs_shape):
                raise ValueError(
                    f"replay: {k} of shape {tuple(v.shape)} does not match obs_dim {self.obs_dim} "
                    f"(expected {(n, *self.obs_shape)})"
                )
            if not row and v.numel() != n:
                raise ValueError(f"replay: {k} has {v.numel()} entries for {n} transitions")
            out[k] = v.detach().to("cpu", self.obs_dtype) if row else _cpu(v, dtype)
        return n, out

    def _stored_priorities(self, priorities: Tensor, n: int) -> Tensor:
        """(|p| + eps) as float64, checked (``n`` of them, finite); raises the running max."""
        p = _cpu(priorities, torch.float64).abs() + self.eps
        if len(p) != n:
            raise ValueError(f"replay: {len(p)} priorities for {n} transitions")
        if len(p) and not bool(torch.isfinite(p).all()):
            raise ValueError("replay: priorities must be finite (got nan or inf)")
        if len(p):
            self.max_priority = max(self.max_priority, float(p.max()))
        return p

    def add(self, batch: dict[str, Tensor], priorities: Tensor | None = None) -> None:
        """Append a chunk of transitions (keys obs, action, reward, next_obs, done, discount), overwriting the
        oldest when full. ``priorities`` (prioritized buffers only; e.g. the actor's |TD error|) are stored as
        (|p| + eps)**alpha; without them the chunk gets the largest priority seen so far."""
        n, fields = self._chunk(batch)
        p = None if priorities is None else self._stored_priorities(priorities, n)
        if n == 0:
            return
        drop = max(0, n - self._capacity)  # a chunk longer than the buffer: only its tail survives
        start = (self.pos + drop) % self._capacity
        slots = (start + torch.arange(n - drop)) % self._capacity
        for k, v in fields.items():
            self.storage[k][slots] = v[drop:]
        if self.tree is not None:
            p = torch.full((n,), self.max_priority, dtype=torch.float64) if p is None else p
            self.tree.update(slots, p[drop:] ** self.alpha)
        self.pos = (start + len(slots)) % self._capacity
        self.size = min(self.size + n, self._capacity)
        self._added += n

    def sample(self, n: int, beta: float = 0.4) -> tuple[dict[str, Tensor], Tensor, Tensor]:
        """``n`` transitions (with replacement): (batch, slot indices int64, importance weights float32).

        Uniform buffers return weights of 1. Prioritized: weights (N * P(i))**-beta divided by their max,
        N the number of stored transitions.
        """
        if self.size == 0:
            raise ValueError("replay: cannot sample from an empty buffer; add transitions first")
        if n < 1:
            raise ValueError(f"replay: sample size must be >= 1, got {n}")
        if beta < 0:
            raise ValueError(f"replay: beta must be >= 0, got {beta}")
        if self.tree is None:
            indices = torch.randint(0, self.size, (n,), generator=self.generator)
            weights = torch.ones(n, dtype=torch.float32)
        else:
            total = self.tree.total()
            u = torch.rand(n, generator=self.generator, dtype=torch.float64)
            indices = self.tree.find((torch.arange(n, dtype=torch.float64) + u) * (total / n))
            indices = indices.clamp_(max=self.size - 1)  # guards rounding; leaves past size hold 0
            probs = self.tree.get(indices) / total
            w = (self.size * probs) ** (-beta)
            weights = (w / w.max()).to(torch.float32)
        return {k: v[indices] for k, v in self.storage.items()}, indices, weights

    def update_priorities(self, indices: Tensor, priorities: Tensor) -> None:
        """Set the priorities of slots ``indices`` (e.g. to the learner's |TD error|): stored as
        (|p| + eps)**alpha. A uniform buffer ignores them, so the learner may call this either way."""
        if self.tree is None:
            return
        indices = _cpu(indices, torch.int64)
        if len(indices) and (int(indices.min()) < 0 or int(indices.max()) >= self.size):
            raise ValueError(f"replay: priority update for slots outside the {self.size} filled ones")
        p = self._stored_priorities(priorities, len(indices))
        self.tree.update(indices, p**self.alpha)

    def _config(self) -> dict[str, Any]:
        return {
            "capacity": self._capacity,
            "obs_dim": self.obs_dim,
            "prioritized": self.prioritized,
            "alpha": self.alpha,
            "eps": self.eps,
        }

    def state_dict(self) -> dict[str, Any]:
        """Everything a fresh buffer needs to continue exactly: tensors, ints, floats and bools only (loadable
        with ``torch.load(weights_only=True)``). Storage is saved up to the filled size; the tensors are views
        of the live ones, as with ``nn.Module.state_dict``, so save them before adding more."""
        state: dict[str, Any] = {**self._config(), "pos": self.pos, "size": self.size, "added": self._added}
        state["max_priority"] = self.max_priority
        state["rng"] = self.generator.get_state()
        state.update({k: v[: self.size] for k, v in self.storage.items()})
        if self.tree is not None:
            state["tree"] = torch.from_numpy(self.tree.tree)
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore a buffer saved by :meth:`state_dict`; its configuration must match this one's."""
        mine = self._config()
        theirs = {k: state.get(k) for k in mine}
        if theirs != mine:
            raise ValueError(f"replay: the saved buffer has {theirs} but this one has {mine}")
        size = int(state["size"])
        if not 0 <= size <= self._capacity or not 0 <= int(state["pos"]) < self._capacity:
            raise ValueError(f"replay: saved size {size} / pos {state['pos']} do not fit capacity {self._capacity}")
        shapes = {k: (size, *v.shape[1:]) for k, v in self.storage.items()}
        if self.tree is not None:
            shapes["tree"] = self.tree.tree.shape
        for k, shape in shapes.items():  # all checked before anything changes
            if tuple(state[k].shape) != shape:
                raise ValueError(f"replay: saved {k} has shape {tuple(state[k].shape)}, expected {shape}")
        for k, v in self.storage.items():
            v.zero_()
            v[:size] = state[k]
        if self.tree is not None:
            self.tree.tree[:] = state["tree"].numpy()
        self.pos, self.size, self._added = int(state["pos"]), size, int(state["added"])
        self.max_priority = float(state["max_priority"])
        self.generator.set_state(state["rng"])
