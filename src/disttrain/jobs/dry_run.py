"""``disttrain run --dry-run``: the job's layout at any scale, on this machine, in seconds, before the GPU hours.

The world (``parallel.nproc`` x ``launch.nnodes`` ranks) is made of torch's fake process-group backend: one
process stands for rank ``--dry-run-rank`` (every collective returns at once, moving nothing). The plan decides
the strategy as ``disttrain run`` would; the model is built on the meta device and goes through the same
:func:`~disttrain.parallel.parallelize.parallelize` as a real job (TP, activation checkpointing, FSDP/HSDP), so what
is printed are the shards that rank would really hold: parameter, gradient and optimizer bytes, what each mesh
dimension splits, the collectives of one step (the FSDP units and TP layers as built, the calls and bytes as
planned), and whether the plan's per-rank figures agree with the shapes produced.
"""

from __future__ import annotations

import dataclasses
import warnings
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from disttrain.build import build_data, build_model, vocab_size
from disttrain.config import JobConfig
from disttrain.errors import ConfigError
from disttrain.parallel import strategies
from disttrain.parallel.mesh import ParallelDims, check_tp
from disttrain.parallel.parallelize import parallelize
from disttrain.plan.choose import decide
from disttrain.plan.estimate import Layout, StrategyPlan, plan_job, resolve_device_memory, resolved_precision
from disttrain.plan.estimate import target_device as plan_device
from disttrain.train.loss import cross_entropy
from disttrain.utils.fmt import fmt_bytes

AGREE = 0.01
"""The plan's per-rank parameter bytes agree with the shapes produced within this fraction."""


@dataclass
class Shards:
    """What one rank holds: elements per module group (global, local), and per mesh dimension the elements of
    the parameters it splits."""

    dtype_bytes: int = 4
    groups: dict[str, list[int]] = field(default_factory=lambda: defaultdict(lambda: [0, 0]))
    split_by: dict[str, int] = field(default_factory=lambda: defaultdict(int))
    total: int = 0

    @property
    def local(self) -> int:
        return sum(local for _, local in self.groups.values())

    @property
    def param_bytes(self) -> int:
        return self.local * self.dtype_bytes


def rank_shards(model: nn.Module) -> Shards:
    """The local shard of every parameter of ``model`` (DTensors: their local tensor; others: whole)."""
    from torch.distributed.tensor import DTensor

    out = Shards()
    for name, p in model.named_parameters():
        group = name.split(".")[0]
        local = p.to_local() if isinstance(p, DTensor) else p
        out.groups[group][0] += p.numel()
        out.groups[group][1] += local.numel()
        out.total += p.numel()
        out.dtype_bytes = local.element_size()
        if isinstance(p, DTensor):
            names = p.device_mesh.mesh_dim_names or ()
            for dim, placement in zip(names, p.placements, strict=True):
                if not placement.is_replicate():  # Shard, or FSDP's strided shard of a TP shard
                    out.split_by[dim] += p.numel()
    return out


def fsdp_units(model: nn.Module) -> int:
    from torch.distributed.fsdp import FSDPModule

    return sum(isinstance(m, FSDPModule) for m in model.modules())


def tp_layers(model: nn.Module) -> int:
    """Modules whose weight tensor parallelism split (a DTensor sharded over ``tp``)."""
    from torch.distributed.tensor import DTensor

    count = 0
    for m in model.modules():
        w = getattr(m, "weight", None)
        if isinstance(w, DTensor) and "tp" in (w.device_mesh.mesh_dim_names or ()):
            tp_at = (w.device_mesh.mesh_dim_names or ()).index("tp")
            count += not w.placements[tp_at].is_replicate()
    return count


@dataclass(frozen=True)
class DryRun:
    """The job as planned and as built for one rank."""

    dims: ParallelDims
    rank: int
    strategy: str
    reason: str
    plan: StrategyPlan
    shards: Shards
    units: int
    tp_split: int
    planned: dict[str, Any]
    reshard: bool
    """FSDP frees the gathered parameters after forward (and gathers them again in backward)."""
    family: str = "module"
    applied: tuple[str, ...] = ()
    """What parallelize's steps did, in order (:data:`disttrain.parallel.parallelize.ORDER`)."""


def dry_run(cfg: JobConfig, rank: int) -> DryRun:
    """Plan the job, build its layout on the fake backend as rank ``rank``, and say what that rank holds."""
    device = plan_device(cfg)
    nproc = cfg.parallel.nproc or (2 if device == "cpu" else 0)
    if nproc < 1:
        raise ConfigError("a dry run for CUDA devices needs their number per node: --parallel.nproc N")
    nnodes = int(cfg.launch.nnodes.split(":")[-1])
    world = nproc * nnodes
    if not 0 <= rank < world:
        raise ConfigError(f"--dry-run-rank must be a rank of the {world} ({nproc} x {nnodes}), got {rank}")
    if cfg.parallel.device_memory == "auto" and device == "cuda" and not torch.cuda.is_available():
        raise ConfigError(
            "a dry run for CUDA devices here: say how much memory each has, e.g. --parallel.device-memory 80GiB"
        )
    cfg = resolved_precision(cfg, device)
    tp = cfg.parallel.tp
    check_tp(tp, nproc)
    layout = Layout(nproc, nnodes, resolve_device_memory(cfg.parallel.device_memory, device, nproc), tp=tp)
    layout = dataclasses.replace(layout, headroom=cfg.parallel.memory_headroom)
    est = plan_job(cfg, layout, cross_entropy)
    decision = decide(cfg, est)
    parallel = dataclasses.replace(cfg.parallel, **decision.parallel, compile="off")  # compile changes no shape
    cfg = dataclasses.replace(cfg, parallel=parallel)
    dims = strategies.dims_from_config(parallel, world, nproc, decision.strategy)
    column = strategies.column_for(dims.strategy, parallel.reshard_after_forward, parallel.offload)
    built = _build_as(cfg, dims, rank)
    timing = est.times.get(column.key)
    planned = {"calls": timing.calls, "intra": timing.sent_intra, "inter": timing.sent_inter} if timing else {}
    plan = est.plans[column.key]
    shards, units, tp_split, family, applied = built
    return DryRun(
        dims,
        rank,
        dims.strategy,
        decision.reason,
        plan,
        shards,
        units,
        tp_split,
        planned,
        column.reshard,
        family,
        applied,
    )


def _build_as(cfg: JobConfig, dims: ParallelDims, rank: int) -> tuple[Shards, int, int, str, tuple[str, ...]]:
    from torch.testing._internal.distributed.fake_pg import FakeStore

    dist.init_process_group("fake", store=FakeStore(), rank=rank, world_size=dims.world_size)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # the fake backend's and DTensor's notes on meta tensors
            dims.world_mesh("cpu")  # the meshes, once: parallelize gets these whatever device it names
            train, _, text = build_data(cfg)
            model = build_model(cfg, vocab_size(train, text), on_meta=True)
            meta = torch.device("meta")
            done = parallelize(model, cfg.parallel, cfg.precision, dims=dims, device=meta, tp_plan=cfg.model.tp_plan)
        wrapped = done.module
        return rank_shards(wrapped), fsdp_units(wrapped), tp_layers(wrapped), done.family, done.applied
    finally:
        dist.destroy_process_group()


def render(run: DryRun) -> str:
    """The dry run as text: the layout, the rank's shards and what each dimension splits, one step's
    collectives, the plan's figures against the shapes."""
    d, s, plan = run.dims, run.shards, run.plan
    lines = [f"dry run: {d.describe()} over {d.world_size} ranks, as rank {run.rank} (fake process group)"]
    lines.append(f"  strategy {run.strategy}: {run.reason}")
    lines.append("  mesh: " + " x ".join(f"{n} {v}" for n, v in d.mesh_dims().items()))
    lines.append(f"  parallelize ({run.family} model): " + (" -> ".join(run.applied) or "nothing to apply"))
    lines.append(f"  {'module':<12} {'parameters':>16} {'this rank':>16} {'bytes':>10}")
    for group, (total, local) in s.groups.items():
        lines.append(f"  {group:<12} {total:>16,} {local:>16,} {fmt_bytes(local * s.dtype_bytes):>10}")
    for dim, numel in s.split_by.items():
        lines.append(f"  {dim} ({d.degrees().get(dim, '')}) splits {numel / max(s.total, 1):.1%} of the parameters")
    grads, optim = s.param_bytes, 2 * s.local * 4  # gradients like the shards; AdamW: two fp32 moments
    lines.append("  per rank        built       plan")
    for name, built, planned in (
        ("params", s.param_bytes, plan.params),
        ("grads", grads, plan.grads),
        ("optimizer", optim, plan.optimizer),
    ):
        lines.append(f"  {name:<10} {fmt_bytes(built):>10} {fmt_bytes(planned):>10}")
    lines += _collectives(run)
    gap = abs(s.param_bytes - plan.params) / max(plan.params, 1)
    verdict = "agree" if gap <= AGREE else "DISAGREE"
    lines.append(f"  the plan's parameter bytes per rank and the shards built {verdict} ({gap:.2%} apart)")
    return "\n".join(lines)


def _collectives(run: DryRun) -> list[str]:
    d, out = run.dims, []
    if run.units:
        again = " and again in backward" if run.reshard else ""
        hsdp = f", an all-reduce across the {d.dp_replicate} replicas" if d.dp_replicate > 1 else ""
        each = f"each an all-gather in forward{again}, a reduce-scatter of its gradients{hsdp}"
        out.append(f"  one step: {run.units} FSDP units, {each}")
    elif d.dp_replicate > 1:
        out.append("  one step: the gradients all-reduced in DDP's buckets")
    if run.tp_split:
        meet = "their activations meet in collectives, forward and backward"
        out.append(f"  tensor parallel: {run.tp_split} layers split over {d.tp} ranks ({meet})")
    if run.planned:
        p = run.planned
        sent = f"{fmt_bytes(int(p['intra']))} within nodes, {fmt_bytes(int(p['inter']))} across"
        out.append(f"  as planned: {p['calls']} collective calls, {sent}")
    return out


def run_dry(cfg: JobConfig, rank: int) -> int:
    """``disttrain run --dry-run``: print the dry run; 0."""
    print(render(dry_run(cfg, rank)))
    return 0
