"""disttrain: PyTorch distributed training in one command, and the same pieces as a library.

from disttrain import Trainer, JobConfig, parallelize, init_distributed
"""

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
from disttrain.dist.env import DistEnv, init_distributed
from disttrain.dist.mesh import ParallelDims
from disttrain.dist.strategy import Parallelized, parallelize
from disttrain.train.trainer import FitResult, Trainer

__version__ = "0.1.0"
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
