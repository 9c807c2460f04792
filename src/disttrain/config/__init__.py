"""JobConfig: one dataclass per section, validated in ``__post_init__``, loaded from TOML + CLI overrides.

Every field can come from a TOML file (``[train] steps = 500``) and be overridden on the command line
(``--train.steps 500``). Checks that need only one section live in that section's ``__post_init__``;
checks that need the world size (the batch arithmetic) live in :func:`resolve_batch`, called once the
launcher knows how many ranks there are. Every error is a :class:`ConfigError` whose message states the
rule, the value and the fix.

``sections`` (model, data, train, optim, precision, metrics), ``parallel`` (parallel, launch), ``runtime``
(checkpoint, run, health), ``k8s`` (Kubernetes manifests), ``job`` (JobConfig, the batch arithmetic), ``io`` (TOML
and dicts, with
``typecheck`` checking every value against its field's type), ``overrides`` (``--section.key value`` via tyro),
``command`` (the one command line of run, estimate, ps and rl: ``--config``, overrides, ``--print-config``,
``--help``), ``helptext`` (the docstrings as ``--help`` text), ``values`` (dtype names, byte sizes, the check
helper). The io, overrides and command functions take any job config of sections: JobConfig by default, the
parameter server's and RL's (``ps.config``, ``rl.config``, which reuse the run, launch and health sections) with
``job=``.

Imports only ``disttrain.errors`` from disttrain (layer 1: everything else may import it).
"""

from disttrain.config.command import COMMON_FLAGS, CommandLine, Flag, parse_command, parse_job
from disttrain.config.io import from_dict, load_toml, to_dict, to_toml
from disttrain.config.job import BatchPlan, JobConfig, known_keys, resolve_batch, section_types
from disttrain.config.k8s import K8sConfig
from disttrain.config.overrides import apply_overrides, check_override_keys
from disttrain.config.parallel import LaunchConfig, ParallelConfig
from disttrain.config.resolved import RESOLVED_FILE, ResolvedJob
from disttrain.config.runtime import CheckpointConfig, HealthConfig, RunConfig
from disttrain.config.sections import (
    DataConfig,
    MetricsConfig,
    ModelConfig,
    OptimConfig,
    PrecisionConfig,
    TrainConfig,
)
from disttrain.config.values import DTYPES, parse_bytes
from disttrain.errors import ConfigError

__all__ = [
    "COMMON_FLAGS",
    "DTYPES",
    "RESOLVED_FILE",
    "BatchPlan",
    "CheckpointConfig",
    "CommandLine",
    "ConfigError",
    "DataConfig",
    "Flag",
    "HealthConfig",
    "JobConfig",
    "K8sConfig",
    "LaunchConfig",
    "MetricsConfig",
    "ModelConfig",
    "OptimConfig",
    "ParallelConfig",
    "PrecisionConfig",
    "ResolvedJob",
    "RunConfig",
    "TrainConfig",
    "apply_overrides",
    "check_override_keys",
    "from_dict",
    "known_keys",
    "load_toml",
    "parse_bytes",
    "parse_command",
    "parse_job",
    "resolve_batch",
    "section_types",
    "to_dict",
    "to_toml",
]
