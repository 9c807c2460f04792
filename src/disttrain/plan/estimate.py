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
- optimizer step: what AdamW allocates while it steps. Plain parameters (DDP, one process) step through its
  fused kernel, which allocates nothing; DTensor parameters (FSDP, HSDP, tensor parallelism) through its
  foreach kernels, which hold one fp32 temporary per element of the rank's parameters (the square roots of the
  second moments) until the step ends (where parameters sit on several meshes AdamW steps them one by one,
  holding two of the largest: less, so this is an upper bound). The step runs after backward, when the
  activations and the gathered parameters are gone: it counts against them, not beside them;
- gathered: what FSDP all-gathers transiently in the compute dtype (the root unit, the current block and
  the prefetched ones, plus one block's unsharded gradient), or every unit when it does not reshard after
  forward; for DDP under autocast, the low-precision copies of the weights;
- activations: saved tensors of one micro-batch in the compute dtype, plus the largest of them twice more
  (the gradients into and out of the op that saved it, at the start of backward); with activation
  checkpointing, only the inputs of the checkpointed blocks plus one block recomputed.

The total is the sum (with the optimizer step's temporaries or the gathered parameters and activations,
whichever is larger), an upper bound: gradients and activations overlap only partly in backward.
:mod:`disttrain.plan.choose` turns a plan into the strategy to run (this module never imports the trainer).

May import: ``disttrain.config``, ``disttrain.errors``, ``disttrain.utils``, ``disttrain.build``,
``disttrain.parallel`` (the strategies and the plan's columns), ``disttrain.plan.profile``.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from disttrain.config import DTYPES, JobConfig, parse_bytes
from disttrain.errors import ConfigError
from disttrain.parallel import strategies
from disttrain.parallel.strategies import COLUMNS, LABELS, SHARDED_COLUMNS, label
from disttrain.plan.comm import outer_split, unit_numels
from disttrain.plan.profile import LossFn, ModelProfile, profile_model, sharded_bytes
from disttrain.plan.timing import (
    NEAR_BEST,
    Machine,
    StepTime,
    best_grouping,
    grouping_candidates,
    resolve_machine,
    step_time,
)
from disttrain.plan.tp import TPOption, local_profile, mark_split, split_dims, tp_degrees, tp_pick
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
    """Where the job runs: ranks per node, nodes, one device's memory, and the tensor-parallel degree (TP groups
    of ``tp`` adjacent ranks within a node; the data-parallel strategies span the ``world / tp`` groups)."""

    nproc: int
    nnodes: int = 1
    device_memory: int = 80 * GiB
    headroom: float = 0.1
    tp: int = 1

    @property
    def world(self) -> int:
        return self.nproc * self.nnodes

    @property
    def dp_nproc(self) -> int:
        """Data-parallel ranks (TP groups) per node."""
        return max(self.nproc // self.tp, 1)

    @property
    def dp_world(self) -> int:
        """Data-parallel ranks (TP groups) in all."""
        return self.dp_nproc * self.nnodes

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
    step_temp: int = 0
    """What the optimizer step allocates while it runs, after backward (see the module's docstring)."""

    @property
    def total(self) -> int:
        return self.params + self.grads + self.optimizer + max(self.gathered + self.activations, self.step_temp)

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
    times: dict[str, StepTime] = field(default_factory=dict)
    """Predicted optimizer step per strategy (with the grouping the plan column uses)."""
    groupings: dict[str, dict[int, StepTime]] = field(default_factory=dict)
    """Every grouping tried per sharded column: blocks per unit -> predicted step."""
    grouping_bytes: dict[str, dict[int, int]] = field(default_factory=dict)
    """Every grouping tried per sharded column: blocks per unit -> total bytes per rank."""
    machine: Machine | None = None
    tp_options: tuple[TPOption, ...] = ()
    """Candidate layouts with tensor parallelism (tp 2, 4, ... within a node), weighed when the plan is at tp 1."""
    local: ModelProfile | None = None
    """What one rank of a TP group holds and computes (:func:`~disttrain.plan.tp.local_profile`); with tp 1
    the profile itself."""

    @property
    def rank_profile(self) -> ModelProfile:
        """The profile one rank runs: :attr:`local` where set, else the whole model's."""
        return self.local or self.profile

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
            "step_time": {k: t.to_json() for k, t in self.times.items()},
            "machine": dataclasses.asdict(self.machine) if self.machine else None,
            "tp_options": [dataclasses.asdict(o) for o in self.tp_options],
        }


def _knob(value: int | str, unresolved: int = 1) -> int:
    return unresolved if value == "auto" else int(value)


def _sharded_plan(
    name: str, prof: ModelProfile, n: int, cfg: JobConfig, act: int, reshard: bool, blocks_per_unit: int = 1
) -> StrategyPlan:
    cb = DTYPES[cfg.precision.dtype].itemsize
    rb = DTYPES[cfg.precision.reduce_dtype].itemsize
    ps = prof.params
    root, blocks = unit_numels(prof, n, blocks_per_unit, cfg.parallel.root_units)
    # gradients held unsharded at once: a unit's until its reduce-scatter; in the root unit, the head's from the
    # start of backward (when the activations peak) to its end
    _, after, split = outer_split(prof, n, blocks_per_unit, cfg.parallel.root_units)
    in_root = 0 if split else after
    grad_unsharded = max(*blocks, in_root, 0) * (cb + (rb if rb != cb else 0))  # compute dtype, reduced in rb
    if reshard:
        depth = 1 + max(_knob(cfg.parallel.forward_prefetch), _knob(cfg.parallel.backward_prefetch), 1)
        window = max((sum(blocks[i : i + depth]) for i in range(len(blocks))), default=0)  # a unit + prefetched
        gathered = (root + window) * cb + grad_unsharded
    else:
        gathered = (root + sum(blocks)) * cb + grad_unsharded
    if not prof.n_blocks:  # one unit: the whole model
        gathered = root * cb + root * (cb + (rb if rb != cb else 0))
    params = sharded_bytes(ps, n, 4)
    grads = sharded_bytes(ps, n, 4, trainable_only=True)
    optim = sharded_bytes(ps, n, ADAM_BYTES_PER_ELEMENT, True) + ADAM_STEP_BYTES * sum(p.trainable for p in ps)
    if COLUMNS[name].offload:  # the step runs on the host (its temporaries there too, not counted in host)
        return StrategyPlan(name, n, 0, 0, 0, gathered, act, host=params + grads + optim)
    return StrategyPlan(name, n, params, grads, optim, gathered, act, step_temp=params)  # foreach over DTensors


def estimate(prof: ModelProfile, cfg: JobConfig, layout: Layout, machine: Machine | None = None) -> Estimate:
    """Per-rank plans and predicted step times for every strategy at ``layout``, and the recommendation.
    Sharded columns use the grouping of blocks into units that :func:`~disttrain.plan.timing.best_grouping`
    picks (or ``parallel.blocks_per_unit`` when set). With ``layout.tp`` > 1 every column is that strategy over
    the TP groups, on what one rank of a group holds (:func:`~disttrain.plan.tp.local_profile`)."""
    cfg = resolved_precision(cfg)
    machine = machine or resolve_machine(target_device(cfg), cfg.precision.dtype, nproc=layout.nproc)
    full, tp, nproc = prof, layout.tp, layout.dp_nproc
    par = cfg.parallel
    prof = local_profile(prof, tp, sequence_parallel=par.sequence_parallel, loss_parallel=par.loss_parallel)
    ac = cfg.parallel.activation_checkpointing
    act = prof.activations(ac)
    ac_alt = "full" if ac == "none" else "none"
    ps = prof.params
    cb = DTYPES[cfg.precision.dtype].itemsize
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
            step_temp=sharded_bytes(ps, 1, 4) if tp > 1 else 0,  # TP's DTensors step by foreach; plain ones fused
        )
    }
    times = {"ddp": step_time("ddp", prof, cfg, machine, nproc, layout.nnodes, 1, tp=tp)}
    groupings: dict[str, dict[int, StepTime]] = {}
    grouping_bytes: dict[str, dict[int, int]] = {}
    fixed = cfg.parallel.blocks_per_unit
    for col in SHARDED_COLUMNS:
        n = COLUMNS[col].shard_degree(nproc, layout.nnodes)
        ks = [int(fixed)] if fixed != "auto" else grouping_candidates(prof.n_blocks)
        by_k = {k: _sharded_plan(col, prof, n, cfg, act, COLUMNS[col].reshard, k) for k in ks}
        groupings[col] = {k: step_time(col, prof, cfg, machine, nproc, layout.nnodes, k, tp=tp) for k in ks}
        k = (
            best_grouping(groupings[col], {k: p.total <= layout.budget for k, p in by_k.items()})
            if len(ks) > 1
            else ks[0]
        )
        plans[col], times[col] = by_k[k], groupings[col][k]
        grouping_bytes[col] = {k: p.total for k, p in by_k.items()}
    fits = {k: p.total <= layout.budget for k, p in plans.items()}
    est = Estimate(
        layout,
        full,
        ac,
        plans,
        prof.activations(ac_alt),
        ac_alt,
        fits=fits,
        times=times,
        groupings=groupings,
        grouping_bytes=grouping_bytes,
        machine=machine,
        local=prof,
    )
    choice, reason = recommend(est)
    return dataclasses.replace(est, choice=choice, reason=reason)


AUTO_COLUMNS = ("ddp", "fsdp", "fsdp_no_reshard", "hsdp")


def recommend(est: Estimate) -> tuple[str, str]:
    """The plan column ``auto`` runs, and why, in one sentence: among the strategies that fit, the one predicted
    fastest, or the simplest of those within 1% of it (HSDP only across nodes: on one node it is FSDP)."""
    lay, p, t = est.layout, est.plans, est.times
    nproc, names = lay.dp_nproc, {c: label(c, lay.tp) for c in LABELS}
    usable = f"{fmt_bytes(lay.budget)} usable per device ({fmt_bytes(lay.device_memory)} less {lay.headroom:.0%})"
    ddp = f"{names['ddp']} needs {fmt_bytes(p['ddp'].total)} per rank"
    if lay.dp_world == 1:
        verdict = "fits" if est.fits["ddp"] else "does NOT fit"
        alone = f"tensor parallelism alone (tp {lay.tp})" if lay.tp > 1 else "one process"
        return "single", f"{alone}: the model {verdict} ({fmt_bytes(p['ddp'].total)} of {usable})"
    cols = [c for c in AUTO_COLUMNS if est.fits[c] and runs_at(c, lay) and COLUMNS[c].distinct_at(nproc, lay.nnodes)]
    if not cols:
        offload = p["fsdp_offload"]
        also = (
            f"; FSDP with --parallel.offload fits ({fmt_bytes(offload.total)} on the device)"
            if est.fits["fsdp_offload"]
            else ""
        )
        return "fsdp", f"nothing fits: {ddp} and FSDP {fmt_bytes(p['fsdp'].total)}, but only {usable}{also}"
    ranked = sorted(cols, key=lambda c: t[c].predicted_s)
    # within NEAR_BEST of the fastest is a tie (as for groupings): it goes to the simplest, in AUTO_COLUMNS' order
    best = next(c for c in cols if t[c].predicted_s <= t[ranked[0]].predicted_s * (1 + NEAR_BEST))
    others = [c for c in ranked if c != best]
    tie = best != ranked[0]
    why = (
        f"{names[best]} is predicted {f'within {NEAR_BEST:.0%} of the fastest' if tie else 'fastest'} {_when(t[best])}"
    )
    if others:
        why += f", against {names[others[0]]} {_when(t[others[0]])}"
        why += "; that close is a tie, and a tie goes to the simpler strategy" if tie else ""
    memory = f"{ddp} of {usable}: it fits" if est.fits["ddp"] else f"{ddp}, more than the {usable}"
    if COLUMNS[best].sharded and COLUMNS[best].shard_degree(nproc, lay.nnodes) < lay.dp_world:
        why += "; HSDP keeps all-gathers inside a node and only all-reduces gradient shards across nodes"
    return best, f"{memory}; of what fits, {why}"


def runs_at(column: str, layout: Layout) -> bool:
    """Whether the column's strategy runs over ``layout``'s TP groups (DDP does not compose with TP)."""
    try:
        COLUMNS[column].strategy.check_tp(layout.dp_world, layout.tp)
    except ConfigError:
        return False
    return True


def _when(t: StepTime) -> str:
    sent = t.sent_intra + t.sent_inter
    return f"({t.predicted_s:.3g} s/step, {fmt_bytes(int(sent))} sent per rank)"


def advice(est: Estimate, prof: ModelProfile, cfg: JobConfig) -> str:
    """What would make FSDP fit: activation checkpointing, offload, more ranks."""
    tips = []
    if est.ac == "none":
        alt = estimate(prof, with_parallel(cfg, activation_checkpointing="full"), est.layout).plans["fsdp"]
        tips.append(f"--parallel.activation_checkpointing full (FSDP then needs {fmt_bytes(alt.total)})")
    tips.append(f"--parallel.offload ({fmt_bytes(est.plans['fsdp_offload'].total)} on the device)")
    fitting = [o for o in est.tp_options if o.fits and o.tp != est.layout.tp]
    if fitting:
        o = min(fitting, key=lambda o: o.predicted_s)
        tips.append(f"--parallel.tp {o.tp} ({o.label} needs {fmt_bytes(o.total)})")
    tips.append("more ranks, a smaller micro-batch, or --parallel.force to try anyway")
    return "; ".join(tips)


def with_parallel(cfg: JobConfig, **parallel: Any) -> JobConfig:
    return dataclasses.replace(cfg, parallel=dataclasses.replace(cfg.parallel, **parallel))


def column_for(strategy: str, cfg: JobConfig) -> str:
    """The plan column that describes what ``strategy`` with this config will run."""
    return strategies.column_for(strategy, cfg.parallel.reshard_after_forward, cfg.parallel.offload).key


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
    from disttrain.parallel.env import resolve_precision

    if cfg.precision.dtype != "auto":
        return cfg
    device_type = device_type or local_device(cfg)
    return dataclasses.replace(cfg, precision=resolve_precision(cfg.precision, device_type))


def plan_job(cfg: JobConfig, layout: Layout, loss_fn: LossFn, machine: Machine | None = None) -> Estimate:
    """Build the configured model on the meta device, profile it with the caller's ``loss_fn`` (the job's
    loss: :func:`disttrain.train.loss.cross_entropy` for the bundled models), and estimate every strategy."""
    device = target_device(cfg)
    cfg = resolved_precision(cfg, device)
    from disttrain.build import build_data, build_model, data_tokenizer, vocab_size

    train, _, text = build_data(cfg)
    vocab = vocab_size(train, text)
    tokenizer = data_tokenizer(cfg) if cfg.model.module else None  # a Hugging Face model's special ids must fit it
    model = build_model(cfg, vocab, on_meta=True, tokenizer=tokenizer)
    prof = profile_model(
        model,
        train[0],
        micro_batch=cfg.train.micro_batch,
        compute_dtype=cfg.precision.dtype,
        shard_modules=cfg.parallel.shard_modules,
        attention=attention_for(device),
        loss_fn=loss_fn,
    )
    degrees = tp_degrees(layout.nproc) if layout.tp == 1 else [layout.tp]
    styles, degrees = _tp_plan(model, cfg, degrees, required=layout.tp > 1)
    if styles:
        prof = mark_split(prof, split_dims(model, styles))
    est = estimate(prof, cfg, layout, machine)
    if layout.tp > 1 or not degrees:
        return est
    options = (as_option(est), *(tp_option(prof, cfg, layout, est.machine, t) for t in degrees))
    return with_tp_options(est, cfg, options)


def _tp_plan(
    model: nn.Module, cfg: JobConfig, degrees: list[int], required: bool
) -> tuple[dict[str, Any] | None, list[int]]:
    """The model's TP styles and the degrees its plan allows (heads and widths divide); where the model has no
    TP plan, none (a ConfigError only when ``required``: the job asked for tp > 1)."""
    from disttrain.parallel.families import plan_for
    from disttrain.parallel.tp import check_plan

    par = cfg.parallel
    try:
        plan = plan_for(model, cfg.model.tp_plan, par.loss_parallel, par.sequence_parallel)
    except ConfigError:
        if required:
            raise
        return None, []
    ok = []
    for t in degrees:
        try:
            check_plan(model, plan, t)
        except ConfigError:
            if required:
                raise
            continue
        ok.append(t)
    return dict(plan.styles), ok


def tp_option(prof: ModelProfile, cfg: JobConfig, layout: Layout, machine: Machine | None, tp: int) -> TPOption:
    """The plan at ``tp``: the column ``auto`` would pick over the TP groups (DDP's column, no data-parallel
    traffic, where one group fills the job), its bytes and step."""
    return as_option(estimate(prof, cfg, dataclasses.replace(layout, tp=tp), machine))


def as_option(e: Estimate) -> TPOption:
    """A plan as one candidate layout: the column it recommends, its bytes and step."""
    col, tp = (e.choice if e.choice in e.plans else "ddp"), e.layout.tp
    name = label(col, tp) if e.layout.dp_world > 1 or tp == 1 else f"tp {tp} alone"
    t = e.times[col]
    return TPOption(tp, col, name, e.plans[col].total, e.fits[col], t.predicted_s, t.sent_inter)


def with_tp_options(est: Estimate, cfg: JobConfig, options: tuple[TPOption, ...]) -> Estimate:
    """``est`` with its TP candidates. Where one helps (:func:`~disttrain.plan.tp.tp_pick`) and the strategy is
    ``auto``, the plan at that TP degree, its reason saying why; with a forced strategy, ``est`` whose reason
    names the TP layout."""
    fits = any(est.fits[c] for c in AUTO_COLUMNS)
    col = est.choice if est.choice in est.times else "ddp"
    t, m = est.times[col], est.machine
    inter_s = t.sent_inter / m.link("inter").bandwidth_Bps if m is not None and t.sent_inter else 0.0
    pick, why = tp_pick(options, fits=fits, inter_s=inter_s, compute_s=t.compute_s, step_s=t.predicted_s)
    if pick is None or cfg.parallel.strategy != "auto":
        hint = f"{why}: run with --parallel.tp {pick.tp}" if pick is not None else why
        return dataclasses.replace(est, tp_options=options, reason=f"{est.reason}; {hint}" if hint else est.reason)
    tp_est = estimate(est.profile, cfg, dataclasses.replace(est.layout, tp=pick.tp), m)
    return dataclasses.replace(tp_est, tp_options=options, reason=f"tp {pick.tp}: {why}; {tp_est.reason}")
