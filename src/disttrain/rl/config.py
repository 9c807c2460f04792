"""``disttrain rl``'s job, one dataclass per section as ``disttrain run``'s: ``[rl]`` (the environment, the
algorithm, actors and learner, replay, exploration), ``[train]`` (when it stops and what it logs, the seed),
``[checkpoint]``, and the run folder, launch, health and k8s sections every job shares (``disttrain.config``)."""

from __future__ import annotations

import dataclasses
from typing import Literal

from disttrain.config import HealthConfig, K8sConfig, LaunchConfig, RunConfig
from disttrain.config.values import check

VECTOR_REPLAY = 100_000  # rl.replay_capacity's default for vector observations
IMAGE_REPLAY = 20_000  # and for uint8 frames: 2 x 28 KB a transition, 1.1 GB
REPLAY_RATIO = 8.0  # rl.replay_ratio's default, and where an environment is tuned otherwise:
TUNED_REPLAY_RATIO = {"LunarLander-v3": 16.0}  # 8 solved it in 385k-499k env steps (3 seeds), 16 in 196k-274k


@dataclasses.dataclass
class RLConfig:
    """The environment, the algorithm, actors and learner, replay and exploration."""

    env_id: str = "CartPole-v1"
    """Any gymnasium environment with a discrete action space and a vector observation (CartPole-v1,
    LunarLander-v3, ...), or an Atari game of ale-py (ALE/Pong-v5, ALE/Breakout-v5, ...: 84x84 grey frames,
    4 stacked, uint8; the Nature-DQN convolutional Q-network)."""
    algo: Literal["dqn", "reinforce"] = "dqn"
    """dqn: double DQN with a target network, n-step returns and replay (Ape-X: priorities computed by the
    actors, a ladder of exploration rates); reinforce: the PyTorch RPC tutorial's policy gradient, whole
    episodes from the actors, no replay."""
    actors: int = 3
    """Actor processes (the learner is one more)."""
    envs_per_actor: int = 4
    """Environments each actor steps together (gymnasium's vector API)."""
    chunk: int = 50
    """Environment steps (per environment) an actor collects before one RPC to the learner."""
    inference: Literal["actor", "learner"] = "actor"
    """actor: each actor acts with its own copy of the network, pulled every sync_every learner updates;
    learner: actors send observations and the learner answers for all actors in one batched forward (SEED RL)."""
    spare_actors: int = 0
    """Idle actor processes in the RPC group from the start: when an actor dies, a spare takes over its
    place (its exploration rate and environments' seeds) and the learner goes on with as many actors as
    before. (RPC's group is fixed when it starts, so a dead process itself cannot come back.)"""
    sync_every: int = 20
    """inference actor: pull the learner's weights when the actor's copy is this many updates old."""
    hidden: int = 128
    """Width of the MLP's two hidden layers (vector observations; frames get the Nature-DQN CNN)."""
    lr: float | None = None
    """Adam learning rate (default: 5e-4 for dqn, 1e-4 for dqn on frames (Atari), 1e-2 for reinforce)."""
    lr_final: float | None = None
    """dqn: the learning rate decays linearly from rl.lr to this over train.max_env_steps (default: none, constant)."""
    gamma: float = 0.99
    """Discount."""
    n_step: int = 3
    """dqn: n-step returns, folded by the actors."""
    batch: int = 128
    """dqn: transitions per learner update."""
    replay_ratio: float | None = None
    """dqn: transitions trained on per environment step (actors wait when they run further ahead). Default 8;
    16 for LunarLander-v3 (it then solves in about half the environment steps and no more updates; CartPole-v1
    at 16 needed up to 2.5x the updates of 8)."""
    learning_starts: int = 1000
    """dqn: environment steps in the replay before the first update."""
    replay_capacity: int | None = None
    """dqn: transitions the replay holds (the oldest go first). Default per observation kind: 100,000 for vectors
    (float32, ~100 bytes each on CartPole); 20,000 for frames, which are stored as uint8, obs and next_obs
    (2 x 4x84x84 bytes = 56 KB a transition: 1.1 GB; 100,000 would be 5.6 GB). Raise it where memory allows."""
    prioritized: bool = False
    """dqn: prioritized replay (priorities |TD error| from the actors, then the learner)."""
    alpha: float = 0.6
    """Prioritized replay: priority exponent."""
    beta: float = 0.4
    """Prioritized replay: importance-sampling exponent (annealed to 1 over the run)."""
    target_every: int = 250
    """dqn: copy the online network into the target network every this many updates (rl.tau 1)."""
    tau: float = 1.0
    """dqn: 1: the target network is a copy, every rl.target_every updates; below 1: after every update it moves
    this fraction of the way to the online network (Polyak averaging, as TD3/SAC do; rl.target_every unused)."""
    eps_base: float = 0.4
    """dqn: actor i explores with eps_base ** (1 + eps_alpha * i / (actors - 1)) (the Ape-X ladder)."""
    eps_alpha: float = 7.0
    """dqn: the ladder's spread."""
    explore_steps: int = 0
    """dqn: every actor starts fully random and anneals linearly to its ladder rate over the job's first
    explore_steps environment steps (0: the ladder from the start)."""
    episodes_per_update: int = 8
    """reinforce: episodes per policy-gradient update."""
    max_lag: int = 2
    """reinforce: episodes played with a policy more than this many updates old are dropped."""
    rpc_timeout_s: float = 60.0
    """A remote call that takes longer fails with a message naming the worker."""

    def __post_init__(self) -> None:
        for name in (
            "actors",
            "envs_per_actor",
            "chunk",
            "sync_every",
            "hidden",
            "n_step",
            "batch",
            "episodes_per_update",
            "target_every",
        ):
            check(getattr(self, name) >= 1, f"rl.{name} must be >= 1, got {getattr(self, name)}")
        check(self.learning_rate > 0, f"rl.lr must be > 0, got {self.lr}")
        cap = self.replay_capacity
        check(cap is None or cap >= 1, f"rl.replay_capacity must be >= 1, got {cap}")
        check(0 < self.gamma <= 1, f"rl.gamma must be in (0, 1], got {self.gamma}")
        check(self.samples_per_step > 0, f"rl.replay_ratio must be > 0, got {self.replay_ratio}")
        check(
            self.learning_starts >= self.batch,
            f"rl.learning_starts ({self.learning_starts}) must be >= rl.batch ({self.batch})",
        )
        check(0 < self.eps_base < 1 and self.eps_alpha >= 0, f"rl.eps_base must be in (0, 1), got {self.eps_base}")
        check(self.explore_steps >= 0, f"rl.explore_steps must be >= 0, got {self.explore_steps}")
        check(self.spare_actors >= 0, f"rl.spare_actors must be >= 0, got {self.spare_actors}")
        check(self.max_lag >= 0, f"rl.max_lag must be >= 0, got {self.max_lag}")
        check(self.lr_final is None or self.lr_final >= 0, f"rl.lr_final must be >= 0, got {self.lr_final}")
        check(0 < self.tau <= 1, f"rl.tau must be in (0, 1], got {self.tau} (1: hard copies every rl.target_every)")
        check(self.rpc_timeout_s > 0, f"rl.rpc_timeout_s must be > 0, got {self.rpc_timeout_s}")

    @property
    def samples_per_step(self) -> float:
        """rl.replay_ratio, or its default for rl.env_id."""
        if self.replay_ratio is not None:
            return self.replay_ratio
        return TUNED_REPLAY_RATIO.get(self.env_id, REPLAY_RATIO)

    def final_learning_rate_for(self, image: bool) -> float:
        """rl.lr_final, or the learning rate itself (constant)."""
        return self.lr_final if self.lr_final is not None else self.learning_rate_for(image)

    @property
    def learning_rate(self) -> float:
        """rl.lr, or the default for vector observations."""
        return self.lr if self.lr is not None else (5e-4 if self.algo == "dqn" else 1e-2)

    def learning_rate_for(self, image: bool) -> float:
        """rl.lr, or the default for the environment's kind of observation (frames: CleanRL's Atari 1e-4)."""
        return 1e-4 if image and self.lr is None else self.learning_rate

    def capacity_for(self, image: bool) -> int:
        """rl.replay_capacity, or the default for the environment's kind of observation."""
        if self.replay_capacity is not None:
            return self.replay_capacity
        return IMAGE_REPLAY if image else VECTOR_REPLAY

    def epsilon(self, actor: int, env_steps: int | None = None) -> float:
        """dqn: actor ``actor``'s exploration rate on the Ape-X ladder, annealed from 1 over the first
        explore_steps when ``env_steps`` (the job's so far) is given; reinforce samples its policy: 0."""
        if self.algo != "dqn":
            return 0.0
        spread = actor / (self.actors - 1) if self.actors > 1 else 1.0
        ladder = self.eps_base ** (1 + self.eps_alpha * spread)
        if env_steps is None or not self.explore_steps:
            return ladder
        return max(ladder, 1.0 - (1.0 - ladder) * env_steps / self.explore_steps)


@dataclasses.dataclass
class RLTrainConfig:
    """When the job stops (solved, or out of environment steps), what it logs, and the seed."""

    max_env_steps: int = 500_000
    """Stop after this many environment steps in all (solved or not)."""
    solve_return: float = 475.0
    """Stop when the mean return of the last solve_window counted episodes reaches this (0: never)."""
    solve_window: int = 100
    """Episodes in the solved mean."""
    eval_eps: float = 0.02
    """Episodes of actors exploring at most this much count towards 'solved' (all actors under reinforce)."""
    log_interval_s: float = 5.0
    """Seconds between progress lines (and metrics.jsonl records)."""
    seed: int = 0
    """Environments, exploration and initialisation."""

    def __post_init__(self) -> None:
        for name in ("max_env_steps", "solve_window"):
            check(getattr(self, name) >= 1, f"train.{name} must be >= 1, got {getattr(self, name)}")
        check(self.log_interval_s > 0, f"train.log_interval_s must be > 0, got {self.log_interval_s}")


@dataclasses.dataclass
class RLCheckpointConfig:
    """Learner checkpoints (dqn): the network, optimizer, replay and counters."""

    interval: int = 0
    """Save every this many updates (0: never); running the same ``--run.name`` again resumes from the newest
    complete one."""

    def __post_init__(self) -> None:
        check(self.interval >= 0, f"checkpoint.interval must be >= 0, got {self.interval}")


@dataclasses.dataclass
class RLJobConfig:
    """Actors play a gymnasium environment and send experience to one learner over RPC. Nodes: ``--launch.nnodes
        2 --launch.rdzv-endpoint HOST:PORT --launch.node-rank K`` (rank 0, the learner, on node 0; actors spread over
        the nodes). ``[health]``: the learner and every actor write heartbeats; one whose process stops is named and
    ended within ``health.hang_timeout_s`` (else ``health.hang_floor_s``). ``--k8s pytorchjob|jobset`` writes a
    Kubernetes manifest, one pod per node (``[k8s]``)."""

    rl: RLConfig = dataclasses.field(default_factory=RLConfig)
    train: RLTrainConfig = dataclasses.field(default_factory=RLTrainConfig)
    checkpoint: RLCheckpointConfig = dataclasses.field(default_factory=RLCheckpointConfig)
    run: RunConfig = dataclasses.field(default_factory=RunConfig)
    launch: LaunchConfig = dataclasses.field(default_factory=LaunchConfig)
    health: HealthConfig = dataclasses.field(default_factory=HealthConfig)
    k8s: K8sConfig = dataclasses.field(default_factory=K8sConfig)

    def __post_init__(self) -> None:
        check(
            self.rl.algo == "dqn" or self.checkpoint.interval == 0,
            "checkpoint.interval: learner checkpoints are for --rl.algo dqn (reinforce keeps no replay)",
        )
