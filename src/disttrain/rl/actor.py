"""An actor: a vector of environments, played with its own copy of the network (pulled from the learner
every ``rl.sync_every`` updates) or with the learner's batched answers (``rl.inference = learner``), and
sent to the learner a chunk at a time: ``rl.chunk`` steps of every environment per RPC, not one per step."""

from __future__ import annotations

import time
from typing import Any

import numpy as np
import torch

from disttrain.rl import learner, updates
from disttrain.rl.config import RLJobConfig
from disttrain.rl.envs import EnvSpec, make_vec
from disttrain.rl.nets import as_input, choose, make_net_for
from disttrain.rl.nstep import NStepFolder
from disttrain.rpc import transport
from disttrain.utils import hooks


class Actor:
    def __init__(self, job: RLJobConfig, index: int, spec: EnvSpec, rank: int, learner_name: str = "learner") -> None:
        cfg = job.rl
        self.cfg, self.index, self.rank, self.to = cfg, index, rank, learner_name
        self.seed = job.train.seed * 1000 + index
        self.env = make_vec(cfg.env_id, cfg.envs_per_actor, self.seed)
        self.spec = spec
        self.net = make_net_for(spec, cfg.hidden, job.train.seed, cfg.algo)
        self.gen = torch.Generator().manual_seed(self.seed)
        self.eps = torch.tensor(cfg.epsilon(index))
        n = cfg.n_step if cfg.algo == "dqn" else 1
        self.folder = NStepFolder(cfg.envs_per_actor, n, cfg.gamma)
        self.trajs: list[list[tuple[np.ndarray, int, float]]] = [[] for _ in range(cfg.envs_per_actor)]
        self.finished: list[dict[str, torch.Tensor]] = []
        self.version = -1
        self.steps = 0

    def sync(self) -> None:
        self.version, state = transport.call(self.to, learner.get_weights)
        self.net.load_state_dict(state)

    def output(self, obs: torch.Tensor) -> torch.Tensor:
        if self.cfg.inference == "learner":
            return transport.call(self.to, learner.infer, obs)
        with torch.no_grad():
            return self.net(obs)

    def play(self, obs: np.ndarray) -> np.ndarray:
        """``rl.chunk`` steps of every environment; the observation to go on from."""
        self.eps = torch.tensor(self.cfg.epsilon(self.index, self.steps * self.cfg.actors))  # ~ the job's steps
        for _ in range(self.cfg.chunk):
            out = self.output(as_input(torch.from_numpy(obs), self.spec))  # frames travel as uint8
            actions = choose(out, self.eps, self.cfg.algo, self.gen).numpy()
            nxt, rewards, term, trunc, info = self.env.step(actions)
            true_next = nxt.copy()
            for e in np.flatnonzero(term | trunc):
                true_next[e] = info["final_obs"][e]
            if self.cfg.algo == "reinforce":
                self._record(obs, actions, rewards, term | trunc)
            self.folder.add(obs, actions, rewards, true_next, term, trunc)
            obs = nxt
        self.steps += self.cfg.chunk * self.cfg.envs_per_actor
        return obs

    def _record(self, obs: np.ndarray, actions: np.ndarray, rewards: np.ndarray, ended: np.ndarray) -> None:
        """reinforce: each environment's episode so far; a finished one is queued whole for the learner."""
        for e in range(len(obs)):
            self.trajs[e].append((obs[e], int(actions[e]), float(rewards[e])))
            if ended[e]:
                o, a, r = zip(*self.trajs[e], strict=True)
                self.finished.append(
                    {
                        "obs": torch.from_numpy(np.stack(o)).float(),
                        "action": torch.tensor(a),
                        "reward": torch.tensor(r, dtype=torch.float32),
                    }
                )
                self.trajs[e] = []

    def chunk_item(self) -> dict[str, Any]:
        batch, episodes = self.folder.take()
        steps = self.cfg.chunk * self.cfg.envs_per_actor
        item: dict[str, Any] = {
            "actor": self.index,
            "rank": self.rank,
            "steps": steps,
            "version": self.version,
            "episodes": episodes,
            "eps": float(self.eps),
        }
        if self.cfg.algo == "dqn":
            item["batch"] = batch
            if batch is not None and self.cfg.prioritized and self.cfg.inference == "actor":
                item["priorities"] = updates.priorities(self.net, batch)  # Ape-X: priorities from the actor
        else:
            item["trajectories"], self.finished = self.finished, []
        return item

    def run(self) -> dict[str, Any]:
        """Play and send until the learner says stop; this actor's figures, with where its time went: playing
        (and, with learner inference, waiting for the learner's answers), sending a chunk (and waiting while flow
        control holds it), pulling weights."""
        t0 = time.perf_counter()
        spent = {"play_s": 0.0, "send_s": 0.0, "pull_s": 0.0}
        if self.cfg.inference == "actor":
            self.sync()
        obs, _ = self.env.reset(seed=self.seed)
        chunks = 0
        while True:
            t_play = time.perf_counter()
            obs = self.play(obs)
            chunks += 1
            hooks.fire("actor_chunk", chunks, self.rank)
            t_send = time.perf_counter()
            version, stop = transport.call(self.to, learner.add_experience, self.chunk_item())
            t = time.perf_counter()
            spent["play_s"] += t_send - t_play
            spent["send_s"] += t - t_send
            if stop:
                break
            if self.cfg.inference == "learner":
                self.version = version  # it acts with the learner's current weights
            sync_every = 1 if self.cfg.algo == "reinforce" else self.cfg.sync_every
            if self.cfg.inference == "actor" and version - self.version >= sync_every:
                self.sync()
                spent["pull_s"] += time.perf_counter() - t
        self.env.close()
        seconds = time.perf_counter() - t0
        figures = {"actor": self.index, "rank": self.rank, "env_steps": self.steps, "seconds": seconds}
        return figures | {k: round(v, 3) for k, v in spent.items()}
