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
from disttrain.parallel.blocks import find_blocks, outer_units, split_root


def reshard_flag(policy: str, index: int, n_blocks: int) -> bool:
    if policy == "always":
        return True
    if policy == "never":
        return False
    return index < n_blocks - 1  # the last block is needed again at once by backward


def group_blocks(blocks: list[nn.Module], blocks_per_unit: int) -> list[list[nn.Module]]:
    """Adjacent blocks in units of ``blocks_per_unit`` (the last unit may hold fewer)."""
    k = max(1, blocks_per_unit)
    return [blocks[i : i + k] for i in range(0, len(blocks), k)]


def apply_fsdp(
    model: nn.Module,
    mesh: DeviceMesh,
    *,
    param_dtype: str = "fp32",
    reduce_dtype: str = "fp32",
    shard_modules: str = "auto",
    reshard_after_forward: str = "default",
    blocks_per_unit: int | str = 1,
    root_units: str = "auto",
    forward_prefetch: int | str = 1,
    backward_prefetch: int | str = 1,
    offload: bool = False,
) -> nn.Module:
    """Shard ``model`` in place over ``mesh`` (1-D: FSDP; 2-D replicate x shard: HSDP) and return it.

    Every ``blocks_per_unit`` adjacent blocks are one FSDP unit (``fully_shard`` of the list: one all-gather
    and one reduce-scatter for all of them). ``"auto"`` left unresolved by a plan means 1 block per unit and
    a prefetch depth of 1. ``root_units`` (:func:`~disttrain.parallel.blocks.split_root`) may give the embeddings
    a unit before the blocks and the final norm + head one after them. With ``offload``, sharded parameters,
    gradients and optimizer state live in host memory (``CPUOffloadPolicy``; pinned only where there is an
    accelerator to pin for).
    """
    mp = MixedPrecisionPolicy(param_dtype=DTYPES[param_dtype], reduce_dtype=DTYPES[reduce_dtype])
    policy = CPUOffloadPolicy(pin_memory=torch.cuda.is_available()) if offload else OffloadPolicy()
    blocks = find_blocks(model, shard_modules)
    units = group_blocks(blocks, _int(blocks_per_unit, 1))
    before, after = outer_units(model, blocks)
    outer = sum(p.numel() for m in before + after for p in m.parameters())
    biggest = max((sum(p.numel() for b in u for p in b.parameters()) for u in units), default=0)
    if split_root(root_units, outer, biggest):
        units = [u for u in (before, *units, after) if u]
    for i, unit in enumerate(units):
        reshard = reshard_flag(reshard_after_forward, i, len(units))
        target = unit[0] if len(unit) == 1 else unit
        fully_shard(target, mesh=mesh, mp_policy=mp, reshard_after_forward=reshard, offload_policy=policy)
    # The root keeps its params gathered after forward under 'default': backward starts with them.
    reshard_root = reshard_after_forward == "always"
    fully_shard(model, mesh=mesh, mp_policy=mp, reshard_after_forward=reshard_root, offload_policy=policy)
    set_prefetch([u[0] for u in units], _int(forward_prefetch, 1), _int(backward_prefetch, 1))
    return model


def _int(value: int | str, unresolved: int) -> int:
    """A knob the plan resolves (``"auto"``), or its default when no plan did."""
    return unresolved if value == "auto" else int(value)


def set_prefetch(units: list[nn.Module], forward: int, backward: int) -> None:
    """Explicit prefetch chains over the units (each given by its first block, which carries the unit's FSDP
    state): unit i gathers units i+1..i+k in forward, i-1..i-k in backward."""
    fsdp_units: list[FSDPModule] = [u for u in units if isinstance(u, FSDPModule)]
    for i, unit in enumerate(fsdp_units):
        if forward > 0 and i + 1 < len(fsdp_units):
            unit.set_modules_to_forward_prefetch(fsdp_units[i + 1 : i + 1 + forward])
        if backward > 0 and i > 0:
            unit.set_modules_to_backward_prefetch(fsdp_units[max(0, i - backward) : i][::-1])
