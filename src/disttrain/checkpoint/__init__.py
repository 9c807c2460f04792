"""Distributed checkpoints over DCP: save/load/wait/close (``manager``), the folder layout and listing,
writing and reading shard files, async staging, export, and the ``disttrain ckpt`` tools.

May import config, errors and utils; nothing from dist, train, health, launch or cli.
"""

from disttrain.checkpoint.manager import (
    CheckpointInfo,
    CheckpointManager,
    ModelOptimState,
    export_live_model,
    inspect_folder,
    list_checkpoints,
)
from disttrain.errors import CheckpointError

__all__ = [
    "CheckpointError",
    "CheckpointInfo",
    "CheckpointManager",
    "ModelOptimState",
    "export_live_model",
    "inspect_folder",
    "list_checkpoints",
]
