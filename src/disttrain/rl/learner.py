"""The learner: the network, its optimizer and the replay, fed by actors over RPC.

Actors call the functions at the bottom of this module (through :mod:`disttrain.rpc.transport`); they
reach the one :class:`Learner` of this process. Experience lands in an inbox that the learner's own loop
drains, so the RPC threads never touch the network or the replay. Flow control keeps the replay ratio:
an actor's call is answered (``@async_execution``) only once the learner has trained enough on what came
before, so on a small machine the actors never run away from the learner.
"""

from __future__ import annotations

import copy
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any

import torch
from torch.futures import Future

from disttrain.rl import updates
from disttrain.rl.config import RLJobConfig
from disttrain.rl.envs import EnvSpec
from disttrain.rl.nets import make_net_for
from disttrain.rl.replay import ReplayBuffer
from disttrain.rpc import transport

Reply = tuple[int, bool]  # (the learner's policy version, stop)


@dataclass
class Counters:
    env_steps: int = 0
    episodes: int = 0
    updates: int = 0
    version: int = 0
    """Updates at the last refresh of the acting weights (what actors act with)."""
    returns: deque[float] = field(default_factory=lambda: deque(maxlen=100))
    """Returns of the episodes that count towards 'solved'."""
    all_returns: deque[float] = field(default_factory=lambda: deque(maxlen=100))
    lengths: deque[int] = field(default_factory=lambda: deque(maxlen=100))
    lags: deque[int] = field(default_factory=lambda: deque(maxlen=100))
    train_s: float = 0.0
    """Seconds the learner's loop spent in updates (sampling, the step, priorities, target and acting copies)."""


class Learner:
    def __init__(self, job: RLJobConfig, spec: EnvSpec) -> None:
        cfg = job.rl
        self.cfg, self.train, self.spec = cfg, job.train, spec  # the [rl] and [train] sections
        self.net = make_net_for(spec, cfg.hidden, job.train.seed, cfg.algo)
        self.target = copy.deepcopy(self.net).requires_grad_(False)
        self.acting = copy.deepcopy(self.net).requires_grad_(False)
        # fused: one kernel for all parameters (on CPU the per-tensor loop was ~0.4 of ~2 ms per MLP update)
        self.opt = torch.optim.Adam(self.net.parameters(), lr=cfg.learning_rate_for(spec.image), fused=True)
        self.lr_range = (cfg.learning_rate_for(spec.image), cfg.final_learning_rate_for(spec.image))  # dqn: start, end
        self.replay = ReplayBuffer(
            cfg.capacity_for(spec.image),
            spec.obs_shape,
            prioritized=cfg.prioritized,
            alpha=cfg.alpha,
            seed=job.train.seed,
            obs_dtype=getattr(torch, spec.obs_dtype),
        )
        self.c = Counters(returns=deque(maxlen=job.train.solve_window))
        self.inbox: list[dict[str, Any]] = []
        self.held: list[tuple[int, int, int, Future[Reply]]] = []  # (env steps it may reach, actor, rank, answer)
        self.last_seen: dict[int, float] = {}
        self.told: set[int] = set()  # ranks of the actors answered 'stop'
        self.told_actors: set[int] = set()  # and their places (a spare may play a dead actor's)
        self.cond = threading.Condition()
        self.stop = False
        self.losses: deque[float] = deque(maxlen=100)
        self.pending_episodes: list[dict[str, torch.Tensor]] = []

    # ---- what the actors' calls do (RPC threads) ----
    def receive(self, item: dict[str, Any]) -> Future[Reply]:
        fut: Future[Reply] = Future()
        with self.cond:
            self.inbox.append(item)
            self.c.env_steps += item["steps"]
            self.last_seen[item["actor"]] = time.monotonic()
            if self.stop:
                self.told.add(item["rank"])
                self.told_actors.add(item["actor"])
                fut.set_result((self.c.version, True))
            elif self._allowed() >= self.c.env_steps:
                fut.set_result((self.c.version, False))
            else:
                self.held.append((self.c.env_steps, item["actor"], item["rank"], fut))
            self.cond.notify()
        return fut

    def _allowed(self) -> int:
        """Environment steps the actors may have taken so far (the replay ratio, one chunk each of slack)."""
        cfg = self.cfg
        slack = cfg.actors * cfg.envs_per_actor * cfg.chunk
        if cfg.algo == "reinforce":
            backlog = len(self.pending_episodes) + sum(len(i["episodes"]) for i in self.inbox)
            return self.c.env_steps + (slack if backlog < 2 * cfg.episodes_per_update else -1)
        return max(cfg.learning_starts, int(self.c.updates * cfg.batch / cfg.samples_per_step)) + slack

    def release(self) -> None:
        """Answer the actors that may go on (all of them, with stop, once the learner stops)."""
        with self.cond:
            allowed = self._allowed()
            ready = [h for h in self.held if self.stop or h[0] <= allowed]
            self.held = [h for h in self.held if not (self.stop or h[0] <= allowed)]
            if self.stop:
                self.told.update(rank for _, _, rank, _ in ready)
                self.told_actors.update(actor for _, actor, _, _ in ready)
        for *_, fut in ready:
            fut.set_result((self.c.version, self.stop))

    def all_told(self, actors: int, quiet_s: float) -> bool:
        """Every actor has been told to stop, or has not called for ``quiet_s`` seconds (it died)."""
        now = time.monotonic()
        with self.cond:
            return all(a in self.told_actors or now - self.last_seen.get(a, 0.0) > quiet_s for a in range(actors))

    def weights(self) -> tuple[int, dict[str, torch.Tensor]]:
        with self.cond:
            return self.c.version, {k: v.clone() for k, v in self.acting.state_dict().items()}

    # ---- the learner's loop (its own thread) ----
    def drain(self, timeout: float) -> None:
        """Move what arrived into the replay (dqn) or the episode queue (reinforce), waiting up to ``timeout``."""
        with self.cond:
            if not self.inbox:
                self.cond.wait(timeout)
            items, self.inbox = self.inbox, []
        for item in items:
            self._count(item)
            if item.get("batch") is not None:
                prio = item.get("priorities")
                if prio is None and self.cfg.prioritized:
                    prio = updates.priorities(self.net, item["batch"])
                self.replay.add(item["batch"], prio)
            for traj in item.get("trajectories", ()):
                if self.c.updates - item["version"] <= self.cfg.max_lag:
                    self.pending_episodes.append(traj)

    def _count(self, item: dict[str, Any]) -> None:
        counted = item.get("eps", self.cfg.epsilon(item["actor"])) <= self.train.eval_eps
        for ret, length in item["episodes"]:
            self.c.episodes += 1
            self.c.all_returns.append(ret)
            self.c.lengths.append(length)
            if counted:
                self.c.returns.append(ret)
        self.c.lags.append(self.c.updates - item["version"])

    def train_once(self) -> bool:
        """One update if there is enough to learn from; whether it made one."""
        t0 = time.perf_counter()
        trained = self._train_once()
        if trained:
            self.c.train_s += time.perf_counter() - t0
        return trained

    def _train_once(self) -> bool:
        cfg = self.cfg
        if cfg.algo == "reinforce":
            if len(self.pending_episodes) < cfg.episodes_per_update:
                return False
            eps, self.pending_episodes = self.pending_episodes, []
            self.losses.append(updates.reinforce_step(self.net, self.opt, eps, cfg.gamma))
        else:
            if len(self.replay) < cfg.learning_starts or self.c.updates * cfg.batch >= cfg.samples_per_step * max(
                self.c.env_steps, 1
            ):
                return False
            progress = min(1.0, self.c.env_steps / self.train.max_env_steps)
            beta = cfg.beta + (1.0 - cfg.beta) * progress
            lr0, lr1 = self.lr_range
            if lr1 != lr0:  # rl.lr_final: a linear decay over the run
                for group in self.opt.param_groups:
                    group["lr"] = lr0 + (lr1 - lr0) * progress
            b, idx, w = self.replay.sample(cfg.batch, beta)
            loss, td = updates.dqn_step(self.net, self.target, self.opt, b, w)
            self.replay.update_priorities(idx, td)  # one vectorised sum-tree update for the whole batch
            self.losses.append(loss)
        self.c.updates += 1
        if cfg.algo == "dqn":
            updates.follow(self.target, self.net, cfg.tau, every=cfg.target_every, step=self.c.updates)
        if cfg.algo == "reinforce" or self.c.updates % cfg.sync_every == 0:
            self.refresh_acting()
        return True

    def refresh_acting(self) -> None:
        with self.cond:
            self.acting.load_state_dict(self.net.state_dict())
            self.c.version = self.c.updates

    def solved(self) -> bool:
        c, t = self.c, self.train
        return bool(t.solve_return) and len(c.returns) >= t.solve_window and mean(c.returns) >= t.solve_return

    def finish(self) -> None:
        with self.cond:
            self.stop = True
        self.release()

    # ---- batched inference for the actors (rl.inference = learner) ----
    def infer(self, obs: torch.Tensor) -> Future[torch.Tensor]:
        """The acting network's output for ``obs``; requests that queue while one forward runs are answered
        together by the next (one forward for every waiting actor)."""
        fut: Future[torch.Tensor] = Future()
        with _INFER_LOCK:
            _INFER_QUEUE.append((obs, fut))
            if _INFERRING[0]:
                return fut
            _INFERRING[0] = True
        while True:
            with _INFER_LOCK:
                batch = list(_INFER_QUEUE)
                _INFER_QUEUE.clear()
                if not batch:
                    _INFERRING[0] = False
                    break
            with self.cond, torch.no_grad():
                out = self.acting(torch.cat([b[0] for b in batch]))
            for part, (_, f) in zip(out.split([len(b[0]) for b in batch]), batch, strict=True):
                f.set_result(part)
        return fut


def mean(xs: Any) -> float:
    xs = list(xs)
    return sum(xs) / len(xs) if xs else float("nan")


_INFER_QUEUE: list[tuple[torch.Tensor, Future[torch.Tensor]]] = []
_INFER_LOCK = threading.Lock()
_INFERRING = [False]
_LEARNER: dict[str, Learner] = {}


def serve(learner: Learner) -> None:
    """Make ``learner`` the one the actors' calls reach."""
    _LEARNER["it"] = learner


def _get() -> Learner:
    deadline = time.monotonic() + 60
    while "it" not in _LEARNER:  # an actor may call before the learner process has built it
        if time.monotonic() > deadline:
            raise RuntimeError("the learner did not start within 60 s")
        time.sleep(0.01)
    return _LEARNER["it"]


@transport.async_execution
def add_experience(item: dict[str, Any]) -> Future[Reply]:
    """An actor's chunk: ``actor``, ``steps``, ``version``, ``episodes`` [(return, length)], and ``batch`` +
    ``priorities`` (dqn) or ``trajectories`` (reinforce); answered with (version, stop) when it may go on."""
    return _get().receive(item)


def get_weights() -> tuple[int, dict[str, torch.Tensor]]:
    return _get().weights()


@transport.async_execution
def infer(obs: torch.Tensor) -> Future[torch.Tensor]:
    return _get().infer(obs)
