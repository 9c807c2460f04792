"""Tensor-parallel plans: which module is split how, for the built-in GPT, Hugging Face models (their config's
own ``base_model_tp_plan``; GPT-2's from :mod:`disttrain.parallel.tp_gpt2`) and a user's
``--model.tp-plan pkg.mod:fn``; which one a model gets is its family's to say (:mod:`disttrain.parallel.families`).

A :class:`TPPlan` is what ``parallelize_module`` takes (module paths, ``*`` matching one name, to
``ParallelStyle`` objects) plus what the checks need: the attention modules' head counts, and the modules
allowed to split unevenly (the vocabulary). Building the plan is pure; :mod:`disttrain.parallel.tp` applies it.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from torch import nn
from torch.distributed.tensor import Replicate, Shard
from torch.distributed.tensor.parallel import (
    ColwiseParallel,
    ParallelStyle,
    PrepareModuleOutput,
    RowwiseParallel,
    SequenceParallel,
)
from torch.distributed.tensor.placement_types import Placement

from disttrain.build import hf_models, import_object
from disttrain.errors import ConfigError
from disttrain.models.gpt import GPT
from disttrain.parallel.tp_gpt2 import gpt2_styles, is_gpt2

STYLES: dict[str, Callable[[], ParallelStyle]] = {
    "colwise": ColwiseParallel,
    "rowwise": RowwiseParallel,
    "colwise_rep": lambda: ColwiseParallel(output_layouts=Replicate()),
    "rowwise_rep": lambda: RowwiseParallel(input_layouts=Replicate()),
}
"""Style names a plan may use instead of objects (Hugging Face's names, where they mean the same)."""


@dataclass
class TPPlan:
    """Module paths to styles, and the facts the checks need."""

    styles: dict[str, ParallelStyle]
    heads: dict[str, int] = field(default_factory=dict)
    """Module path (``*`` allowed) -> attention heads it splits (each rank keeps heads / tp of them)."""
    uneven: frozenset[str] = frozenset()
    """Plan keys whose split dimension may be uneven (the vocabulary: DTensor shards it by torch.chunk)."""
    vocab_sharded: bool = False
    """The model's output (the logits) stays a DTensor sharded over the vocabulary: loss parallel."""


def gpt_plan(model: GPT, loss_parallel: bool, sequence_parallel: bool = True) -> TPPlan:
    """Megatron's split of the built-in GPT (as torchtitan's llama3 ``parallelize``): the attention's fused
    qkv and the MLP's first layer column-wise (each rank keeps whole heads: qkv's rows are head-major), their
    output projections row-wise, the embeddings row-wise, the head column-wise over the vocabulary (its logits
    kept sharded for loss parallel, else gathered).

    With ``sequence_parallel`` the norms run on sequence shards (``SequenceParallel``) and the residual stream
    between the matmuls is split over the sequence: the row-wise layers reduce-scatter instead of all-reducing
    and the column-wise ones all-gather their input (the same bytes as one all-reduce, activations / tp).
    Without it the norms are replicated."""
    seq: Placement = Shard(1) if sequence_parallel else Replicate()  # the residual stream between the matmuls
    head = (
        ColwiseParallel(input_layouts=seq, output_layouts=Shard(-1), use_local_output=False)
        if loss_parallel
        else ColwiseParallel(input_layouts=seq, output_layouts=Replicate())
    )
    styles: dict[str, ParallelStyle] = {
        "tok_emb": RowwiseParallel(input_layouts=Replicate(), output_layouts=Replicate()),
        "pos_emb": RowwiseParallel(input_layouts=Replicate(), output_layouts=Replicate()),
    }
    if sequence_parallel:  # the embeddings (replicated) become this rank's sequence slice after their dropout
        # (not at the first block's input: a hook there is outside what activation checkpointing recomputes)
        styles["drop"] = PrepareModuleOutput(
            output_layouts=Replicate(), desired_output_layouts=seq, use_local_output=True
        )
        styles.update({norm: SequenceParallel() for norm in ("blocks.*.ln1", "blocks.*.ln2", "ln_f")})
    styles.update(
        {
            "blocks.*.attn.qkv": ColwiseParallel(input_layouts=seq),
            "blocks.*.attn.proj": RowwiseParallel(output_layouts=seq),
            "blocks.*.mlp.fc": ColwiseParallel(input_layouts=seq),
            "blocks.*.mlp.proj": RowwiseParallel(output_layouts=seq),
            "head": head,
        }
    )
    uneven = frozenset({"tok_emb", "pos_emb", "head"})
    return TPPlan(styles, {"blocks.*.attn": model.cfg.n_heads}, uneven, loss_parallel)


def hf_plan(model: nn.Module) -> TPPlan | None:
    """The plan a Hugging Face model's config carries (``base_model_tp_plan``, paths under its base model), or
    disttrain's for GPT-2 (:mod:`disttrain.parallel.tp_gpt2`); None when there is none."""
    for path, hf in _named_hf(model):
        base = getattr(hf, "base_model_prefix", "")
        prefix = ".".join(p for p in (path, base if base and hasattr(hf, base) else "") if p)
        if is_gpt2(hf):  # no plan in its config: Conv1D layers and a packed q | k | v (disttrain.parallel.tp_gpt2)
            n_head = int(getattr(hf, "config").n_head)  # noqa: B009 (a Module attribute mypy cannot type)
            return TPPlan(gpt2_styles(prefix, n_head), {_join(prefix, "h.*.attn") + " (n_head)": n_head})
        raw = getattr(getattr(hf, "config", None), "base_model_tp_plan", None)
        if not raw:
            continue
        where = f"{type(hf).__name__}.config.base_model_tp_plan"
        styles = {_join(prefix, k): style_of(v, f"{where}[{k!r}]") for k, v in raw.items()}
        cfg = hf.config  # type: ignore[union-attr]
        heads: dict[str, int] = {}
        attn = next((k for k in raw if k.endswith("q_proj")), None)
        if attn is not None:
            for name in ("num_attention_heads", "num_key_value_heads"):
                if getattr(cfg, name, None):
                    heads[_join(prefix, attn.rsplit(".", 1)[0]) + f" ({name})"] = int(getattr(cfg, name))
        return TPPlan(styles, heads)
    return None


def user_plan(spec: str, model: nn.Module) -> TPPlan:
    """``--model.tp-plan pkg.mod:fn``: ``fn(model)`` returns a dict of module paths to styles."""
    raw = import_object(spec, "model.tp_plan")(model)
    if not isinstance(raw, Mapping) or not raw:
        raise ConfigError(
            f"model.tp_plan {spec!r} returned {type(raw).__name__}; it must return a non-empty dict of module "
            "paths to styles (ColwiseParallel(), RowwiseParallel(), or 'colwise' / 'rowwise')"
        )
    return TPPlan({str(k): style_of(v, f"model.tp_plan {spec!r}[{k!r}]") for k, v in raw.items()})


def style_of(value: Any, where: str) -> ParallelStyle:
    if isinstance(value, ParallelStyle):
        return value
    if isinstance(value, str) and value in STYLES:
        return STYLES[value]()
    raise ConfigError(
        f"{where}: style {value!r} is not one disttrain applies; use one of {sorted(STYLES)} or a ParallelStyle "
        "object, or give the model a plan of your own with --model.tp-plan pkg.mod:fn"
    )


def _named_hf(model: nn.Module) -> list[tuple[str, nn.Module]]:
    found = {id(m) for m in hf_models(model)}
    return [(n, m) for n, m in model.named_modules() if id(m) in found]


def _join(prefix: str, key: str) -> str:
    return f"{prefix}.{key}" if prefix else key
