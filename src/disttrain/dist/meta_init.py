"""Materialise a model built on the meta device, identically at any world size.

A model that defines ``init_param(name, full_tensor)`` (the built-in GPT does) is filled parameter by
parameter: the *full* tensor is drawn on CPU, then each rank keeps its own shard. Peak extra memory is
one full parameter, and the weights equal a single-process build bit for bit, whatever the sharding.
Other models fall back to ``init_weights()`` or each module's ``reset_parameters()``.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.distributed.tensor import DTensor, distribute_tensor


def is_meta(model: nn.Module) -> bool:
    return any(t.is_meta for t in [*model.parameters(), *model.buffers()])


@torch.no_grad()
def materialize(model: nn.Module, device: torch.device) -> None:
    """Allocate storage for a meta-device (possibly sharded) model on ``device`` and initialise it."""
    model.to_empty(device=device)
    init_param = getattr(model, "init_param", None)
    if callable(init_param):
        for name, p in model.named_parameters():
            full = torch.empty(p.shape, dtype=torch.float32)
            init_param(name, full)
            if isinstance(p, DTensor):
                local = distribute_tensor(full, p.device_mesh, p.placements, src_data_rank=None).to_local()
                p.to_local().copy_(local)
            else:
                p.copy_(full)
        return
    init_weights = getattr(model, "init_weights", None)
    if callable(init_weights):
        init_weights()
        return
    for m in model.modules():
        reset = getattr(m, "reset_parameters", None)
        if callable(reset):
            reset()
