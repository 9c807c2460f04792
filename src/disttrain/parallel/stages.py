"""Cutting a model into pipeline stages (plain module surgery, no torch.distributed import): what this rank
holds of the :class:`~disttrain.parallel.pipeline_layout.PipelineLayout`, and what each block costs a stage.

The model is cut, not copied: this rank keeps the blocks of its stages in a
:class:`~disttrain.parallel.blocks.StageBlocks` (keyed by their index in the whole model, so every parameter
keeps its name: a pipeline checkpoint loads into any other layout and back), the embeddings only where it holds
the first stage, the final norm and head only where it holds the last. That model is what the optimizer and
checkpoints see; with several stages per rank each stage is a view of it holding its own blocks (the same
parameters). A model family says which of its modules come before and after the blocks
(:data:`STAGE_PARTS`); the model's forward takes hidden states where its embeddings are gone and returns them
where its head is.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import TYPE_CHECKING

from torch import nn

from disttrain.errors import ConfigError
from disttrain.parallel.blocks import StageBlocks
from disttrain.parallel.pipeline_layout import PipelineLayout, StageCosts, plan_pipeline

if TYPE_CHECKING:
    from disttrain.config import ParallelConfig


@dataclass(frozen=True)
class StageParts:
    """Where a family's model keeps the pieces a pipeline cuts: the modules before the blocks (attribute
    names on the model), the blocks' ModuleList, the modules after them."""

    before: tuple[str, ...]
    blocks: str
    after: tuple[str, ...]


STAGE_PARTS = {"gpt": StageParts(("tok_emb", "pos_emb"), "blocks", ("ln_f", "head"))}
"""The families a pipeline can cut today, by name (:mod:`disttrain.parallel.families`)."""


def parts_of(family: str) -> StageParts:
    """The family's pieces, or a ConfigError naming the families a pipeline can split."""
    if family not in STAGE_PARTS:
        raise ConfigError(
            f"parallel.pp > 1 splits a model into stages, but the {family} family has no stage split yet (it "
            f"exists for: {', '.join(STAGE_PARTS)}); use parallel.pp 1 with FSDP/TP for this model"
        )
    return STAGE_PARTS[family]


def stage_costs(model: nn.Module, family: str) -> StageCosts:
    """Each block's, the embeddings' and the head's cost per token (their matmul weights' elements; the
    embeddings are a lookup and cost nothing) for :func:`~disttrain.parallel.pipeline_layout.balanced_starts`."""
    parts = parts_of(family)
    blocks = model.get_submodule(parts.blocks)

    def matmul_elements(m: nn.Module) -> float:
        return float(sum(p.numel() for p in m.parameters() if p.dim() >= 2))

    last = sum(matmul_elements(model.get_submodule(name)) for name in parts.after)
    return StageCosts([matmul_elements(b) for b in blocks.children()], 0.0, last)


def cut_model(model: nn.Module, layout: PipelineLayout, pp_rank: int, family: str) -> list[nn.Module]:
    """Cut ``model`` in place to what pipeline rank ``pp_rank`` holds; its stage modules, in the order of
    :meth:`PipelineLayout.stages_of` (the model itself where it holds one stage)."""
    parts = parts_of(family)
    mine = layout.stages_of(pp_rank)
    blocks = model.get_submodule(parts.blocks)
    if not isinstance(blocks, nn.ModuleList):
        raise ConfigError(f"{parts.blocks} of this model is a {type(blocks).__name__}, not the blocks' ModuleList")
    kept = sorted(i for s in mine for i in layout.blocks_of(s))
    _set(model, parts.blocks, StageBlocks({str(i): blocks[i] for i in kept}))
    holds_first, holds_last = 0 in mine, layout.stages - 1 in mine
    for name in parts.before if not holds_first else ():
        _set(model, name, None)
    for name in parts.after if not holds_last else ():
        _set(model, name, None)
    if len(mine) == 1:
        return [model]
    return [_view(model, parts, layout, s) for s in mine]


def _set(model: nn.Module, path: str, value: nn.Module | None) -> None:
    parent, _, name = path.rpartition(".")
    setattr(model.get_submodule(parent) if parent else model, name, value)


def _view(model: nn.Module, parts: StageParts, layout: PipelineLayout, stage: int) -> nn.Module:
    """A stage of ``model``: the same modules and parameters, holding only the stage's blocks and ends."""
    # (a view copies the model's own module table only: the pieces must be the model's own attributes)
    assert all("." not in name for name in (*parts.before, parts.blocks, *parts.after)), parts
    view = copy.copy(model)
    view.__dict__["_modules"] = dict(model._modules)
    own = model.get_submodule(parts.blocks)
    assert isinstance(own, StageBlocks)  # cut_model made it
    _set(view, parts.blocks, StageBlocks({str(i): own[str(i)] for i in layout.blocks_of(stage)}))
    for name in parts.before if stage != 0 else ():
        _set(view, name, None)
    for name in parts.after if stage != layout.stages - 1 else ():
        _set(view, name, None)
    return view


def plan_for_model(model: nn.Module, family: str, parallel: ParallelConfig, micro_batch: int) -> PipelineLayout:
    """The pipeline ``parallel`` asks for over ``model`` (whole, before any cut), fed ``micro_batch`` samples per
    rank and step: :func:`~disttrain.parallel.pipeline_layout.plan_pipeline` with the model's stage costs."""
    par = parallel
    return plan_pipeline(
        par.pp,
        par.pp_schedule,
        par.pp_microbatches,
        par.pp_stages_per_rank,
        par.pp_split,
        stage_costs(model, family),
        micro_batch,
    )
