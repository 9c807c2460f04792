"""``disttrain ps``'s job, one dataclass per section as ``disttrain run``'s: ``[ps]`` (servers, trainers,
consistency, the tables and the model, the servers' optimizer), ``[train]`` (the loop), ``[checkpoint]``, and
the run folder, launch, health and k8s sections every job shares (``disttrain.config``)."""

from __future__ import annotations

import dataclasses
from typing import Literal

from disttrain.config import HealthConfig, K8sConfig, LaunchConfig, RunConfig
from disttrain.config.values import check


@dataclasses.dataclass
class PSConfig:
    """Servers and trainers, how they agree, and the click-through-rate model they train."""

    servers: int = 2
    """Parameter servers (each holds 1/servers of every table's rows and their optimizer state)."""
    trainers: int = 2
    """Trainers (each trains on its share of every global batch; the dense part is replicated with DDP)."""
    mode: Literal["bsp", "ssp", "asp"] = "bsp"
    """bsp: every step's pushes are applied together before any trainer reads again (equals one process
    on the combined batch); ssp: pushes apply as they arrive, and a trainer waits only when it would get
    more than ``staleness`` steps ahead of the slowest; asp: nobody waits."""
    staleness: int = 2
    """ssp: how many steps a trainer may run ahead of the slowest one."""
    dense: Literal["auto", "trainers", "ddp", "server"] = "auto"
    """The dense MLP: trainers (replicated on the trainers; under bsp each sends its gradient in the step's one
    message to server 0, which answers with the mean, as DDP's all-reduce would, without a collective of its
    own); ddp (replicated, gradients all-reduced over the trainers' own process group; bsp only); server (held
    by server 0 with its Adam state; under bsp a step's gradients are averaged into one update); auto:
    trainers under bsp, server otherwise."""
    overlap: Literal["auto", "on", "off"] = "auto"
    """bsp: the message of step t (its pushes, the rows of step t+2) is on its way while step t+1 computes, so
    each step reads rows and trains dense weights that miss the previous step's update (a staleness bound of 1,
    the same on every trainer); checkpoints, evaluations and the end wait for it (resume stays exact). off: every
    read sees every update before it (one process on the combined batch, exactly). auto: on where it can be
    (bsp, the dense part averaged in the message, no cache)."""
    cache_rows: int = 0
    """bsp: each trainer keeps up to this many of each table's most read rows after pulling them, and reads
    them from its cache for cache_staleness more steps (0: no cache). It cuts the bytes per step (the default
    job with 4096: 31% fewer rows read, 29% of reads from the cache) at some CPU per step, so it pays where the
    link's bandwidth, not its latency, bounds the step: on one host it does not (docs/ps.md)."""
    cache_staleness: int = 2
    """bsp: steps a cached row is read without pulling it again; its gradients meanwhile are summed and pushed
    when its window ends, at checkpoints, evaluations and the end (0: every row is pushed and pulled every
    step, exactly BSP without a cache)."""
    spare_servers: int = 0
    """bsp with checkpoints: idle server processes in the job from the start. When a server dies, a spare
    loads its rows from the newest checkpoint, every server and trainer rolls back to that checkpoint's step,
    and the job goes on without restarting the other processes (RPC's group is fixed when it starts, so the
    dead process itself cannot come back)."""
    colocate: Literal["auto", "on", "off"] = "auto"
    """on: process i is trainer i and server i (servers == trainers; half the processes, and each trainer's
    own shard is read without a network hop, as TorchRec and colocated PS deployments do); off: servers are
    processes of their own (after the trainers, in rank order; needed for a spare server to take a dead one's
    place); auto: on when servers == trainers and there are no spare servers."""
    combine_pushes: bool = True
    """ssp / asp: pushes that arrive while a server is applying one are applied together, as one update."""
    sharding: Literal["mod", "range"] = "mod"
    """Rows to servers: id mod servers (spreads hot ids) or contiguous ranges."""
    tables: tuple[int, ...] = (100_000, 50_000, 10_000, 1_000, 500, 100)
    """Rows of each categorical feature's embedding table."""
    dim: int = 16
    """Embedding width."""
    n_dense: int = 13
    """Dense features."""
    hidden: int = 64
    """Width of the bottom and top MLPs."""
    data_path: str | None = None
    """A Criteo-format .tsv to train on (default: the synthetic click log with a known ground truth)."""
    optimizer: Literal["adagrad", "sgd"] = "adagrad"
    """The servers' per-row optimizer."""
    lr: float = 0.05
    """Learning rate of the embedding rows (server side)."""
    dense_lr: float = 0.003
    """Adam learning rate of the dense part (trainer side)."""
    rpc_timeout_s: float = 60.0
    """A remote call that takes longer fails with a message naming the server."""

    @property
    def dense_on_server(self) -> bool:
        return self.dense_where == "server"

    @property
    def dense_where(self) -> str:
        """Where the dense part is kept and how its gradients meet: trainers, ddp or server."""
        if self.dense != "auto":
            return self.dense
        return "trainers" if self.mode == "bsp" else "server"

    @property
    def colocated(self) -> bool:
        auto = self.servers == self.trainers and not self.spare_servers
        return self.colocate == "on" or (self.colocate == "auto" and auto)

    @property
    def outlives_trainers(self) -> bool:
        """asp with servers of their own: a trainer (other than trainer 0, which reports) that dies leaves the
        others training without its samples; colocated, its process held a shard too."""
        return self.mode == "asp" and not self.colocated and self.trainers > 1

    @property
    def watched(self) -> bool:
        """Started and watched by the command itself, not torchrun (whose agent ends every process when one
        dies): a dead server is replaced by a spare, a dead asp trainer is left behind."""
        return self.spare_servers > 0 or self.outlives_trainers

    @property
    def processes(self) -> int:
        """The job's processes: trainers, then the servers of their own, then the spares."""
        return self.trainers if self.colocated else self.trainers + self.servers + self.spare_servers

    def server_rank(self, server: int) -> int:
        return server if self.colocated else self.trainers + server

    def role(self, rank: int) -> str:
        """Who rank ``rank`` is: 'trainer1', 'server0', 'trainer1+server1' (colocated)."""
        if self.colocated:
            return f"trainer{rank}+server{rank}"
        if rank < self.trainers:
            return f"trainer{rank}"
        server = rank - self.trainers
        return f"server{server}" if server < self.servers else f"spare{server - self.servers}"

    @property
    def _can_overlap(self) -> bool:
        return self.mode == "bsp" and self.dense_where == "trainers" and not self.cache_rows

    @property
    def overlapped(self) -> bool:
        return self.overlap == "on" or (self.overlap == "auto" and self._can_overlap)

    @property
    def caching(self) -> bool:
        return self.mode == "bsp" and self.cache_rows > 0

    def __post_init__(self) -> None:
        check(self.servers >= 1, f"ps.servers must be >= 1, got {self.servers}")
        check(self.trainers >= 1, f"ps.trainers must be >= 1, got {self.trainers}")
        check(
            len(self.tables) >= 1 and min(self.tables) >= self.servers,
            f"ps.tables needs at least one table of >= servers ({self.servers}) rows, got {self.tables}",
        )
        for name in ("dim", "n_dense", "hidden"):
            check(getattr(self, name) >= 1, f"ps.{name} must be >= 1, got {getattr(self, name)}")
        check(self.lr > 0 and self.dense_lr > 0, f"ps.lr and ps.dense_lr must be > 0, got {self.lr}, {self.dense_lr}")
        check(self.staleness >= 0, f"ps.staleness must be >= 0, got {self.staleness}")
        if self.data_path is not None:
            check(
                len(self.tables) in (1, 26) and self.n_dense == 13,
                f"Criteo data (ps.data_path) has 13 dense and 26 categorical features: give 1 or 26 table sizes "
                f"(got {len(self.tables)}) and n_dense 13 (got {self.n_dense})",
            )
        check(
            self.dense != "ddp" or self.mode == "bsp",
            f"ps.dense ddp keeps the trainers in lockstep (an all-reduce per step), which {self.mode} exists to "
            f"avoid: use --ps.dense server (or auto) with --ps.mode {self.mode}",
        )
        check(
            self.dense != "trainers" or self.mode == "bsp",
            f"ps.dense trainers averages the dense gradients in each bsp step's message; {self.mode} has no such "
            f"step: use --ps.dense server (or auto) with --ps.mode {self.mode}",
        )
        check(
            self.cache_rows >= 0 and self.cache_staleness >= 0,
            f"ps.cache_rows and ps.cache_staleness must be >= 0, got {self.cache_rows}, {self.cache_staleness}",
        )
        check(
            self.colocate != "on" or self.servers == self.trainers,
            f"ps.colocate on puts server i in trainer i's process: it needs as many servers as trainers, got "
            f"{self.servers} servers and {self.trainers} trainers",
        )
        check(
            self.overlap != "on" or self._can_overlap,
            f"ps.overlap keeps a step's message on its way while the next step computes: it needs --ps.mode bsp "
            f"(got {self.mode}), the dense part averaged in the message (--ps.dense trainers or auto, got "
            f"{self.dense}) and no cache (--ps.cache-rows 0, got {self.cache_rows})",
        )
        check(self.spare_servers >= 0, f"ps.spare_servers must be >= 0, got {self.spare_servers}")
        if self.spare_servers:
            check(
                self.mode == "bsp" and self.dense_where == "trainers" and self.colocate != "on",
                f"ps.spare_servers take a dead server's place by rolling every server and trainer back to the "
                f"same checkpoint: it needs --ps.mode bsp (got {self.mode}), the dense part on the trainers "
                f"(--ps.dense trainers or auto, got {self.dense}) and servers of their own (--ps.colocate off)",
            )
        check(self.rpc_timeout_s > 0, f"ps.rpc_timeout_s must be > 0, got {self.rpc_timeout_s}")


@dataclasses.dataclass
class PSTrainConfig:
    """The trainers' loop: steps, batch, evaluations, progress lines, seed."""

    steps: int = 400
    """Steps (each trainer, one batch each)."""
    batch: int = 256
    """Samples per trainer per step."""
    eval_interval: int = 100
    """Evaluate AUC and log-loss on held-out samples every this many steps (0: only at the end)."""
    eval_samples: int = 20_000
    """Held-out samples per evaluation."""
    log_interval: int = 20
    """Print a progress line (loss, samples/s, staleness) every this many steps (0: only evaluations)."""
    seed: int = 0
    """Data, initialisation and ground truth."""

    def __post_init__(self) -> None:
        for name in ("steps", "batch", "eval_samples"):
            check(getattr(self, name) >= 1, f"train.{name} must be >= 1, got {getattr(self, name)}")
        check(self.eval_interval >= 0, f"train.eval_interval must be >= 0, got {self.eval_interval}")
        check(self.log_interval >= 0, f"train.log_interval must be >= 0, got {self.log_interval}")


@dataclasses.dataclass
class PSCheckpointConfig:
    """Server checkpoints (bsp): every server's rows and optimizer state, and the dense part."""

    interval: int = 0
    """Save every this many steps (0: never); a restarted job (``--launch.max-restarts``, or the same
    ``--run.name`` again) resumes from the newest complete one."""

    def __post_init__(self) -> None:
        check(self.interval >= 0, f"checkpoint.interval must be >= 0, got {self.interval}")


@dataclasses.dataclass
class PSJobConfig:
    """A click-through-rate model trained by trainers against parameter servers. Nodes: ``--launch.nnodes 2
    --launch.rdzv-endpoint HOST:PORT --launch.node-rank K`` spreads trainers and servers over machines (ranks in
    order: trainers, then servers); ``--launch.max-restarts N`` restarts the whole job from the last server
    checkpoint; ``[health]`` watches the trainers (heartbeats, the hang watchdog); ``--k8s pytorchjob|jobset``
    writes a Kubernetes manifest, one pod per node (``[k8s]``)."""

    ps: PSConfig = dataclasses.field(default_factory=PSConfig)
    train: PSTrainConfig = dataclasses.field(default_factory=PSTrainConfig)
    checkpoint: PSCheckpointConfig = dataclasses.field(default_factory=PSCheckpointConfig)
    run: RunConfig = dataclasses.field(default_factory=RunConfig)
    launch: LaunchConfig = dataclasses.field(default_factory=LaunchConfig)
    health: HealthConfig = dataclasses.field(default_factory=HealthConfig)
    k8s: K8sConfig = dataclasses.field(default_factory=K8sConfig)

    def __post_init__(self) -> None:
        check(
            self.ps.spare_servers == 0 or self.checkpoint.interval > 0,
            f"ps.spare_servers ({self.ps.spare_servers}) load a dead server's rows from the newest checkpoint: "
            f"give --checkpoint.interval N",
        )
        check(
            self.checkpoint.interval == 0 or self.ps.mode == "bsp",
            f"server checkpoints (checkpoint.interval) need a consistent point between steps: --ps.mode bsp, "
            f"not {self.ps.mode!r}",
        )
