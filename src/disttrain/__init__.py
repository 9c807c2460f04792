"""disttrain: PyTorch distributed training in one command, and the same pieces as a library.

from disttrain import Trainer, JobConfig, parallelize, init_distributed

The names load on first use (PEP 562): a launcher or a `disttrain` command that never builds a model does
not pay for importing FSDP and the trainer (about a second per process).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from disttrain.utils.lazy import lazy_names

__version__ = "0.1.0"

_WHERE = {
    "ConfigError": "disttrain.config",
    "DataConfig": "disttrain.config",
    "JobConfig": "disttrain.config",
    "ModelConfig": "disttrain.config",
    "OptimConfig": "disttrain.config",
    "ParallelConfig": "disttrain.config",
    "PrecisionConfig": "disttrain.config",
    "TrainConfig": "disttrain.config",
    "DistEnv": "disttrain.parallel.env",
    "init_distributed": "disttrain.parallel.env",
    "ParallelDims": "disttrain.parallel.mesh",
    "Parallelized": "disttrain.parallel.parallelize",
    "parallelize": "disttrain.parallel.parallelize",
    "FitResult": "disttrain.train.trainer",
    "Trainer": "disttrain.train.trainer",
}
__all__ = [
    "ConfigError",
    "DataConfig",
    "DistEnv",
    "FitResult",
    "JobConfig",
    "ModelConfig",
    "OptimConfig",
    "ParallelConfig",
    "ParallelDims",
    "Parallelized",
    "PrecisionConfig",
    "TrainConfig",
    "Trainer",
    "init_distributed",
    "parallelize",
]

if TYPE_CHECKING:
    from disttrain.config import (
        ConfigError,
        DataConfig,
        JobConfig,
        ModelConfig,
        OptimConfig,
        ParallelConfig,
        PrecisionConfig,
        TrainConfig,
    )
    from disttrain.parallel.env import DistEnv, init_distributed
    from disttrain.parallel.mesh import ParallelDims
    from disttrain.parallel.parallelize import Parallelized, parallelize
    from disttrain.train.trainer import FitResult, Trainer


__getattr__ = lazy_names("disttrain", _WHERE, globals())
