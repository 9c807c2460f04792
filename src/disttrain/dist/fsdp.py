"""FSDP2: ``fully_shard`` each block then the root, mixed precision, reshard policy, explicit prefetch.

Follows the FSDP2 tutorial and torchtitan's ``apply_fsdp``: blocks are the units whose parameters are
all-gathered together; the root unit holds what is left (embeddings, final norm, head).
"""

from __future__ import annotations

import torch
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.fsdp import CPUOffloadPolicy, FSDPModule, MixedPrecisionPolicy, OffloadPolicy, fully_shard

from disttrain.config import DTYPES
from disttrain.dist.blocks import find_blocks
from disttrain.errors import ConfigError


def reshard_flag(policy: str, index: int, n_blocks: int) -> bool:
    if policy == "always":
        return True
    if policy == "never":
        return False
    return index < n_blocks - 1  # the last block is needed again at once by backward


def apply_fsdp(
    model: nn.Module,
    mesh: DeviceMesh,
    *,
    param_dtype: str = "fp32",
    reduce_dtype: str = "fp32",
    shard_modules: str = "auto",
    reshard_after_forward: str = "default",
    forward_prefetch: int = 0,
    backward_prefetch: int = 0,
    offload: bool = False,
) -> nn.Module:
    """Shard ``model`` in place over ``mesh`` (1-D: FSDP; 2-D replicate x shard: HSDP) and return it.

    With ``offload``, sharded parameters, gradients and optimizer state live in host memory
    (``CPUOffloadPolicy``; pinned only where there is an accelerator to pin for).
    """
    mp = MixedPrecisionPolicy(param_dtype=DTYPES[param_dtype], reduce_dtype=DTYPES[reduce_dtype])
    policy = CPUOffloadPolicy(pin_memory=torch.cuda.is_available()) if offload else OffloadPolicy()
    blocks = find_blocks(model, shard_modules)
    for i, block in enumerate(blocks):
        reshard = reshard_flag(reshard_after_forward, i, len(blocks))
        fully_shard(block, mesh=mesh, mp_policy=mp, reshard_after_forward=reshard, offload_policy=policy)
    # The root keeps its params gathered after forward under 'default': backward starts with them.
    reshard_root = reshard_after_forward == "always"
    fully_shard(model, mesh=mesh, mp_policy=mp, reshard_after_forward=reshard_root, offload_policy=policy)
    set_prefetch(blocks, forward_prefetch, backward_prefetch)
    return model


def set_prefetch(blocks: list[nn.Module], forward: int, backward: int) -> None:
    """Explicit prefetch chains: block i gathers blocks i+1..i+k in forward, i-1..i-k in backward."""
    fsdp_blocks: list[FSDPModule] = [b for b in blocks if isinstance(b, FSDPModule)]
    for i, block in enumerate(fsdp_blocks):
        if forward > 0 and i + 1 < len(fsdp_blocks):
            block.set_modules_to_forward_prefetch(fsdp_blocks[i + 1 : i + 1 + forward])
        if backward > 0 and i > 0:
            block.set_modules_to_backward_prefetch(fsdp_blocks[max(0, i - backward) : i][::-1])
