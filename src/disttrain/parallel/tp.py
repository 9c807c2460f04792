"""Tensor parallelism: a :class:`~disttrain.parallel.tp_plans.TPPlan` checked against the model and ``tp``, then
applied with torch's ``parallelize_module`` over the TP mesh dimension (before FSDP shards the data-parallel
dimensions, as torchtitan orders them); loss parallel (cross-entropy over the vocabulary shards) for a model
whose logits stay sharded.

The split itself is torch's (DTensor ``ColwiseParallel`` / ``RowwiseParallel``); this module owns the checks
that turn a bad fit into one line (a width or head count that ``tp`` does not divide, a plan path that matches
nothing) instead of a shape error deep in a forward.
"""

from __future__ import annotations

import contextlib
import dataclasses
import fnmatch
from collections.abc import Iterator

import torch
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor
from torch.distributed.tensor.parallel import ColwiseParallel, ParallelStyle, RowwiseParallel, parallelize_module
from torch.distributed.tensor.parallel import loss_parallel as torch_loss_parallel

from disttrain.errors import ConfigError
from disttrain.parallel.families import plan_for
from disttrain.parallel.tp_gpt2 import is_conv1d
from disttrain.parallel.tp_plans import TPPlan


def apply_tp(
    model: nn.Module,
    mesh: DeviceMesh,
    spec: str = "auto",
    loss_parallel: bool = True,
    sequence_parallel: bool = True,
    stage: bool = False,
) -> TPPlan:
    """Split ``model`` in place over the 1-D TP ``mesh`` by the plan ``spec`` names; returns the plan applied.
    A pipeline ``stage`` holds part of the model: the plan's paths it does not hold are left out."""
    plan = plan_for(model, spec, loss_parallel, sequence_parallel)
    if stage:
        held = {key: style for key, style in plan.styles.items() if matching(model, key)}
        plan = dataclasses.replace(plan, styles=held, vocab_sharded=plan.vocab_sharded and "head" in held)
    check_plan(model, plan, mesh.size())
    parallelize_module(model, mesh, plan.styles)
    return plan


def matching(model: nn.Module, key: str) -> list[tuple[str, nn.Module]]:
    """The modules a plan path names (``*`` matches one name, as in ``parallelize_module``)."""
    atoms = key.split(".")
    out = []
    for name, module in model.named_modules():
        parts = name.split(".") if name else []
        if len(parts) == len(atoms) and all(fnmatch.fnmatchcase(p, a) for p, a in zip(parts, atoms, strict=True)):
            out.append((name, module))
    return out


def check_plan(model: nn.Module, plan: TPPlan, tp: int) -> None:
    """Every plan path names a module, and every split size divides by ``tp``; else one ConfigError line."""
    for key, style in plan.styles.items():
        found = matching(model, key)
        if not found:
            raise ConfigError(
                f"tensor-parallel plan path {key!r} matches no module of {type(model).__name__}; "
                "fix the path (module names as model.named_modules() gives them) or the --model.tp-plan function"
            )
        if key in plan.uneven:
            continue
        for name, module in found:
            _check_split(name, module, style, tp)
    for key, heads in plan.heads.items():
        path, _, label = key.partition(" ")
        label = label.strip("()")
        what = f"{label} {heads} does" if label else f"{heads} attention heads do"
        for name in [n for n, _ in matching(model, path)] or [path]:
            if heads % tp:
                raise ConfigError(f"{name}: {what} not divide by parallel.tp ({tp}); use a tp that divides {heads}")


def _split_size(module: nn.Module, style: ParallelStyle) -> tuple[str, int] | None:
    """The size a column- or row-wise style splits, and its name."""
    sizes: dict[type, tuple[str, str]] = {
        nn.Linear: ("out_features", "in_features"),
        nn.Embedding: ("embedding_dim", "num_embeddings"),
    }
    names = next((v for k, v in sizes.items() if isinstance(module, k)), None)
    if names is None and is_conv1d(module):  # Hugging Face's transposed linear layer: nf outputs, nx inputs
        names = ("nf", "nx")
    if names is None or not isinstance(style, (ColwiseParallel, RowwiseParallel)):
        return None
    name = names[0] if isinstance(style, ColwiseParallel) else names[1]
    return name, int(getattr(module, name))


def _check_split(name: str, module: nn.Module, style: ParallelStyle, tp: int) -> None:
    size = _split_size(module, style)
    if size is not None and size[1] % tp:
        kind = "column" if isinstance(style, ColwiseParallel) else "row"
        raise ConfigError(
            f"{name} ({type(module).__name__}): {size[0]} {size[1]} does not divide by parallel.tp ({tp}) for its "
            f"{kind}-wise split; use a tp that divides {size[1]}, or change the model's width"
        )


@contextlib.contextmanager
def loss_parallel(enabled: bool) -> Iterator[None]:
    """torch's ``loss_parallel`` (cross-entropy over vocabulary-sharded logits) when ``enabled``; it must cover
    the loss and its backward."""
    if not enabled:
        yield
        return
    with torch_loss_parallel():
        yield


def local_value(t: torch.Tensor) -> torch.Tensor:
    """A plain tensor of ``t``'s value (a replicated DTensor loss becomes its full value)."""
    return t.full_tensor() if isinstance(t, DTensor) else t
