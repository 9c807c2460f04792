"""Distributed checkpoints over DCP.

``manager`` (``CheckpointManager``: save / load / wait / close, async, atomic commit, keep-k, resume, reshard),
``layout`` (folder names, manifest, listing and finding checkpoints), ``state`` (model + optimizer, RNG state),
``staging`` (an async save's copy of the state), ``writer`` with ``direct_io`` and ``records`` (shard files,
checksummed as written), ``reader`` (safe, fast loads), ``save_process`` (DCP's background save process),
``export`` (plain weight files), ``verify`` and ``tools`` (``disttrain ckpt ls|inspect|verify|export``).

May import config, errors and utils; nothing from dist, train, health, plan, launch or cli.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from disttrain.errors import CheckpointError
from disttrain.utils.lazy import lazy_names

if TYPE_CHECKING:
    from disttrain.checkpoint.export import export_live_model
    from disttrain.checkpoint.layout import CheckpointInfo, inspect_folder, list_checkpoints
    from disttrain.checkpoint.manager import CheckpointManager
    from disttrain.checkpoint.state import ModelOptimState

_WHERE = {
    "export_live_model": "disttrain.checkpoint.export",
    "CheckpointInfo": "disttrain.checkpoint.layout",
    "inspect_folder": "disttrain.checkpoint.layout",
    "list_checkpoints": "disttrain.checkpoint.layout",
    "CheckpointManager": "disttrain.checkpoint.manager",
    "ModelOptimState": "disttrain.checkpoint.state",
}


__getattr__ = lazy_names("disttrain.checkpoint", _WHERE, globals())
__all__ = [
    "CheckpointError",
    "CheckpointInfo",
    "CheckpointManager",
    "ModelOptimState",
    "export_live_model",
    "inspect_folder",
    "list_checkpoints",
]
