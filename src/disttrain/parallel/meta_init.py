"""Materialise a model built on the meta device, and prove every parameter and buffer was initialised.

After ``to_empty`` every parameter and floating buffer is filled with NaN, then the model's own
initialisation runs, in this order:

1. ``init_param(name, full_tensor)`` (the built-in GPT): the *full* tensor is drawn on CPU, then each rank
   keeps its own shard: the weights equal a single-process build bit for bit, whatever the sharding;
2. otherwise Hugging Face's ``init_weights()`` on each Hugging Face model in the tree (``_init_weights`` per
   module, rotary tables recomputed, weights tied), then the root's own ``init_weights()`` if it has one;
3. ``reset_parameters()`` of each module whose own tensors still hold NaN.

Buffers that were real before (computed at build time, see :func:`disttrain.build.build_for_training`) are
put back. Anything still NaN stops the job on every rank with one line naming it and the fixes.
"""

from __future__ import annotations

import math

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.tensor import DTensor, distribute_tensor

from disttrain.build import hf_models
from disttrain.errors import MetaDeviceError


def is_meta(model: nn.Module) -> bool:
    return any(t.is_meta for t in [*model.parameters(), *model.buffers()])


def _local(t: torch.Tensor) -> torch.Tensor:
    return t.to_local() if isinstance(t, DTensor) else t


def _checked(model: nn.Module) -> list[tuple[str, torch.Tensor]]:
    """The tensors the check covers: every parameter, and every floating-point buffer (NaN-able)."""
    out: list[tuple[str, torch.Tensor]] = list(model.named_parameters())
    out += [(n, b) for n, b in model.named_buffers() if b.is_floating_point()]
    return out


def _hf_init(model: nn.Module) -> None:
    """Hugging Face's own initialisation on each Hugging Face model in the tree, its "done" flags cleared
    first (they were set, or skipped, while the model was built on the meta device)."""
    for hf in hf_models(model):
        for m in hf.modules():
            m.__dict__.pop("_is_hf_initialized", None)
        for t in [*hf.parameters(), *hf.buffers()]:
            t.__dict__.pop("_is_hf_initialized", None)
        hf.init_weights()  # type: ignore[operator]


def _reset_uninitialised(model: nn.Module) -> None:
    for m in model.modules():
        reset = getattr(m, "reset_parameters", None)
        own = [*m.parameters(recurse=False), *(b for b in m.buffers(recurse=False) if b.is_floating_point())]
        if callable(reset) and any(bool(torch.isnan(_local(t)).any()) for t in own):
            reset()


@torch.no_grad()
def materialize(model: nn.Module, device: torch.device) -> None:
    """Allocate storage for a meta-device (possibly sharded) model on ``device``, initialise it, check it."""
    kept = {n: b.detach().clone() for n, b in model.named_buffers() if not b.is_meta}
    model.to_empty(device=device)
    for _, t in _checked(model):
        _local(t).fill_(math.nan)
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
    else:
        _hf_init(model)
        init_weights = getattr(model, "init_weights", None)
        if callable(init_weights) and not any(m is model for m in hf_models(model)):
            init_weights()
        _reset_uninitialised(model)
    buffers = dict(model.named_buffers())
    for name, value in kept.items():
        _local(buffers[name]).copy_(value.to(device))
    check_initialised(model)


def check_initialised(model: nn.Module) -> None:
    """Raise MetaDeviceError (on every rank alike) naming tensors that still hold NaN after initialisation."""
    bad = [n for n, t in _checked(model) if bool(torch.isnan(_local(t)).any())]
    if dist.is_initialized() and dist.get_world_size() > 1:  # a shard with NaN on any rank: every rank stops
        every: list[list[str] | None] = [None] * dist.get_world_size()
        dist.all_gather_object(every, bad)  # (names, not flags: a pipeline's ranks hold different tensors)
        bad = list(dict.fromkeys(n for names in every for n in names or []))
    if bad:
        more = f" and {len(bad) - 4} more" if len(bad) > 4 else ""
        raise MetaDeviceError(
            f"after building on the meta device, {len(bad)} tensor(s) were never initialised "
            f"({', '.join(bad[:4])}{more}): nothing in the model sets them (no init_param, init_weights() or "
            "reset_parameters() covers them); define init_weights() on your model, start from weights "
            "(--model.weights or a seed checkpoint), or build it on CPU with --parallel.init cpu"
        )
