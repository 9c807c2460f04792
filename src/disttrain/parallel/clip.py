"""The global gradient norm, and clipping by it, over parameters that live on different meshes.

torch's ``clip_grad_norm_`` takes one norm over all gradients with foreach kernels, which DTensor runs only
when every gradient shares one mesh and layout. Under tensor parallelism composed with FSDP they do not: the
TP-split weights are 2-D DTensors (dp x tp), the replicated norms 1-D (dp only), and without FSDP the norms are
plain tensors. So the norm is taken per group of gradients that share a mesh and placements (each group's
norm a full one, DTensor resolving its shards and replicas), and the groups' norms are combined.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.tensor import DTensor


def _groups(grads: Iterable[torch.Tensor]) -> list[list[torch.Tensor]]:
    groups: dict[object, list[torch.Tensor]] = {}
    for g in grads:
        key = (g.device_mesh, tuple(g.placements)) if isinstance(g, DTensor) else (g.device, None)
        groups.setdefault(key, []).append(g)
    return list(groups.values())


@torch.no_grad()
def clip_grad_norm_(params: Iterable[nn.Parameter], max_norm: float, across: dist.ProcessGroup | None = None) -> float:
    """Clip every gradient by ``max_norm / global norm`` when above it (0 = just measure); the global L2 norm.
    ``across``: the ranks that hold the other parts of the model (a pipeline's stages), whose squares count too."""
    grads = [p.grad for p in params if p.grad is not None]
    squares = 0.0
    groups = _groups(grads)
    for group in groups:
        norm = torch.nn.utils.get_total_norm(group, 2.0, foreach=True)
        if isinstance(norm, DTensor):
            norm = norm.full_tensor()
        squares += float(norm.double()) ** 2
    if across is not None:
        device = grads[0].device if grads else torch.device("cpu")  # (NCCL reduces on the GPU)
        summed = torch.tensor([squares], dtype=torch.float64, device=device)
        dist.all_reduce(summed, group=across)
        squares = float(summed)
    total = math.sqrt(squares)
    if max_norm > 0:
        coef = max_norm / (total + 1e-6)  # torch's clip_grads_with_norm_
        if coef < 1.0:
            for group in groups:
                torch._foreach_mul_(group, coef)
    return total
