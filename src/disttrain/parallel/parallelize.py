"""``parallelize``, the public API: a layout (:class:`~disttrain.parallel.mesh.ParallelDims`) applied to a model,
the one place a model becomes distributed, in one order (torchtitan's, :data:`ORDER`): the pipeline split, tensor
parallelism on each block, expert parallelism, activation checkpointing, compile, then the data-parallel strategy
(FSDP2 / HSDP / DDP, the objects in :mod:`disttrain.parallel.strategies`). Each is one step that looks at the
degrees and the config and does its part or nothing; a new dimension is one step in that order. Where a kind of
model departs from it (its tensor-parallel plan), its family says so (:mod:`disttrain.parallel.families`).

:func:`parallelize` returns a :class:`Parallelized` that the training loop (yours or ours) uses
without knowing which strategy is underneath: ``sync(last)`` controls gradient sync during
accumulation, ``autocast()`` is the mixed-precision context, ``loss_parallel()`` wraps the loss and its
backward (cross-entropy over vocabulary shards under TP), ``clip_grad_norm_`` returns the *global*
norm (the full norm under FSDP and TP, not one shard's); ``applied`` says what each step did.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import torch
import torch.distributed as dist
from torch import nn

from disttrain.config import ParallelConfig, PrecisionConfig
from disttrain.errors import ConfigError
from disttrain.parallel.activation import apply_activation_checkpointing
from disttrain.parallel.clip import clip_grad_norm_
from disttrain.parallel.compile import apply_compile
from disttrain.parallel.env import resolve_precision
from disttrain.parallel.families import Family, family_of
from disttrain.parallel.fsdp import find_blocks
from disttrain.parallel.mesh import ParallelDims
from disttrain.parallel.pipeline_layout import PipelineLayout
from disttrain.parallel.stages import cut_model
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
    family: str = "module"
    """The model's family (:mod:`disttrain.parallel.families`)."""
    applied: tuple[str, ...] = ()
    """What the steps of :data:`ORDER` did, in order (the ones that did nothing left out)."""
    stages: list[nn.Module] = field(default_factory=list)
    """Under a pipeline (pp > 1): this rank's stage modules, parallelized, for
    :func:`~disttrain.parallel.pipeline.build_pipeline` (``module`` holds their parameters, with their names)."""

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
        """Clip to ``max_norm`` (0 = just measure) and return the global L2 norm of all gradients (under a
        pipeline: over every stage's)."""
        if self.dims.pp > 1:  # each rank holds some stages' gradients: the squares summed over the pipeline
            group = self.dims.pp_mesh(self.device.type).get_group()
            return clip_grad_norm_(self.module.parameters(), max_norm, group)
        if self.dims.tp > 1:  # parameters on several meshes (TP-split, replicated): a norm per mesh, combined
            return clip_grad_norm_(self.module.parameters(), max_norm)
        return self.impl.clip_grad_norm_(self.module, max_norm)


def current_device() -> torch.device:
    if torch.cuda.is_available():
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


@dataclass
class _Job:
    """What the steps read (resolved once by :func:`parallelize`) and what they leave for the next."""

    dims: ParallelDims
    parallel: ParallelConfig
    precision: PrecisionConfig
    device: torch.device
    family: Family
    tp_plan: str
    pipeline: PipelineLayout | None = None
    rank: int = 0
    blocks: list[nn.Module] = field(default_factory=list)
    vocab_parallel: bool = False
    stages: list[nn.Module] = field(default_factory=list)


Step = Callable[[nn.Module, _Job], "tuple[nn.Module, str | None]"]
"""A step of :data:`ORDER`: (the model so far, the job) -> (the model, what it did or None)."""


def _pipeline(model: nn.Module, job: _Job) -> tuple[nn.Module, str | None]:
    if job.dims.pp == 1:
        return model, None
    if job.pipeline is None:
        raise ConfigError(
            f"the layout {job.dims.describe()} has pp {job.dims.pp}: parallelize needs its pipeline layout "
            "(pipeline=disttrain.parallel.stages.plan_for_model(...), as the Trainer passes it)"
        )
    job.stages = cut_model(model, job.pipeline, job.dims.pp_rank(job.rank), job.family.name)
    return model, job.pipeline.describe()


def _tensor_parallel(model: nn.Module, job: _Job) -> tuple[nn.Module, str | None]:
    if job.dims.tp == 1:
        return model, None
    par = job.parallel
    mesh, stage = job.dims.tp_mesh(job.device.type), job.dims.pp > 1  # a stage: the plan's paths it holds
    # loss parallel (logits left sharded as a DTensor) hangs the pipeline's last stage in torch 2.13's schedules
    # on gloo (seen here with 1f1b, pp 2 x tp 2): under a pipeline the logits are gathered
    plan = apply_tp(model, mesh, job.tp_plan, par.loss_parallel and not stage, par.sequence_parallel, stage)
    job.vocab_parallel = plan.vocab_sharded
    return model, f"tp {job.dims.tp} ({job.family.describe_tp(job.tp_plan, plan.vocab_sharded, par.sequence_parallel)})"


def _expert_parallel(model: nn.Module, job: _Job) -> tuple[nn.Module, str | None]:
    return model, _not_yet(job.dims, "ep", "expert parallelism (a mixture-of-experts model's experts over ep ranks)")


def _activation_checkpointing(model: nn.Module, job: _Job) -> tuple[nn.Module, str | None]:
    job.blocks = find_blocks(model, job.parallel.shard_modules)  # after TP: the same modules, split in place
    spec = job.parallel.activation_checkpointing
    if spec == "none":
        return model, None
    n = apply_activation_checkpointing(job.blocks, spec)
    return model, f"activation checkpointing ({spec}: {n} of {len(job.blocks)} blocks)"


def _compile(model: nn.Module, job: _Job) -> tuple[nn.Module, str | None]:
    par, device_type = job.parallel, job.device.type
    mode = apply_compile(model, job.blocks, par.compile, device_type, checkpointing=par.activation_checkpointing)
    return model, None if mode == "off" else f"compile ({mode})"


def _data_parallel(model: nn.Module, job: _Job) -> tuple[nn.Module, str | None]:
    if job.parallel.offload and not job.dims.fsdp_enabled:
        raise ConfigError(
            "parallel.offload keeps FSDP's shards in host memory; it needs strategy fsdp or hsdp, "
            f"not {job.dims.strategy!r}"
        )
    strategy, how = for_dims(job.dims), WrapSettings(job.parallel, job.precision, job.device)
    if len(job.stages) > 1 and job.dims.fsdp_enabled:  # several stages per rank: each its own FSDP root
        job.stages = [strategy.wrap(stage, job.dims, how) for stage in job.stages]
        wrapped = model
    else:
        wrapped = strategy.wrap(model, job.dims, how)  # (views of several stages share its modules)
        job.stages = [wrapped] if len(job.stages) == 1 else job.stages
    d = job.dims
    over = {"fsdp": f"dp_shard {d.dp_shard}", "hsdp": f"dp_replicate {d.dp_replicate} x dp_shard {d.dp_shard}"}
    over["ddp"] = f"dp_replicate {d.dp_replicate}"
    return wrapped, f"{d.strategy} over {over[d.strategy]}" if d.strategy in over else None


ORDER: tuple[tuple[str, Step], ...] = (
    ("pipeline", _pipeline),
    ("tensor parallel", _tensor_parallel),
    ("expert parallel", _expert_parallel),
    ("activation checkpointing", _activation_checkpointing),
    ("compile", _compile),
    ("data parallel", _data_parallel),
)
"""The steps, in the order they apply (torchtitan's): each sees what the ones before it made."""


def _not_yet(dims: ParallelDims, name: str, what: str) -> str | None:
    """None where the degree ``name`` is 1; else a ConfigError: the layout admits it, no step applies it yet."""
    degree = getattr(dims, name)
    if degree == 1:
        return None
    raise ConfigError(
        f"the layout {dims.describe()} has {name} {degree}: ParallelDims admits it, but parallelize does not apply "
        f"{what} yet; set {name} to 1"
    )


def _check_process_group(dims: ParallelDims) -> None:
    if dims.world_size > 1 and not dist.is_initialized():
        raise RuntimeError(
            f"strategy {dims.strategy!r} over {dims.world_size} ranks needs a process group; "
            "start the script with `disttrain launch -n N script.py` (or torchrun) and call init_distributed()"
        )


def parallelize(
    model: nn.Module,
    parallel: ParallelConfig | None = None,
    precision: PrecisionConfig | None = None,
    *,
    dims: ParallelDims | None = None,
    device: torch.device | None = None,
    tp_plan: str = "auto",
    pipeline: PipelineLayout | None = None,
) -> Parallelized:
    """Apply the layout to ``model``, step by step in :data:`ORDER`; a meta-device model is materialised here.

    With ``parallel.tp`` > 1 the model is first split over the TP mesh dimension by ``tp_plan``
    (``model.tp_plan``: :func:`disttrain.parallel.families.plan_for`, the model family's plan for ``auto``), then
    activation checkpointing, compile and the data-parallel strategy are applied as without it.

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
    _check_process_group(dims)
    _not_yet(dims, "cp", "context parallelism (attention over sequence shards, a context of the training step)")
    rank = dist.get_rank() if dist.is_initialized() else 0
    job = _Job(dims, parallel, precision, device, family_of(model), tp_plan, pipeline, rank)
    original, applied = model, []
    for _, step in ORDER:
        model, did = step(model, job)
        applied += [did] if did else []
    return Parallelized(
        model,
        original,
        dims,
        device,
        precision.dtype,
        job.vocab_parallel,
        job.family.name,
        tuple(applied),
        job.stages,
    )
