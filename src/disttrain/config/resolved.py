"""ResolvedJob: every fact about a job that is decided once, before any worker starts.

:func:`disttrain.resolve.resolve` makes it (device, processes, the strategy and why, its degrees, the batch
arithmetic, the precision ``auto`` became, the FSDP knobs the plan tuned) and writes it to the run folder
(``config.toml`` + ``resolved.json``); workers, the Trainer, ``estimate`` and ``report`` read it. Nothing
below re-derives these facts: the Trainer builds its mesh from ``strategy`` / ``replicate`` / ``shard`` as
they are. The one legitimate change is an elastic job whose membership differs from the plan's
(:meth:`ResolvedJob.at_world`), said in the worker's log.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

from disttrain.config.io import from_dict, to_dict, to_toml
from disttrain.config.job import BatchPlan, JobConfig, resolve_batch
from disttrain.errors import ConfigError

RESOLVED_FILE = "resolved.json"


@dataclasses.dataclass(frozen=True)
class ResolvedJob:
    """The job as it runs: the resolved config plus the decisions taken for it."""

    config: JobConfig
    """The config with every ``auto`` the job needs decided (precision, device, nproc, strategy, FSDP knobs)."""
    device: str
    """``cpu`` or ``cuda``."""
    nproc: int
    """Processes per node."""
    nnodes: int
    """Nodes (the most, for an elastic job)."""
    strategy: str
    """The strategy that runs (a name in :mod:`disttrain.parallel.strategies`)."""
    replicate: int
    """Replica groups (the whole world for DDP, 1 for FSDP, nodes for HSDP by default)."""
    shard: int
    """Ranks one copy of the model state is sharded over (1 for DDP)."""
    batch: BatchPlan
    """global = micro x accum x dp."""
    reason: str = ""
    """Why this strategy, in one sentence (``auto``: from the plan; else forced)."""
    auto: bool = False
    """The strategy was decided by the plan (``parallel.strategy = auto``)."""
    plan_text: str = ""
    """The memory and step-time table the decision was made from ('' without a plan)."""
    plan_json: dict[str, Any] | None = None

    @property
    def world_size(self) -> int:
        return self.nproc * self.nnodes

    def at_world(self, world_size: int, local_world_size: int) -> ResolvedJob:
        """This job at the membership it actually has: itself when it matches the plan; for an elastic job
        with fewer nodes, the same strategy with its degrees and batch arithmetic for ``world_size``."""
        if world_size == self.world_size and local_world_size == self.nproc:
            return self
        return dataclasses.replace(
            self,
            nproc=local_world_size,
            nnodes=max(world_size // max(local_world_size, 1), 1),
            replicate=self.config.parallel.replicate,  # the user's degrees (-1: the rest), checked again
            shard=self.config.parallel.shard,
            batch=resolve_batch(self.config.train, world_size // self.config.parallel.tp),  # over the data groups
        )

    # -- the run folder ---------------------------------------------------------------------------
    def to_json(self) -> dict[str, Any]:
        out = {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.name not in ("config", "batch")}
        return {**out, "batch": dataclasses.asdict(self.batch), "config": to_dict(self.config)}

    @classmethod
    def from_json(cls, raw: dict[str, Any]) -> ResolvedJob:
        fields = {k: v for k, v in raw.items() if k not in ("config", "batch")}
        return cls(config=from_dict(raw["config"], RESOLVED_FILE), batch=BatchPlan(**raw["batch"]), **fields)

    def write(self, run_dir: Path) -> None:
        """``config.toml`` (what the user can edit and rerun) and ``resolved.json`` (what the workers read)."""
        (run_dir / "config.toml").write_text(to_toml(self.config))
        (run_dir / RESOLVED_FILE).write_text(json.dumps(self.to_json(), indent=2) + "\n")

    @classmethod
    def read(cls, run_dir: Path) -> ResolvedJob:
        """The job a parent resolved into ``run_dir``; a run folder from before ``resolved.json`` existed is an
        error that says how to go on."""
        path = run_dir / RESOLVED_FILE
        if not path.is_file():
            hint = " (its config.toml is there: rerun with --config it)" if (run_dir / "config.toml").is_file() else ""
            raise ConfigError(f"{run_dir} has no {RESOLVED_FILE}: it was not written by `disttrain run`{hint}")
        return cls.from_json(json.loads(path.read_text()))
