"""``parallelize``, the public API: a layout (:class:`~disttrain.parallel.mesh.ParallelDims`) applied to a model,
the one place a model becomes distributed, in one order (torchtitan's): tensor parallelism on each block, then
activation checkpointing, then compile, then the data-parallel strategy (FSDP2 / HSDP / DDP, the objects in
:mod:`disttrain.parallel.strategies`). A new dimension is one step in that order (a pipeline split first).

:func:`parallelize` returns a :class:`Parallelized` that the training loop (yours or ours) uses
without knowing which strategy is underneath: ``sync(last)`` controls gradient sync during
accumulation, ``autocast()`` is the mixed-precision context, ``loss_parallel()`` wraps the loss and its
backward (cross-entropy over vocabulary shards under TP), ``clip_grad_norm_`` returns the *global*
norm (the full norm under FSDP and TP, not one shard's).
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import nn

from disttrain.config import ParallelConfig, PrecisionConfig
from disttrain.errors import ConfigError
from disttrain.parallel.activation import apply_activation_checkpointing
from disttrain.parallel.clip import clip_grad_norm_
from disttrain.parallel.compile import apply_compile
from disttrain.parallel.env import resolve_precision
from disttrain.parallel.fsdp import find_blocks
from disttrain.parallel.mesh import ParallelDims
from disttrain.parallel.strategies import Strategy, WrapSettings, dims_from_config, for_dims
from disttrain.parallel.tp import apply_tp, loss_parallel


@dataclass
class Parallelized:
    """A model wrapped for its strategy, plus the few controls a training loop needs (each one the
    strategy's: :class:`~disttrain.parallel.strategies.Strategy`)."""

    module: nn.Module
    """The wrapped model: call it like the original."""
    inner: nn.Module
    """The original model (under FSDP it *is* ``module``, sharded in place)."""
    dims: ParallelDims
    device: torch.device
    compute_dtype: str
    vocab_parallel: bool = False
    """The model's logits are a DTensor sharded over the vocabulary (TP's loss parallel)."""

    @property
    def strategy(self) -> str:
        return self.dims.strategy

    @property
    def impl(self) -> Strategy:
        return for_dims(self.dims)

    def __call__(self, *args: object, **kwargs: object) -> torch.Tensor:
        return self.module(*args, **kwargs)

    def parameters(self) -> Iterator[nn.Parameter]:
        return self.module.parameters()

    def sync(self, enabled: bool) -> contextlib.AbstractContextManager[None]:
        """Wrap forward+backward of a micro-step; gradients are reduced only when ``enabled`` (the last one)."""
        return self.impl.sync(self.module, enabled)

    def autocast(self) -> contextlib.AbstractContextManager[object]:
        """Low-precision compute for single/DDP (FSDP casts parameters itself, through its policy)."""
        return self.impl.autocast(self.device.type, self.compute_dtype)

    def loss_parallel(self) -> contextlib.AbstractContextManager[None]:
        """Wrap the loss and its backward: cross-entropy over the vocabulary shards when the logits are sharded."""
        return loss_parallel(self.vocab_parallel)

    def clip_grad_norm_(self, max_norm: float) -> float:
        """Clip to ``max_norm`` (0 = just measure) and return the global L2 norm of all gradients."""
        if self.dims.tp > 1:  # parameters on several meshes (TP-split, replicated): a norm per mesh, combined
            return clip_grad_norm_(self.module.parameters(), max_norm)
        return self.impl.clip_grad_norm_(self.module, max_norm)


def current_device() -> torch.device:
    if torch.cuda.is_available():
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def _check_layout(dims: ParallelDims, parallel: ParallelConfig) -> None:
    if dims.world_size > 1 and not dist.is_initialized():
        raise RuntimeError(
            f"strategy {dims.strategy!r} over {dims.world_size} ranks needs a process group; "
            "start the script with `disttrain launch -n N script.py` (or torchrun) and call init_distributed()"
        )
    unbuilt = {name: getattr(dims, name) for name in ("pp", "cp", "ep") if getattr(dims, name) > 1}
    if unbuilt:
        raise ConfigError(
            f"the layout {dims.describe()} has {', '.join(f'{k} {v}' for k, v in unbuilt.items())}: ParallelDims "
            "admits these degrees, but parallelize does not apply them yet; set them to 1"
        )
    if parallel.offload and not dims.fsdp_enabled:
        raise ConfigError(
            "parallel.offload keeps FSDP's shards in host memory; it needs strategy fsdp or hsdp, "
            f"not {dims.strategy!r}"
        )


def parallelize(
    model: nn.Module,
    parallel: ParallelConfig | None = None,
    precision: PrecisionConfig | None = None,
    *,
    dims: ParallelDims | None = None,
    device: torch.device | None = None,
    tp_plan: str = "auto",
) -> Parallelized:
    """Apply the configured strategy to ``model``; a meta-device model is materialised here.

    With ``parallel.tp`` > 1 the model is first split over the TP mesh dimension by ``tp_plan``
    (``model.tp_plan``: :func:`disttrain.parallel.tp_plans.plan_for`), then activation checkpointing, compile
    and the data-parallel strategy are applied as without it (torchtitan's order).

    Without ``dims``, the layout comes from the running process group (or a single process) and
    ``parallel.strategy``; without ``device``, this rank's current device; a ``precision.dtype`` of ``auto``
    is decided for that device (the Trainer passes all three resolved: :class:`disttrain.config.ResolvedJob`).
    """
    parallel = parallel or ParallelConfig()
    precision = precision or PrecisionConfig()
    if dims is None:
        world = dist.get_world_size() if dist.is_initialized() else 1
        dims = dims_from_config(parallel, world, int(os.environ.get("LOCAL_WORLD_SIZE", world)))
    device = device or current_device()
    if precision.dtype == "auto":
        precision = resolve_precision(precision, device.type)
    _check_layout(dims, parallel)
    vocab_parallel = False
    if dims.tp > 1:
        mesh = dims.tp_mesh(device.type)
        vocab_parallel = apply_tp(
            model, mesh, tp_plan, parallel.loss_parallel, parallel.sequence_parallel
        ).vocab_sharded
    blocks = find_blocks(model, parallel.shard_modules)
    apply_compile(model, blocks, parallel.compile, device.type, checkpointing=parallel.activation_checkpointing)
    if parallel.activation_checkpointing != "none":
        apply_activation_checkpointing(blocks, parallel.activation_checkpointing)
    wrapped = for_dims(dims).wrap(model, dims, WrapSettings(parallel, precision, device))
    return Parallelized(wrapped, model, dims, device, precision.dtype, vocab_parallel)
