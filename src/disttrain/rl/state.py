"""The learner's checkpoint: networks, optimizer, replay and counters, with the atomic commit of every
disttrain checkpoint (``<run>/checkpoints/step-N``, N = learner updates)."""

from __future__ import annotations

from collections import deque
from pathlib import Path
from typing import Any

import torch

from disttrain.checkpoint.commit import begin, commit, latest, save_synced
from disttrain.rl.learner import Learner

COUNTERS = ("env_steps", "episodes", "updates", "version")


def learner_state(lr: Learner) -> dict[str, Any]:
    c = lr.c
    return {
        "net": lr.net.state_dict(),
        "target": lr.target.state_dict(),
        "opt": lr.opt.state_dict(),
        "replay": lr.replay.state_dict(),
        "counters": {k: getattr(c, k) for k in COUNTERS},
        "returns": torch.tensor(list(c.returns), dtype=torch.float64),
        "all_returns": torch.tensor(list(c.all_returns), dtype=torch.float64),
        "lengths": torch.tensor(list(c.lengths), dtype=torch.int64),
    }


def load_learner_state(lr: Learner, state: dict[str, Any]) -> None:
    lr.net.load_state_dict(state["net"])
    lr.target.load_state_dict(state["target"])
    lr.opt.load_state_dict(state["opt"])
    lr.replay.load_state_dict(state["replay"])
    for k in COUNTERS:
        setattr(lr.c, k, int(state["counters"][k]))
    lr.c.returns = deque(state["returns"].tolist(), maxlen=lr.c.returns.maxlen)
    lr.c.all_returns = deque(state["all_returns"].tolist(), maxlen=lr.c.all_returns.maxlen)
    lr.c.lengths = deque(state["lengths"].tolist(), maxlen=lr.c.lengths.maxlen)
    lr.refresh_acting()
    lr.c.version = int(state["counters"]["version"])


def save(run_dir: Path, lr: Learner) -> Path:
    tmp = begin(run_dir, lr.c.updates)
    save_synced(learner_state(lr), tmp / "learner.pt")
    return commit(tmp, lr.c.updates, env_steps=lr.c.env_steps)


def resume(run_dir: Path, lr: Learner) -> Path | None:
    """Load the newest complete checkpoint of the run into ``lr``; its folder, or None."""
    path = latest(run_dir)
    if path is not None:
        load_learner_state(lr, torch.load(path / "learner.pt", weights_only=True))
    return path
