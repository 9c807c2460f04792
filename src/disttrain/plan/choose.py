"""From a plan to what runs: :func:`decide` (the strategy, why, and the FSDP knobs the plan resolves) and
:func:`auto_strategy` (``auto`` for a model already in hand, as the Trainer asks). The Trainer and ``disttrain
run`` ask for ``auto`` only through these, passing their loss (this module never imports the trainer).

May import: ``disttrain.config``, ``disttrain.errors``, ``disttrain.utils``, ``disttrain.parallel``,
``disttrain.plan`` (estimate, profile, render).
"""

from __future__ import annotations

from typing import Any, NamedTuple

from torch import nn

from disttrain.config import JobConfig, ResolvedJob, resolve_batch
from disttrain.errors import ConfigError
from disttrain.parallel import strategies
from disttrain.parallel.strategies import COLUMNS, LABELS
from disttrain.plan.estimate import (
    Estimate,
    Layout,
    advice,
    attention_for,
    column_for,
    estimate,
    local_device,
    resolve_device_memory,
    resolved_precision,
    with_parallel,
)
from disttrain.plan.profile import LossFn, profile_model
from disttrain.plan.render import render
from disttrain.utils.fmt import fmt_bytes


class Decision(NamedTuple):
    """What runs: the strategy, why, and the parallel settings the plan resolved for it (``blocks_per_unit`` and
    the prefetch depths where they were ``auto``; ``reshard_after_forward = "never"`` when ``auto`` picked FSDP
    without resharding)."""

    strategy: str
    reason: str
    parallel: dict[str, Any]


def decide(cfg: JobConfig, est: Estimate) -> Decision:
    """The strategy to run and why: the recommendation for 'auto', else the forced one if it fits.

    ConfigError when the strategy that would run does not fit and ``parallel.force`` is off.
    """
    lay, strategy = est.layout, cfg.parallel.strategy
    overrides: dict[str, Any] = {}
    if strategy == "auto":
        choice, reason = est.choice, f"auto: {est.reason}"
        planned = COLUMNS.get(choice)  # None for one process ("single")
        if planned is not None:
            choice = planned.strategy.name
            if not planned.reshard:
                overrides = {"reshard_after_forward": "never"}
        if lay.tp != cfg.parallel.tp:  # the plan chose tensor parallelism (plan_job's TP candidates)
            overrides["tp"] = lay.tp
        if cfg.parallel.offload and not strategies.get(choice).shards_parameters:
            choice = "hsdp" if lay.nnodes > 1 and lay.nproc > 1 else "fsdp"
            reason = "auto: parallel.offload is set, and offloading needs sharded parameters"
    else:
        choice, reason = strategy, "forced by parallel.strategy"
    column = column_for(choice, with_parallel(cfg, **overrides))
    plan = est.plans[column]
    if plan.total > lay.budget and not cfg.parallel.force:
        what = "no strategy fits" if strategy == "auto" else f"strategy {choice!r} does not fit"
        raise ConfigError(
            f"{what}: {LABELS[column]} needs {fmt_bytes(plan.total)} per rank, more than the "
            f"{fmt_bytes(lay.budget)} usable ({fmt_bytes(lay.device_memory)} device memory less "
            f"{lay.headroom:.0%} headroom).\n{render(est)}\n"
            f"To fix: {advice(est, est.profile, cfg)}"
        )
    fit = f"{LABELS[column]} plan {fmt_bytes(plan.total)} of {fmt_bytes(lay.budget)} usable"
    overrides |= tuned_parallel(cfg, est, column)
    reason = reason if strategy == "auto" else f"{reason} ({fit})"
    if "blocks_per_unit" in overrides:
        depth = overrides.get("forward_prefetch", "-")
        reason += (
            f"; {overrides['blocks_per_unit']} block(s) per FSDP unit, prefetch {depth}"
            " (from the plan: `disttrain estimate --explain` says why)"
        )
    return Decision(choice, reason, overrides)


def tuned_parallel(cfg: JobConfig, est: Estimate, column: str) -> dict[str, Any]:
    """The FSDP knobs left ``auto`` resolved from the plan column that runs: blocks per unit, and the prefetch
    depth (the one that hides the all-gathers where collectives overlap compute; 1 on gloo, measured faster
    than FSDP's implicit prefetch there)."""
    if not COLUMNS[column].sharded or column not in est.times:
        return {}
    t = est.times[column]
    depth = t.prefetch if est.machine is not None and est.machine.overlap else 1
    wanted = {"blocks_per_unit": t.blocks_per_unit, "forward_prefetch": depth, "backward_prefetch": depth}
    return {k: v for k, v in wanted.items() if getattr(cfg.parallel, k) == "auto"}


def tp_as_given(tp: int) -> str:
    """Why ``auto`` did not consult the plan: tensor parallelism is planned as the user gave it (for now)."""
    return (
        f"auto with tensor parallelism (tp {tp}): the layout is taken as given (the plan does not cover TP yet); "
        "fsdp over the data-parallel groups, or single TP alone"
    )


def resolve_here(
    model: nn.Module,
    sample: tuple[Any, Any],
    cfg: JobConfig,
    world: int,
    local: int,
    device_type: str,
    loss_fn: LossFn,
) -> ResolvedJob:
    """The resolve step of the Python API, where no parent process resolved the job: the precision for this
    device, ``auto`` from the plan of the model in hand (over several ranks), the degrees and the batch."""
    from disttrain.parallel.strategies import dims_from_config

    cfg = resolved_precision(cfg, device_type)
    auto = cfg.parallel.strategy == "auto"
    strategy, reason = None, "forced by parallel.strategy" if not auto else "auto: one process"
    if cfg.parallel.tp > 1:
        reason = tp_as_given(cfg.parallel.tp) if auto else reason
    elif auto and world > 1:
        strategy, reason, tuned = auto_strategy(model, sample, cfg, world, local, loss_fn)
        cfg = with_parallel(cfg, **tuned)
    dims = dims_from_config(cfg.parallel, world, local, strategy)
    return ResolvedJob(
        config=with_parallel(cfg, strategy=dims.strategy),
        device=device_type,
        nproc=local,
        nnodes=max(world // max(local, 1), 1),
        strategy=dims.strategy,
        replicate=dims.replicate,
        shard=dims.shard,
        batch=resolve_batch(cfg.train, dims.dp_size),
        reason=reason,
        auto=auto,
    )


def auto_strategy(
    model: nn.Module,
    sample: tuple[Any, Any],
    cfg: JobConfig,
    world: int,
    local: int,
    loss_fn: LossFn,
) -> Decision:
    """'auto' for a model already in hand (the Python API): plan it where it runs, with the Trainer's
    ``loss_fn``, then :func:`decide`.

    A model the planner cannot run on meta tensors gets the plain default (DDP), with the reason saying so.
    """
    from disttrain.parallel.strategies import resolve_name

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
            model,
            sample,
            micro_batch=cfg.train.micro_batch,
            compute_dtype=cfg.precision.dtype,
            loss_fn=loss_fn,
            shard_modules=cfg.parallel.shard_modules,
            attention=attention_for(device_type),
        )
    except ConfigError as e:
        return Decision(resolve_name("auto", world), f"auto without a memory plan ({e})", {})
    return decide(cfg, estimate(prof, cfg, layout))
