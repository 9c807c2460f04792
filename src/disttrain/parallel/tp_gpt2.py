"""Tensor parallelism for Hugging Face GPT-2 (``GPT2LMHeadModel`` and models built on ``GPT2Model``), whose
config carries no ``base_model_tp_plan``.

GPT-2's linear layers are ``Conv1D``: the weight is stored transposed, ``(in, out)``. torch's
``ColwiseParallel`` / ``RowwiseParallel`` know ``nn.Linear`` only, so :class:`Conv1DColwise` splits a Conv1D's
weight in dim 1 and its bias in dim 0, and :class:`Conv1DRowwise` its weight in dim 0 (its bias, added after
the reduction, stays whole); the input and output handling is torch's, unchanged.

The attention's ``c_attn`` packs q, then k, then v along its output: a plain column split would give rank 0
all of q and half of k. :class:`PackedQKVColwise` first reorders its columns head by head (q, k, v of head 0,
then head 1 ...: the same order at every tp, so a checkpoint moves between tp 2, 4, ...), splits that, and
puts the local output back in the q | k | v order the attention's forward splits (each ``split_size`` now
``embed_dim / tp``: :class:`LocalHeads`). Checkpoints and exports keep GPT-2's own order
(:mod:`disttrain.parallel.held_order`), so they move to any tp, tp 1 included, and load into Hugging Face.

Embeddings, the tied head and the norms stay whole (no vocabulary split, no sequence parallelism), as the
Llama plan Hugging Face ships does.
"""

from __future__ import annotations

from functools import partial
from typing import Any

import torch
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import Replicate, Shard, distribute_module, distribute_tensor
from torch.distributed.tensor.parallel import ColwiseParallel, ParallelStyle, RowwiseParallel

from disttrain.parallel.held_order import HELD_ORDER


def is_conv1d(module: nn.Module) -> bool:
    """A Hugging Face ``Conv1D`` (a linear layer whose weight is ``(in, out)``), by its shape, without
    importing transformers."""
    w = getattr(module, "weight", None)
    return (
        type(module).__name__ == "Conv1D"
        and isinstance(w, torch.Tensor)
        and tuple(w.shape) == (getattr(module, "nx", None), getattr(module, "nf", None))
    )


def _distribute(module: nn.Module, name: str, mesh: DeviceMesh, placement: Any, src_data_rank: int | None) -> None:
    param = getattr(module, name)
    dist = distribute_tensor(param, mesh, [placement], src_data_rank=src_data_rank)
    module.register_parameter(name, nn.Parameter(dist, requires_grad=param.requires_grad))


class Conv1DColwise(ColwiseParallel):
    """``ColwiseParallel`` for a Conv1D: the weight split in dim 1 (its output), the bias in dim 0."""

    def _partition_conv1d_fn(self, name: str, module: nn.Module, mesh: DeviceMesh) -> None:
        _distribute(module, "weight", mesh, Shard(1), self.src_data_rank)
        if getattr(module, "bias", None) is not None:
            _distribute(module, "bias", mesh, Shard(0), self.src_data_rank)

    def _apply(self, module: nn.Module, device_mesh: DeviceMesh) -> nn.Module:
        if not is_conv1d(module):
            return super()._apply(module, device_mesh)
        return _distribute_conv1d(self, module, device_mesh)


def _distribute_conv1d(style: Conv1DColwise | Conv1DRowwise, module: nn.Module, mesh: DeviceMesh) -> nn.Module:
    """``style``'s ``_apply`` for a Conv1D: its own partition of the parameters, the library's input and output
    hooks."""
    return distribute_module(  # type: ignore[no-any-return]
        module,
        mesh,
        style._partition_conv1d_fn,
        partial(style._prepare_input_fn, style.input_layouts, style.desired_input_layouts),  # type: ignore[arg-type]
        partial(style._prepare_output_fn, style.output_layouts, style.use_local_output),  # type: ignore[arg-type]
    )


class Conv1DRowwise(RowwiseParallel):
    """``RowwiseParallel`` for a Conv1D: the weight split in dim 0 (its input), the bias whole."""

    def _partition_conv1d_fn(self, name: str, module: nn.Module, mesh: DeviceMesh) -> None:
        _distribute(module, "weight", mesh, Shard(0), self.src_data_rank)
        if getattr(module, "bias", None) is not None:
            _distribute(module, "bias", mesh, Replicate(), self.src_data_rank)

    def _apply(self, module: nn.Module, device_mesh: DeviceMesh) -> nn.Module:
        if not is_conv1d(module):
            return super()._apply(module, device_mesh)
        self.desired_input_layouts = (Shard(-1),)  # as for a Linear: the input split over its last dim
        return _distribute_conv1d(self, module, device_mesh)


def qkv_order(heads: int, width: int) -> torch.Tensor:
    """Column indices that reorder a packed q | k | v output of ``width`` (= 3 x embed_dim) head by head: q, k, v
    of head 0, then of head 1 ... (``packed[..., qkv_order(h, w)]`` is head-major; ``argsort`` undoes it)."""
    embed = width // 3
    hd = embed // heads
    return torch.tensor([s * embed + h * hd + j for h in range(heads) for s in range(3) for j in range(hd)])


class PackedQKVColwise(Conv1DColwise):
    """GPT-2's ``c_attn`` split column-wise by whole heads (see the module's docstring)."""

    def __init__(self, heads: int) -> None:
        super().__init__()
        self.heads = heads

    def _apply(self, module: nn.Module, device_mesh: DeviceMesh) -> nn.Module:
        nf = int(getattr(module, "nf"))  # noqa: B009
        order = qkv_order(self.heads, nf)
        with torch.no_grad():
            for name, dim in (("weight", 1), ("bias", 0)):
                p = module.get_parameter(name) if getattr(module, name, None) is not None else None
                if p is not None:
                    module.register_parameter(name, nn.Parameter(p.index_select(dim, order), p.requires_grad))
        module = super()._apply(module, device_mesh)
        setattr(module, HELD_ORDER, {"weight": (1, order), "bias": (0, order)})  # stored in GPT-2's own order
        local_heads, hd = self.heads // device_mesh.size(), nf // 3 // self.heads

        def back_to_qkv(mod: nn.Module, args: Any, out: torch.Tensor) -> torch.Tensor:
            lead = out.shape[:-1]
            return out.reshape(*lead, local_heads, 3, hd).transpose(-3, -2).reshape(*lead, 3 * local_heads * hd)

        module.register_forward_hook(back_to_qkv)
        return module


class LocalHeads(ParallelStyle):
    """The attention module itself: its ``split_size`` (q, k and v's width in ``c_attn``'s output) becomes this
    rank's share, ``embed_dim / tp``; nothing else changes (its forward reads the head count from the shapes)."""

    def _apply(self, module: nn.Module, device_mesh: DeviceMesh) -> nn.Module:
        setattr(module, "split_size", int(getattr(module, "split_size")) // device_mesh.size())  # noqa: B009, B010
        return module


def is_gpt2(hf: nn.Module) -> bool:
    """A Hugging Face GPT-2 (its attention's ``c_attn`` a Conv1D packing q | k | v)."""
    cfg = getattr(hf, "config", None)
    return getattr(cfg, "model_type", None) == "gpt2" and any(is_conv1d(m) for m in hf.modules())


def gpt2_styles(prefix: str, heads: int) -> dict[str, ParallelStyle]:
    """Module paths under the GPT-2 base model at ``prefix`` (``transformer`` in ``GPT2LMHeadModel``) to styles:
    ``c_attn`` column-wise by whole heads, the attention's ``c_proj`` row-wise, the MLP as Megatron splits it."""
    p = f"{prefix}." if prefix else ""
    return {
        f"{p}h.*.attn": LocalHeads(),
        f"{p}h.*.attn.c_attn": PackedQKVColwise(heads),
        f"{p}h.*.attn.c_proj": Conv1DRowwise(),
        f"{p}h.*.mlp.c_fc": Conv1DColwise(),
        f"{p}h.*.mlp.c_proj": Conv1DRowwise(),
    }
