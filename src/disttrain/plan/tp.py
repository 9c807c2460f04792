"""Tensor parallelism in the plan: which parameters a TP plan splits, what one rank of a TP group holds and
computes (a *local profile*), and TP's collectives per optimizer step. Pure arithmetic over a
:class:`~disttrain.plan.profile.ModelProfile`; the styles come from :mod:`disttrain.parallel.tp_plans`.

- split parameters: ``ColwiseParallel`` splits a Linear's weight (and bias) in dim 0 and an Embedding's
  weight in dim 1; ``RowwiseParallel`` a Linear's weight in dim 1 (its bias is replicated) and an Embedding's
  in dim 0. A Hugging Face ``Conv1D`` (weight ``(in, out)``) splits as an Embedding does.
  DTensor splits unevenly by ``torch.chunk``: the first ranks hold ``ceil(d / tp)``, which the plan
  counts (the rank that holds the most). Norms (``SequenceParallel``) and everything else stay whole;
- the local profile has each split parameter's local shape, so FSDP's arithmetic (dim-0 shards over the
  data-parallel ranks, :mod:`disttrain.plan.estimate`) applies unchanged: parameters, gradients and optimizer
  state over shard x tp for the split ones, over shard only for the others;
- activations: with sequence parallelism every tensor a block saves is split over tp (the norms and dropouts
  run on sequence shards, the matmuls between on head or width shards); without, Megatron-LM's count per layer
  (arXiv 2205.05198: 10 of its 34 ``s b h`` bytes stay whole: the norms' and dropouts' inputs) keeps 10/34
  whole. With loss parallel the loss's vocabulary-sized tensors (the largest saved, and the two gradients as
  large at the start of backward) are split over tp; without, the logits are gathered, whole on each rank;
- compute: the FLOPs and, with sequence parallelism, the element-wise work split over tp; every rank
  dispatches every operator, so the framework time per operator does not shrink;
- candidates (:class:`TPOption`, :func:`tp_degrees`, :func:`tp_pick`): the TP degrees within a node that
  the plan weighs when a block does not fit or FSDP's traffic across nodes outruns the step's compute;
- traffic (:func:`tp_collectives`): per block and micro-step, with sequence parallelism an all-gather of the
  (micro-batch x sequence x d_model) activations before attention and before the MLP and a reduce-scatter
  after each, in forward, and the same again in backward (the gradients of an all-gather and of a
  reduce-scatter are each other); without it, an all-reduce after each in forward and before each in
  backward. A checkpointed block runs its forward's collectives again. All within a node (TP is innermost).

May import: ``disttrain.config``, ``disttrain.utils``, ``disttrain.parallel``, ``disttrain.plan.profile``,
``disttrain.plan.comm``.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

from torch import nn

from disttrain.config import JobConfig
from disttrain.parallel.activation import checkpointed_indices
from disttrain.plan.comm import Collective, accum_steps
from disttrain.plan.profile import ModelProfile, ParamInfo
from disttrain.utils.fmt import fmt_bytes

if TYPE_CHECKING:
    from torch.distributed.tensor.parallel import ParallelStyle

WHOLE_WITHOUT_SP = 10 / 34
"""Share of a block's saved activations that stays whole on each TP rank without sequence parallelism
(Megatron-LM, arXiv 2205.05198, section 4.2: the norms' and dropouts' ``10 s b h`` of ``34 s b h``)."""


def split_dims(model: nn.Module, styles: Mapping[str, ParallelStyle]) -> dict[str, int]:
    """Parameter name -> the dimension ``styles`` (a TP plan: module paths to styles) splits it in; parameters
    left out stay whole on every TP rank. ``model`` may be on the meta device."""
    # imported here: DTensor's import (~0.5 s) is for plans with tp > 1, not for every job's parent
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel

    from disttrain.parallel.tp import matching
    from disttrain.parallel.tp_gpt2 import is_conv1d

    out: dict[str, int] = {}
    for pattern, style in styles.items():
        if not isinstance(style, (ColwiseParallel, RowwiseParallel)):
            continue
        colwise = isinstance(style, ColwiseParallel)
        for path, module in matching(model, pattern):
            by_input = isinstance(module, nn.Embedding) or is_conv1d(module)  # weight (in, out): not Linear's
            for name, p in module.named_parameters(recurse=False):
                full = f"{path}.{name}" if path else name
                if name == "weight" and p.dim() == 2:
                    out[full] = (1 if colwise else 0) if by_input else (0 if colwise else 1)
                elif name == "bias" and colwise:
                    out[full] = 0  # a row-wise layer's bias is added after the reduction: replicated
    return out


def mark_split(prof: ModelProfile, dims: Mapping[str, int]) -> ModelProfile:
    """``prof`` with each parameter's ``tp_dim`` from :func:`split_dims`."""
    params = tuple(dataclasses.replace(p, tp_dim=dims.get(p.name, -1)) for p in prof.params)
    return dataclasses.replace(prof, params=params)


def local_param(p: ParamInfo, tp: int) -> ParamInfo:
    """What the rank holding the most of ``p`` keeps of it on a TP group of ``tp``: ``ceil(d / tp)`` of the
    split dimension (``torch.chunk``), the whole of a parameter the plan does not split."""
    if tp <= 1 or p.tp_dim < 0 or p.tp_dim >= len(p.shape):
        return p
    shape = list(p.shape)
    shape[p.tp_dim] = math.ceil(shape[p.tp_dim] / tp)
    return dataclasses.replace(p, shape=tuple(shape))


def local_profile(prof: ModelProfile, tp: int, *, sequence_parallel: bool, loss_parallel: bool) -> ModelProfile:
    """The profile of one rank of a TP group of ``tp``: local parameter shapes, activations, FLOPs and
    element-wise work (see the module's docstring for what splits)."""
    if tp <= 1:
        return prof
    block_share = 1 / tp if sequence_parallel else WHOLE_WITHOUT_SP + (1 - WHOLE_WITHOUT_SP) / tp
    vocab = min(prof.largest_act, prof.act_other)  # the loss's log-softmax over the vocabulary, saved outside
    other = prof.act_other - (vocab - math.ceil(vocab / tp) if loss_parallel else 0)
    return dataclasses.replace(
        prof,
        params=tuple(local_param(p, tp) for p in prof.params),
        act_by_block=tuple(math.ceil(a * block_share) for a in prof.act_by_block),
        act_other=other,
        block_input_bytes=tuple(
            math.ceil(b / tp) if sequence_parallel else b for b in prof.block_input_bytes
        ),  # what a checkpointed block keeps: its input, a sequence shard under sequence parallelism
        largest_act=math.ceil(prof.largest_act / tp) if loss_parallel else prof.largest_act,
        train_flops=prof.train_flops / tp,
        forward_elements=prof.forward_elements // tp if sequence_parallel else prof.forward_elements,
    )


def split_numel(prof: ModelProfile) -> int:
    """Elements of the parameters the TP plan splits (0: the plan splits nothing of this model)."""
    return sum(p.numel for p in prof.params if p.tp_dim >= 0)


def tp_collectives(prof: ModelProfile, cfg: JobConfig, tp: int, dp: int) -> list[Collective]:
    """TP's collectives of one optimizer step on one rank (``dp`` data-parallel groups share the global
    batch): per block and micro-step, around attention and around the MLP, on the intra-node link.

    ``prof`` is one rank's (:func:`local_profile`). ``nbytes`` of each is a block's whole input
    (micro-batch x sequence x d_model in the dtype the residual stream has, as the profile saw it): under
    sequence parallelism a rank holds a sequence shard of it, ``1 / tp``."""
    if tp <= 1 or not prof.n_blocks:
        return []
    accum = accum_steps(cfg, dp)
    recomputed = len(checkpointed_indices(cfg.parallel.activation_checkpointing, prof.n_blocks))
    act = max(prof.block_input_bytes) * (tp if cfg.parallel.sequence_parallel else 1)
    # per micro-step: 2 (attention, MLP) per pass; forward + backward, and forward again for a recomputed block
    passes = 2 * prof.n_blocks + recomputed
    calls = 2 * passes * accum
    if cfg.parallel.sequence_parallel:
        return [
            Collective("all_gather", act, tp, "intra", calls, "TP all-gather (blocks, sequence)"),
            Collective("reduce_scatter", act, tp, "intra", calls, "TP reduce-scatter (blocks, sequence)"),
        ]
    return [Collective("all_reduce", act, tp, "intra", calls, "TP all-reduce (blocks)")]


@dataclass(frozen=True)
class TPOption:
    """One candidate layout with tensor parallelism: the column the plan would run over its TP groups, its
    bytes per rank and predicted step."""

    tp: int
    column: str
    label: str
    total: int
    fits: bool
    predicted_s: float
    sent_inter: float


def tp_degrees(nproc: int) -> list[int]:
    """TP degrees worth weighing on a node of ``nproc`` ranks: 2, 4, 8, ... that divide it (TP stays within a
    node, where the link is fastest)."""
    return [t for t in (2**i for i in range(1, max(nproc, 1).bit_length())) if nproc % t == 0]


def tp_pick(
    options: tuple[TPOption, ...], *, fits: bool, inter_s: float, compute_s: float, step_s: float
) -> tuple[TPOption | None, str]:
    """The TP layout to prefer, and one sentence that says why (None and "" when none would help; a sentence
    and None when nothing fits with TP either): nothing fits without it (``fits`` False), or the chosen
    strategy's traffic across nodes (``inter_s`` seconds of the link per step) is more than its compute
    (``compute_s``) can cover and a TP layout is predicted faster than its ``step_s``. The fastest that fits."""
    usable = [o for o in options if o.fits and o.tp > 1]
    best = min(usable, key=lambda o: o.predicted_s, default=None)
    if not fits:
        if best is None:
            return None, f"tensor parallelism up to tp {max((o.tp for o in options), default=1)} does not fit either"
        return best, (
            f"nothing fits without tensor parallelism, and {best.label} fits ({fmt_bytes(best.total)} per rank, "
            f"{best.predicted_s:.3g} s/step)"
        )
    if inter_s <= compute_s or best is None or best.predicted_s >= step_s:
        return None, ""
    return best, (
        f"the traffic across nodes takes {inter_s:.3g} s of the link per step, more than the {compute_s:.3g} s of "
        f"compute, and {best.label} is predicted faster ({best.predicted_s:.3g} s/step against {step_s:.3g})"
    )
