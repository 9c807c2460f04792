"""``disttrain ps``'s job: the click data, the model, the servers and trainers, the loop, the run folder."""

from __future__ import annotations

import dataclasses
from typing import Any, Literal

from disttrain.config import HealthConfig, LaunchConfig
from disttrain.config.values import check


@dataclasses.dataclass
class PSConfig:
    """A click-through-rate model trained by trainers against parameter servers."""

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
    dense: Literal["auto", "ddp", "server"] = "auto"
    """The dense MLP: ddp (replicated on the trainers, gradients all-reduced over their own process group;
    bsp only), server (held by server 0 with its Adam state; under bsp a step's gradients are averaged into
    one update); auto: ddp under bsp, server otherwise."""
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
    steps: int = 400
    """Steps (each trainer, one batch each)."""
    batch: int = 256
    """Samples per trainer per step."""
    optimizer: Literal["adagrad", "sgd"] = "adagrad"
    """The servers' per-row optimizer."""
    lr: float = 0.05
    """Learning rate of the embedding rows (server side)."""
    dense_lr: float = 0.003
    """Adam learning rate of the dense part (trainer side)."""
    eval_every: int = 100
    """Evaluate AUC and log-loss on held-out samples every this many steps (0: only at the end)."""
    eval_samples: int = 20_000
    """Held-out samples per evaluation."""
    seed: int = 0
    """Data, initialisation and ground truth."""
    checkpoint_every: int = 0
    """bsp: save every server's rows and optimizer state, and the dense part, every this many steps (0: never);
    a restarted job resumes from the newest complete one."""
    rpc_timeout_s: float = 60.0
    """A remote call that takes longer fails with a message naming the server."""
    log_every: int = 20
    """Print a progress line (loss, samples/s, staleness) every this many steps (0: only evaluations)."""
    plan: bool = False
    """Print rows and bytes per server and whether they fit in this host's memory, then stop."""
    run_root: str = "runs"
    """Where run folders are made."""
    run_name: str | None = None
    """The run folder's name (default: ps-<time>)."""
    launch: LaunchConfig = dataclasses.field(default_factory=LaunchConfig)
    """Nodes and restarts: ``--launch.max-restarts N`` restarts the whole job (servers and trainers) from the
    last server checkpoint; ``--launch.nnodes 2 --launch.rdzv-endpoint HOST:PORT --launch.node-rank K``
    spreads trainers and servers over machines (ranks in order: trainers first, then servers)."""
    health: HealthConfig = dataclasses.field(default_factory=HealthConfig)
    """The trainers' heartbeats and hang watchdog (the LM trainer's, see ``disttrain run --help``)."""

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> PSConfig:
        """What ``dataclasses.asdict`` wrote (the run folder's config.json) back into a config."""
        d = dict(d, tables=tuple(d["tables"]))
        return cls(**d | {"launch": LaunchConfig(**d["launch"]), "health": HealthConfig(**d["health"])})

    @property
    def dense_on_server(self) -> bool:
        return self.dense == "server" or (self.dense == "auto" and self.mode != "bsp")

    def __post_init__(self) -> None:
        check(self.servers >= 1, f"ps.servers must be >= 1, got {self.servers}")
        check(self.trainers >= 1, f"ps.trainers must be >= 1, got {self.trainers}")
        check(
            len(self.tables) >= 1 and min(self.tables) >= self.servers,
            f"ps.tables needs at least one table of >= servers ({self.servers}) rows, got {self.tables}",
        )
        for name in ("dim", "n_dense", "hidden", "steps", "batch", "eval_samples"):
            check(getattr(self, name) >= 1, f"ps.{name} must be >= 1, got {getattr(self, name)}")
        check(self.lr > 0 and self.dense_lr > 0, f"ps.lr and ps.dense_lr must be > 0, got {self.lr}, {self.dense_lr}")
        check(self.staleness >= 0, f"ps.staleness must be >= 0, got {self.staleness}")
        check(self.eval_every >= 0, f"ps.eval_every must be >= 0, got {self.eval_every}")
        if self.data_path is not None:
            check(
                len(self.tables) in (1, 26) and self.n_dense == 13,
                f"Criteo data (ps.data_path) has 13 dense and 26 categorical features: give 1 or 26 table sizes "
                f"(got {len(self.tables)}) and n_dense 13 (got {self.n_dense})",
            )
        check(self.checkpoint_every >= 0, f"ps.checkpoint_every must be >= 0, got {self.checkpoint_every}")
        check(self.log_every >= 0, f"ps.log_every must be >= 0, got {self.log_every}")
        check(
            self.dense != "ddp" or self.mode == "bsp",
            f"ps.dense ddp keeps the trainers in lockstep (an all-reduce per step), which {self.mode} exists to "
            f"avoid: use --dense server (or auto) with --mode {self.mode}",
        )
        check(
            self.checkpoint_every == 0 or self.mode == "bsp",
            f"server checkpoints need a consistent point between steps: mode bsp, not {self.mode!r}",
        )
        check(self.rpc_timeout_s > 0, f"ps.rpc_timeout_s must be > 0, got {self.rpc_timeout_s}")
