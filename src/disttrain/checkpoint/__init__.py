"""Distributed checkpoints over DCP.

``manager`` (``CheckpointManager``: save / load / wait / close, async, atomic commit, keep-k, resume, reshard),
``layout`` (folder names, manifest, listing and finding checkpoints), ``state`` (model + optimizer, RNG state),
``staging`` (an async save's copy of the state), ``writer`` with ``direct_io`` and ``records`` (shard files,
checksummed as written), ``reader`` (safe, fast loads), ``save_process`` (DCP's background save process),
``export`` (plain weight files), ``verify`` and ``tools`` (``disttrain ckpt ls|inspect|verify|export``).

May import config, errors and utils; nothing from dist, train, health, plan, launch or cli.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from disttrain.errors import CheckpointError

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


def __getattr__(name: str) -> Any:
    """The names load on first use: listing checkpoints (a launcher) needs no DCP planner import."""
    if name not in _WHERE:
        raise AttributeError(f"module 'disttrain.checkpoint' has no attribute {name!r}")
    value = getattr(importlib.import_module(_WHERE[name]), name)
    globals()[name] = value
    return value


__all__ = [
    "CheckpointError",
    "CheckpointInfo",
    "CheckpointManager",
    "ModelOptimState",
    "export_live_model",
    "inspect_folder",
    "list_checkpoints",
]
