"""``fsdp``: FSDP2 ``fully_shard`` per unit of blocks over every rank (ZeRO-3, or ZeRO-2 without reshard)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import TYPE_CHECKING

import torch
from torch import nn

from disttrain.errors import ConfigError
from disttrain.parallel.strategies.base import Strategy, WrapSettings

if TYPE_CHECKING:
    from disttrain.parallel.mesh import ParallelDims


class FSDP(Strategy):
    name = "fsdp"
    shards_parameters = True
    casts_parameters = True

    def canonical(self, replicate: int) -> str:
        return "hsdp" if replicate > 1 else self.name  # fsdp with replica groups is HSDP

    def degrees(self, world: int, replicate: int, shard: int, local_world: int | None) -> tuple[int, int]:
        if shard not in (-1, world):
            raise ConfigError(
                f"FSDP shards over all {world} ranks, but parallel.shard is {shard}; "
                "use --parallel.strategy hsdp to shard within groups, or leave shard at -1"
            )
        return 1, world

    def state_ranks(self, nproc: int, nnodes: int) -> int:
        return nproc * nnodes

    def wrap(self, model: nn.Module, dims: ParallelDims, how: WrapSettings) -> nn.Module:
        from disttrain.parallel.fsdp import apply_fsdp
        from disttrain.parallel.meta_init import is_meta, materialize

        parallel, device = how.parallel, how.device
        apply_fsdp(
            model,
            dims.fsdp_mesh(device.type),
            param_dtype=how.precision.dtype,
            reduce_dtype=how.precision.reduce_dtype,
            shard_modules=parallel.shard_modules,
            reshard_after_forward=parallel.reshard_after_forward,
            blocks_per_unit=parallel.blocks_per_unit,
            root_units=parallel.root_units,
            forward_prefetch=parallel.forward_prefetch,
            backward_prefetch=parallel.backward_prefetch,
            offload=parallel.offload,
        )
        home = torch.device("cpu") if parallel.offload else device  # offloaded shards live in host memory
        if device.type == "meta":
            return model  # a dry run: the shards' shapes, nothing allocated
        if is_meta(model):
            materialize(model, home)
        else:
            model.to(home)
        return model

    @contextlib.contextmanager
    def sync(self, module: nn.Module, enabled: bool) -> Iterator[None]:
        from torch.distributed.fsdp import FSDPModule  # (here: the parent that resolves a job never shards)

        if isinstance(module, FSDPModule):
            module.set_requires_gradient_sync(enabled)
        yield

    def grad_scaler(self, device_type: str) -> torch.amp.GradScaler:
        from torch.distributed.fsdp.sharded_grad_scaler import ShardedGradScaler

        return ShardedGradScaler(device_type)  # agrees on an overflow found in any rank's shard
