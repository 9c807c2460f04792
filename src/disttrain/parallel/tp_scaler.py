"""fp16's loss scaler under tensor parallelism: gradients live on several meshes (TP-split DTensors, replicated
DTensors or plain tensors), which torch's foreach unscale kernel will not take in one call. Each gradient's
local shard is unscaled instead (element-wise: the same numbers), and FSDP's scaler all-reduces the overflow
flag so that every rank skips, or takes, the same step."""

from __future__ import annotations

from collections import defaultdict

import torch
from torch.distributed.fsdp.sharded_grad_scaler import ShardedGradScaler, _GeneralMultiDeviceReplicator
from torch.distributed.tensor import DTensor


class TPGradScaler(ShardedGradScaler):
    """:class:`ShardedGradScaler` that unscales local shards (any mix of meshes) and agrees on overflow."""

    def _unscale_grads_(
        self,
        optimizer: torch.optim.Optimizer,
        inv_scale: torch.Tensor,
        found_inf: torch.Tensor,
        allow_fp16: bool = True,
    ) -> dict[torch.device, torch.Tensor]:
        inv = _GeneralMultiDeviceReplicator(inv_scale)
        inf = _GeneralMultiDeviceReplicator(found_inf)
        grouped: dict[tuple[torch.device, torch.dtype], list[torch.Tensor]] = defaultdict(list)
        with torch.no_grad():
            for group in optimizer.param_groups:
                for p in group["params"]:
                    if p.grad is None:
                        continue
                    g = p.grad.to_local() if isinstance(p.grad, DTensor) else p.grad
                    if not allow_fp16 and g.dtype == torch.float16:
                        raise ValueError("Attempting to unscale FP16 gradients.")
                    grouped[(g.device, g.dtype)].append(g)
            for (device, _), grads in grouped.items():
                torch._amp_foreach_non_finite_check_and_unscale_(grads, inf.get(device), inv.get(device))
        if not inf._per_device_tensors:
            assert self._scale is not None
            inf.get(self._scale.device)
        return inf._per_device_tensors
