"""The memory plan: bytes per rank for each strategy, the strategy ``auto`` picks, and why.

Two steps. :func:`~disttrain.plan.profile.profile_model` looks at the model once, on the meta device (no
memory, no compute, so a 70B-parameter config takes seconds). :func:`estimate` then turns that profile into a
per-rank plan for DDP, FSDP (reshard after forward, ZeRO-3-like), FSDP without reshard (ZeRO-2-like), HSDP
and FSDP with CPU offload, with the exact byte arithmetic of what torch allocates:

- parameters: fp32 master weights; FSDP2 shards dim 0 of every parameter into ``ceil(d0 / N)`` rows per
  rank (padded, so uneven shards round up);
- gradients: fp32, one per trainable parameter, sharded like the parameters (DDP: its gradient buckets,
  which the gradients are views of);
- optimizer: AdamW's two fp32 moments per element plus a 4-byte step per parameter tensor;
- gathered: what FSDP all-gathers transiently in the compute dtype (the root unit, the current block and
  the prefetched ones, plus one block's unsharded gradient), or every unit when it does not reshard after
  forward; for DDP under autocast, the low-precision copies of the weights;
- activations: saved tensors of one micro-batch in the compute dtype, plus the largest of them once more
  (its gradient, at the start of backward); with activation checkpointing, only the inputs of the
  checkpointed blocks plus one block recomputed.

The total is the sum, an upper bound: gradients and activations overlap only partly in backward.
:func:`decide` and :func:`auto_strategy` turn a plan into the strategy to run: the Trainer and ``disttrain
run`` ask for ``auto`` only through them, passing their loss (this module never imports the trainer).

May import: ``disttrain.config``, ``disttrain.errors``, ``disttrain.utils``, ``disttrain.build``,
``disttrain.dist``, ``disttrain.plan.profile``, ``disttrain.plan.render`` (the table in its messages).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from disttrain.config import DTYPES, JobConfig, parse_bytes
from disttrain.errors import ConfigError
from disttrain.plan.profile import LossFn, ModelProfile, ParamInfo, profile_model, sharded_bytes
from disttrain.plan.render import LABELS, render
from disttrain.utils.fmt import fmt_bytes

GiB = 2**30
ADAM_BYTES_PER_ELEMENT = 8  # exp_avg + exp_avg_sq in fp32
ADAM_STEP_BYTES = 4  # one fp32 step tensor per parameter


def local_device(cfg: JobConfig) -> str:
    """The device type a job configured so runs on here: CUDA unless ``parallel.device`` is cpu or there is none."""
    return "cuda" if cfg.parallel.device != "cpu" and torch.cuda.is_available() else "cpu"


def attention_for(device_type: str) -> str:
    """How the profile accounts fused attention on ``device_type`` (see :func:`profile_model`)."""
    return "flash" if device_type == "cuda" else "math"


def target_device(cfg: JobConfig) -> str:
    """The device type the plan is for: ``parallel.device`` when set, else CUDA if this machine has it. A laptop
    planning for GPUs says ``--parallel.device cuda``."""
    if cfg.parallel.device != "auto":
        return cfg.parallel.device
    return "cuda" if torch.cuda.is_available() else "cpu"


# -- the plan ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Layout:
    """Where the job runs: ranks per node, nodes, and one device's memory."""

    nproc: int
    nnodes: int = 1
    device_memory: int = 80 * GiB
    headroom: float = 0.1

    @property
    def world(self) -> int:
        return self.nproc * self.nnodes

    @property
    def budget(self) -> int:
        """Bytes the plan may use per device."""
        return int(self.device_memory * (1 - self.headroom))


@dataclass(frozen=True)
class StrategyPlan:
    """Bytes per rank (device) for one strategy; ``host`` is what CPU offload keeps in host memory."""

    name: str
    shard: int
    params: int
    grads: int
    optimizer: int
    gathered: int
    activations: int
    host: int = 0

    @property
    def total(self) -> int:
        return self.params + self.grads + self.optimizer + self.gathered + self.activations

    def row(self, key: str) -> int:
        return int(getattr(self, key))


@dataclass(frozen=True)
class Estimate:
    layout: Layout
    profile: ModelProfile
    ac: str
    plans: dict[str, StrategyPlan]
    activations_alt: int
    """Activation bytes with the other activation-checkpointing choice (full if none is configured)."""
    ac_alt: str
    choice: str = ""
    reason: str = ""
    fits: dict[str, bool] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {
            "layout": dataclasses.asdict(self.layout) | {"world": self.layout.world, "budget": self.layout.budget},
            "n_params": self.profile.n_params,
            "attention": self.profile.attention,
            "activation_checkpointing": self.ac,
            "activations_alt": {"activation_checkpointing": self.ac_alt, "bytes": self.activations_alt},
            "strategies": {
                k: dataclasses.asdict(p) | {"total": p.total, "fits": self.fits[k]} for k, p in self.plans.items()
            },
            "recommendation": {"strategy": self.choice, "reason": self.reason},
        }


def _unit_bytes(params: tuple[ParamInfo, ...], unit: int, n: int, nbytes: int) -> int:
    """Unsharded (all-gathered, padded) bytes of one FSDP unit."""
    return sum(p.shard_numel(n) * n * nbytes for p in params if p.unit == unit)


def _sharded_plan(name: str, prof: ModelProfile, n: int, cfg: JobConfig, act: int, reshard: bool) -> StrategyPlan:
    cb = DTYPES[cfg.precision.dtype].itemsize
    rb = DTYPES[cfg.precision.reduce_dtype].itemsize
    ps = prof.params
    blocks = [_unit_bytes(ps, i, n, 1) for i in range(prof.n_blocks)]
    biggest = max(blocks, default=0)
    root = _unit_bytes(ps, -1, n, 1)
    grad_unsharded = biggest * (cb + (rb if rb != cb else 0))  # computed in the compute dtype, reduced in rb
    if reshard:
        depth = 1 + max(cfg.parallel.forward_prefetch, cfg.parallel.backward_prefetch, 1)
        gathered = (root + depth * biggest) * cb + grad_unsharded
    else:
        gathered = (root + sum(blocks)) * cb + grad_unsharded
    if not prof.n_blocks:  # one unit: the whole model
        gathered = root * cb + root * (cb + (rb if rb != cb else 0))
    params = sharded_bytes(ps, n, 4)
    grads = sharded_bytes(ps, n, 4, trainable_only=True)
    optim = sharded_bytes(ps, n, ADAM_BYTES_PER_ELEMENT, True) + ADAM_STEP_BYTES * sum(p.trainable for p in ps)
    if name == "fsdp_offload":
        return StrategyPlan(name, n, 0, 0, 0, gathered, act, host=params + grads + optim)
    return StrategyPlan(name, n, params, grads, optim, gathered, act)


def estimate(prof: ModelProfile, cfg: JobConfig, layout: Layout) -> Estimate:
    """Per-rank plans for every strategy at ``layout``, and the recommendation."""
    cfg = resolved_precision(cfg)
    ac = cfg.parallel.activation_checkpointing
    act = prof.activations(ac)
    ac_alt = "full" if ac == "none" else "none"
    ps = prof.params
    cb = DTYPES[cfg.precision.dtype].itemsize
    w = layout.world
    low_precision_copies = sum(p.numel * cb for p in ps if len(p.shape) >= 2) if cb < 4 else 0
    plans = {
        "ddp": StrategyPlan(
            "ddp",
            1,
            sharded_bytes(ps, 1, 4),
            sharded_bytes(ps, 1, 4, trainable_only=True),
            sharded_bytes(ps, 1, ADAM_BYTES_PER_ELEMENT, True) + ADAM_STEP_BYTES * sum(p.trainable for p in ps),
            low_precision_copies,
            act,
        ),
        "fsdp": _sharded_plan("fsdp", prof, w, cfg, act, reshard=True),
        "fsdp_no_reshard": _sharded_plan("fsdp_no_reshard", prof, w, cfg, act, reshard=False),
        "hsdp": _sharded_plan("hsdp", prof, layout.nproc, cfg, act, reshard=True),
        "fsdp_offload": _sharded_plan("fsdp_offload", prof, w, cfg, act, reshard=True),
    }
    fits = {k: p.total <= layout.budget for k, p in plans.items()}
    est = Estimate(layout, prof, ac, plans, prof.activations(ac_alt), ac_alt, fits=fits)
    choice, reason = recommend(est)
    return dataclasses.replace(est, choice=choice, reason=reason)


def recommend(est: Estimate) -> tuple[str, str]:
    """The strategy ``auto`` runs, and why, in one sentence."""
    lay, p = est.layout, est.plans
    usable = f"{fmt_bytes(lay.budget)} usable per device ({fmt_bytes(lay.device_memory)} less {lay.headroom:.0%})"
    ddp = f"DDP needs {fmt_bytes(p['ddp'].total)} per rank"
    if lay.world == 1:
        verdict = "fits" if est.fits["ddp"] else "does NOT fit"
        return "single", f"one process: the model {verdict} ({fmt_bytes(p['ddp'].total)} of {usable})"
    if est.fits["ddp"]:
        return "ddp", f"{ddp} of {usable}: it fits, and DDP communicates least (one gradient all-reduce per step)"
    if lay.nnodes > 1 and lay.nproc > 1 and est.fits["hsdp"]:
        return "hsdp", (
            f"{ddp}, more than the {usable}; one node holds a replica sharded {lay.nproc} ways "
            f"({fmt_bytes(p['hsdp'].total)} per rank), so HSDP keeps all-gathers inside a node and only "
            "all-reduces gradients across nodes"
        )
    if est.fits["fsdp"]:
        return "fsdp", (
            f"{ddp}, more than the {usable}; FSDP over {lay.world} ranks needs {fmt_bytes(p['fsdp'].total)}"
        )
    return "fsdp", f"nothing fits: {ddp} and FSDP {fmt_bytes(p['fsdp'].total)}, but only {usable}"


def advice(est: Estimate, prof: ModelProfile, cfg: JobConfig) -> str:
    """What would make FSDP fit: activation checkpointing, offload, more ranks."""
    tips = []
    if est.ac == "none":
        alt = estimate(prof, with_parallel(cfg, activation_checkpointing="full"), est.layout).plans["fsdp"]
        tips.append(f"--parallel.activation_checkpointing full (FSDP then needs {fmt_bytes(alt.total)})")
    tips.append(f"--parallel.offload ({fmt_bytes(est.plans['fsdp_offload'].total)} on the device)")
    tips.append("more ranks, a smaller micro-batch, or --parallel.force to try anyway")
    return "; ".join(tips)


def with_parallel(cfg: JobConfig, **parallel: Any) -> JobConfig:
    return dataclasses.replace(cfg, parallel=dataclasses.replace(cfg.parallel, **parallel))


def column_for(strategy: str, cfg: JobConfig) -> str:
    """The plan column that describes what ``strategy`` with this config will run."""
    if strategy in ("single", "ddp"):
        return "ddp"
    if cfg.parallel.offload:
        return "fsdp_offload"
    if strategy == "hsdp":
        return "hsdp"
    return "fsdp_no_reshard" if cfg.parallel.reshard_after_forward == "never" else "fsdp"


def resolve_device_memory(spec: str, device_type: str, nproc: int) -> int:
    """'auto' -> the GPU's total memory, or host RAM / nproc on CPU; else the parsed size."""
    if spec != "auto":
        return parse_bytes(spec, "parallel.device_memory")
    if device_type == "cuda" and torch.cuda.is_available():
        return int(torch.cuda.get_device_properties(0).total_memory)
    import psutil

    return int(psutil.virtual_memory().total // max(nproc, 1))


def resolved_precision(cfg: JobConfig, device_type: str | None = None) -> JobConfig:
    """``precision.dtype = "auto"`` decided for ``device_type`` (default: cuda if present, else cpu)."""
    from disttrain.dist.env import resolve_precision

    if cfg.precision.dtype != "auto":
        return cfg
    device_type = device_type or local_device(cfg)
    return dataclasses.replace(cfg, precision=resolve_precision(cfg.precision, device_type))


def plan_job(cfg: JobConfig, layout: Layout, loss_fn: LossFn) -> Estimate:
    """Build the configured model on the meta device, profile it with the caller's ``loss_fn`` (the job's
    loss: :func:`disttrain.train.loss.cross_entropy` for the bundled models), and estimate every strategy."""
    device = target_device(cfg)
    cfg = resolved_precision(cfg, device)
    from disttrain.build import build_data, build_model, vocab_size

    train, _, text = build_data(cfg)
    vocab = vocab_size(train, text)
    model = build_model(cfg, vocab, on_meta=True)
    prof = profile_model(
        model,
        train[0],
        micro_batch=cfg.train.micro_batch,
        compute_dtype=cfg.precision.dtype,
        shard_modules=cfg.parallel.shard_modules,
        attention=attention_for(device),
        loss_fn=loss_fn,
    )
    return estimate(prof, cfg, layout)


def decide(cfg: JobConfig, est: Estimate) -> tuple[str, str]:
    """The strategy to run and why: the recommendation for 'auto', else the forced one if it fits.

    ConfigError when the strategy that would run does not fit and ``parallel.force`` is off.
    """
    lay, strategy = est.layout, cfg.parallel.strategy
    if strategy == "auto":
        choice, reason = est.choice, f"auto: {est.reason}"
        if cfg.parallel.offload and choice in ("single", "ddp"):
            choice = "hsdp" if lay.nnodes > 1 and lay.nproc > 1 else "fsdp"
            reason = "auto: parallel.offload is set, and offloading needs sharded parameters"
    else:
        choice, reason = strategy, "forced by parallel.strategy"
    plan = est.plans[column_for(choice, cfg)]
    if plan.total > lay.budget and not cfg.parallel.force:
        what = "no strategy fits" if strategy == "auto" else f"strategy {choice!r} does not fit"
        prof = est.profile
        raise ConfigError(
            f"{what}: {LABELS[column_for(choice, cfg)]} needs {fmt_bytes(plan.total)} per rank, more than the "
            f"{fmt_bytes(lay.budget)} usable ({fmt_bytes(lay.device_memory)} device memory less "
            f"{lay.headroom:.0%} headroom).\n{render(est)}\n"
            f"To fix: {advice(est, prof, cfg)}"
        )
    fit = f"{LABELS[column_for(choice, cfg)]} plan {fmt_bytes(plan.total)} of {fmt_bytes(lay.budget)} usable"
    return choice, reason if strategy == "auto" else f"{reason} ({fit})"


def auto_strategy(
    model: nn.Module,
    sample: tuple[Any, Any],
    cfg: JobConfig,
    world: int,
    local: int,
    loss_fn: LossFn,
) -> tuple[str, str]:
    """'auto' for a model already in hand (the Python API): plan it where it runs, with the Trainer's
    ``loss_fn``, then :func:`decide`.

    A model the planner cannot run on meta tensors gets the plain default (DDP), with the reason saying so.
    """
    from disttrain.dist.mesh import resolve_strategy

    device_type = local_device(cfg)
    local = max(1, min(local, world))
    layout = Layout(
        local,
        max(world // local, 1),
        resolve_device_memory(cfg.parallel.device_memory, device_type, local),
        cfg.parallel.memory_headroom,
    )
    cfg = resolved_precision(cfg, device_type)
    try:
        prof = profile_model(
            model, sample, micro_batch=cfg.train.micro_batch, compute_dtype=cfg.precision.dtype,
            loss_fn=loss_fn, shard_modules=cfg.parallel.shard_modules,
            attention=attention_for(device_type),
        )  # fmt: skip
    except ConfigError as e:
        return resolve_strategy("auto", world), f"auto without a memory plan ({e})"
    return decide(cfg, estimate(prof, cfg, layout))
