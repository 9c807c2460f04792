"""The :class:`Strategy` interface: one way to spread a model, its gradients and optimizer state over ranks.

A strategy owns everything that differs between DDP, FSDP and the rest: how its degrees are checked, the
mesh it needs, how it wraps a model, gradient sync during accumulation, autocast, the clipping norm, how a
scaler agrees on overflow, and the terms the plan needs (over how many ranks one copy of the model state is
spread). Callers hold a strategy object and ask it; nobody compares strategy names (after Lightning Fabric's
``strategies/``).
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar

import torch
from torch import nn

from disttrain.config import DTYPES, ParallelConfig, PrecisionConfig
from disttrain.errors import ConfigError

if TYPE_CHECKING:
    from disttrain.parallel.mesh import ParallelDims


@dataclass(frozen=True)
class WrapSettings:
    """What a strategy wraps a model with: the parallel and precision settings, and this rank's device."""

    parallel: ParallelConfig
    precision: PrecisionConfig
    device: torch.device


class Strategy:
    """Data parallelism over every rank; subclasses differ in where parameters, gradients and optimizer state
    live. Stateless: one instance per name serves every job."""

    name: ClassVar[str]
    shards_parameters: ClassVar[bool] = False
    """Parameters, gradients and optimizer state are sharded (the model is built on the meta device)."""
    casts_parameters: ClassVar[bool] = False
    """The wrapper runs the compute in low precision itself (FSDP's mixed-precision policy): no autocast."""
    alone: ClassVar[bool] = False
    """Runs in one process (``parallel.nproc`` defaults to 1 for it, not to every device)."""
    across_nodes_only: ClassVar[bool] = False
    """Differs from a simpler strategy only across several nodes of several ranks (HSDP; on one node it is
    FSDP), so the plan considers it only there."""

    def __repr__(self) -> str:
        return f"<strategy {self.name}>"

    # -- layout --------------------------------------------------------------------------------------
    def canonical(self, replicate: int) -> str:
        """The name this layout runs as (FSDP with replica groups is HSDP)."""
        return self.name

    def degrees(self, world: int, replicate: int, shard: int, local_world: int | None) -> tuple[int, int]:
        """``(replicate, shard)`` resolved from the user's settings (-1: the rest), or a ConfigError."""
        if replicate not in (-1, 1, world) or shard not in (-1, 1):
            raise ConfigError(
                f"parallel.replicate/shard ({replicate} x {shard}) apply to fsdp/hsdp, not {self.name!r}; "
                "leave them at -1 or use --parallel.strategy hsdp"
            )
        return world, 1

    def state_ranks(self, nproc: int, nnodes: int) -> int:
        """Ranks one copy of the parameters, gradients and optimizer state is spread over (the plan's divisor)."""
        return 1

    def check_tp(self, dp_size: int, tp: int) -> None:
        """A ConfigError when this strategy cannot run ``dp_size`` data-parallel groups of ``tp`` ranks."""

    # -- the model -----------------------------------------------------------------------------------
    def wrap(self, model: nn.Module, dims: ParallelDims, how: WrapSettings) -> nn.Module:
        """``model`` (materialised on ``how.device`` if it is on the meta device) wrapped for this strategy; with
        ``how.device`` the meta device, a dry run's: the layout applied, nothing allocated."""
        from disttrain.parallel.meta_init import is_meta, materialize

        if how.device.type == "meta":
            return model
        if is_meta(model):
            materialize(model, how.device)
        return model.to(how.device)

    @contextlib.contextmanager
    def sync(self, module: nn.Module, enabled: bool) -> Iterator[None]:
        """Wrap forward+backward of a micro-step; gradients are reduced only when ``enabled`` (the last one)."""
        yield

    def autocast(self, device_type: str, compute_dtype: str) -> contextlib.AbstractContextManager[object]:
        """The mixed-precision context for the forward pass (none where the wrapper casts parameters itself)."""
        if compute_dtype == "fp32" or self.casts_parameters:
            return contextlib.nullcontext()
        return torch.autocast(device_type, dtype=DTYPES[compute_dtype])

    def clip_grad_norm_(self, module: nn.Module, max_norm: float) -> float:
        """Clip to ``max_norm`` (0 = just measure) and return the global L2 norm of all gradients."""
        params = [p for p in module.parameters() if p.grad is not None]
        norm = torch.nn.utils.clip_grad_norm_(params, max_norm if max_norm > 0 else math.inf, foreach=True)
        # imported here: DTensor's import (~0.8 s, sympy included) is only for processes that shard; the parent
        # that resolves a job never needs it
        from torch.distributed.tensor import DTensor

        if isinstance(norm, DTensor):  # a sharded norm: the full one, not this rank's shard's
            norm = norm.full_tensor()
        return float(norm)

    def grad_scaler(self, device_type: str) -> torch.amp.GradScaler:
        """fp16's loss scaler (every rank must agree on an overflow)."""
        return torch.amp.GradScaler(device_type)
