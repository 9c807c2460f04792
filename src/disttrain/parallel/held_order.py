"""Parameters a tensor-parallel plan holds in another order than the model defines them (GPT-2's packed
q | k | v, reordered head by head so that a column split is whole heads: :mod:`disttrain.parallel.tp_gpt2`).

A module that holds a parameter reordered says so in ``HELD_ORDER``: ``{parameter name: (dim, order)}``, the
held tensor being ``defined.index_select(dim, order)``. Checkpoints and exports store the model's own order
(:func:`to_defined` on the way out, :func:`to_held` on the way in), so a checkpoint moves between tp 1, 2, 4
and an export loads into the unsplit model. Optimizer state shaped like its parameter is reordered with it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
from torch import nn
from torch.distributed.tensor import DTensor, distribute_tensor

HELD_ORDER = "_disttrain_held_order"


def held_orders(model: nn.Module) -> dict[str, tuple[int, torch.Tensor]]:
    """Fully qualified parameter name -> (dim, order) for every parameter held reordered."""
    out = {}
    for path, module in model.named_modules():
        for name, how in getattr(module, HELD_ORDER, {}).items():
            out[f"{path}.{name}" if path else name] = how
    return out


def _reindex(t: torch.Tensor, dim: int, index: torch.Tensor) -> torch.Tensor:
    if not isinstance(t, DTensor):
        return t.index_select(dim, index)
    full = t.full_tensor().index_select(dim, index)  # a collective: every rank of the mesh calls it
    return distribute_tensor(full, t.device_mesh, t.placements, src_data_rank=None)  # each rank its own slice


def to_defined(t: torch.Tensor, dim: int, order: torch.Tensor) -> torch.Tensor:
    """A held tensor in the model's own order."""
    return _reindex(t, dim, torch.argsort(order))


def to_held(t: torch.Tensor, dim: int, order: torch.Tensor) -> torch.Tensor:
    """A tensor in the model's own order, as the plan holds it."""
    return _reindex(t, dim, order)


def _convert(
    model_sd: dict[str, Any], optim_sd: Mapping[str, Any] | None, orders: dict[str, tuple[int, torch.Tensor]], fn: Any
) -> None:
    for name, (dim, order) in orders.items():
        if name in model_sd:
            shape = model_sd[name].shape
            model_sd[name] = fn(model_sd[name], dim, order)
            state = (optim_sd or {}).get("state", {}).get(name, {})
            for key, value in list(state.items()):
                if isinstance(value, torch.Tensor) and value.shape == shape:
                    state[key] = fn(value, dim, order)


def state_to_defined(model: nn.Module, model_sd: dict[str, Any], optim_sd: Mapping[str, Any] | None = None) -> None:
    """Put the reordered parameters (and their optimizer state) of a state dict in the model's own order, in
    place (collective where they are DTensors)."""
    orders = held_orders(model)
    if orders:
        _convert(model_sd, optim_sd, orders, to_defined)


def state_to_held(model: nn.Module, model_sd: dict[str, Any], optim_sd: Mapping[str, Any] | None = None) -> None:
    """The inverse of :func:`state_to_defined`: a loaded state dict as the plan holds it, in place."""
    orders = held_orders(model)
    if orders:
        _convert(model_sd, optim_sd, orders, to_held)
