"""JobConfig, the whole job as one value of sections, and the batch arithmetic that needs the world size."""

from __future__ import annotations

import dataclasses
import typing

from disttrain.config.k8s import K8sConfig
from disttrain.config.parallel import LaunchConfig, ParallelConfig
from disttrain.config.runtime import CheckpointConfig, HealthConfig, RunConfig
from disttrain.config.sections import (
    DataConfig,
    MetricsConfig,
    ModelConfig,
    OptimConfig,
    PrecisionConfig,
    TrainConfig,
)
from disttrain.errors import ConfigError


@dataclasses.dataclass
class JobConfig:
    """Everything a training job needs; ``disttrain run --print-config`` shows the resolved one."""

    model: ModelConfig = dataclasses.field(default_factory=ModelConfig)
    data: DataConfig = dataclasses.field(default_factory=DataConfig)
    train: TrainConfig = dataclasses.field(default_factory=TrainConfig)
    optim: OptimConfig = dataclasses.field(default_factory=OptimConfig)
    parallel: ParallelConfig = dataclasses.field(default_factory=ParallelConfig)
    precision: PrecisionConfig = dataclasses.field(default_factory=PrecisionConfig)
    metrics: MetricsConfig = dataclasses.field(default_factory=MetricsConfig)
    checkpoint: CheckpointConfig = dataclasses.field(default_factory=CheckpointConfig)
    launch: LaunchConfig = dataclasses.field(default_factory=LaunchConfig)
    run: RunConfig = dataclasses.field(default_factory=RunConfig)
    health: HealthConfig = dataclasses.field(default_factory=HealthConfig)
    k8s: K8sConfig = dataclasses.field(default_factory=K8sConfig)


def section_types(job: type = JobConfig) -> dict[str, type]:
    """Section name -> dataclass type of ``job`` (JobConfig, or another command's job of sections), in
    declaration order."""
    hints = typing.get_type_hints(job)
    return {f.name: hints[f.name] for f in dataclasses.fields(job)}


def known_keys(job: type = JobConfig) -> list[str]:
    """Every dotted key a user may set in ``job`` ('train.steps', ...)."""
    return [f"{s}.{f.name}" for s, t in section_types(job).items() for f in dataclasses.fields(t)]


@dataclasses.dataclass(frozen=True)
class BatchPlan:
    """The batch arithmetic for one world size: global = micro x accum x dp."""

    global_batch: int
    micro_batch: int
    dp_size: int
    accum_steps: int


def resolve_batch(train: TrainConfig, dp_size: int) -> BatchPlan:
    """Derive gradient-accumulation steps for ``dp_size`` data-parallel ranks, or explain why it can't."""
    per_step = train.micro_batch * dp_size
    if train.global_batch % per_step:
        lo = max(per_step, train.global_batch // per_step * per_step)
        raise ConfigError(
            f"train.global_batch ({train.global_batch}) must be a multiple of train.micro_batch "
            f"({train.micro_batch}) x data-parallel size ({dp_size}) = {per_step}; "
            f"try --train.global_batch {lo} or {lo + per_step}"
        )
    return BatchPlan(train.global_batch, train.micro_batch, dp_size, train.global_batch // per_step)
