"""The parent's decisions before any worker starts: device, number of processes, the strategy (``auto`` from
the memory plan, or a forced one checked against it), its degrees and the batch arithmetic, made once into a
:class:`~disttrain.config.ResolvedJob`. Every mistake found here is a :class:`ConfigError` (one line, exit 2)
instead of a failure inside N workers.
"""

from __future__ import annotations

import dataclasses
import sys
from typing import Any

from disttrain.build import check_imports
from disttrain.config import JobConfig, ResolvedJob, resolve_batch
from disttrain.errors import ConfigError, MetaDeviceError, ModelBuildError, VocabularyError
from disttrain.launch.torchrun import check_nproc, default_nproc
from disttrain.parallel import strategies
from disttrain.parallel.env import resolve_device_type
from disttrain.parallel.mesh import check_pp, check_tp
from disttrain.plan.choose import decide, tp_as_given
from disttrain.plan.estimate import Layout, plan_job, resolve_device_memory, resolved_precision
from disttrain.plan.render import render
from disttrain.resolve.inputs import check_inputs
from disttrain.train.loss import cross_entropy


@dataclasses.dataclass(frozen=True)
class StrategyChoice:
    """The strategy the plan chose (or checked), why, and the parallel settings it tuned."""

    strategy: str
    reason: str
    plan_text: str = ""
    plan_json: dict[str, Any] | None = None
    parallel: dict[str, Any] = dataclasses.field(default_factory=dict)
    """Parallel settings the plan resolved (FSDP grouping, prefetch depth, reshard for FSDP without reshard)."""


def resolve(cfg: JobConfig) -> ResolvedJob:
    """Fill in what the user left to us (device, nproc, strategy, precision, FSDP knobs), check everything
    that needs them, and return the job as it will run."""
    try:
        device = resolve_device_type(cfg.parallel.device)
    except RuntimeError as e:
        raise ConfigError(str(e)) from None
    if cfg.checkpoint.create_seed:  # initialise once, on one process, whatever the job will later use
        cfg = dataclasses.replace(cfg, parallel=dataclasses.replace(cfg.parallel, nproc=1, strategy="single"))
    _check_offload(cfg)
    nproc = cfg.parallel.nproc or _default_nproc(cfg, device)
    check_nproc(nproc, device, cfg.parallel.oversubscribe)
    max_nodes = int(cfg.launch.nnodes.split(":")[-1])
    check_imports(cfg)
    check_inputs(cfg)  # data.path and checkpoint.resume, before the plan reads the data
    cfg = resolved_precision(cfg, device)
    choice = choose_strategy(cfg, nproc, max_nodes, device)
    if "tp" in choice.parallel:  # `auto` chose tensor parallelism: the degrees follow from it
        cfg = dataclasses.replace(cfg, parallel=dataclasses.replace(cfg.parallel, tp=choice.parallel["tp"]))
    dims = strategies.dims_from_config(cfg.parallel, nproc * max_nodes, nproc, choice.strategy)
    batch = resolve_batch(cfg.train, dims.dp_size)
    reason = choice.reason
    if dims.strategy != choice.strategy:  # the degrees decide: e.g. hsdp with one replica group is fsdp
        reason += f"; {choice.strategy} at {dims.degrees_text()} runs as {dims.strategy}"
    resolved: dict[str, Any] = {"nproc": nproc, "device": device, "strategy": dims.strategy, **choice.parallel}
    return ResolvedJob(
        config=dataclasses.replace(cfg, parallel=dataclasses.replace(cfg.parallel, **resolved)),
        device=device,
        nproc=nproc,
        nnodes=max_nodes,
        strategy=dims.strategy,
        replicate=dims.replicate,
        shard=dims.shard,
        batch=batch,
        reason=reason,
        auto=cfg.parallel.strategy == "auto",
        plan_text=choice.plan_text,
        plan_json=choice.plan_json,
    )


def _default_nproc(cfg: JobConfig, device: str) -> int:
    """Processes when the user named none: one for a strategy that runs alone (``single``), else every device."""
    forced = cfg.parallel.strategy
    if forced != "auto" and strategies.get(forced).alone:
        return 1
    return default_nproc(device)


def _check_offload(cfg: JobConfig) -> None:
    forced = cfg.parallel.strategy
    if cfg.parallel.offload and forced != "auto" and not strategies.get(forced).shards_parameters:
        raise ConfigError(
            f"parallel.offload keeps FSDP's shards in host memory; it needs strategy fsdp, hsdp or auto, not {forced!r}"
        )


def check_tp_fits(cfg: JobConfig, tp: int) -> None:
    """The model's tensor-parallel plan exists and divides by ``tp`` (checked on a meta-device build, here in the
    parent: a mistake is one line, not N failing workers)."""
    from disttrain.build import build_data, build_model, vocab_size
    from disttrain.parallel.families import plan_for
    from disttrain.parallel.tp import check_plan  # (DTensor's import, ~0.6 s: only for a job with tp > 1)

    train, _, text = build_data(cfg)
    model = build_model(cfg, vocab_size(train, text), on_meta=True)
    parallel = cfg.parallel
    check_plan(model, plan_for(model, cfg.model.tp_plan, parallel.loss_parallel, parallel.sequence_parallel), tp)


def _as_given(forced: str, tp: int, pp: int) -> str:
    """Why the plan was not consulted: the model-parallel degrees are taken as the user gave them (for now)."""
    if pp == 1:
        return tp_as_given(tp) if forced == "auto" else f"forced, with tp {tp} (the plan does not cover TP yet)"
    given = f"pp {pp}" + (f" x tp {tp}" if tp > 1 else "")
    if forced == "auto":
        return f"auto with a pipeline ({given}): the layout is taken as given (the plan does not cover pipelines yet)"
    return f"forced, with {given} (the plan does not cover pipelines yet)"


def check_pipeline_fits(cfg: JobConfig, dp_size: int) -> None:
    """The pipeline the config asks for can be cut from this model and fed by this batch (checked on a
    meta-device build, here in the parent: a wrong layout is one line, not a hang in N workers)."""
    from disttrain.build import build_data, build_model, vocab_size
    from disttrain.parallel.families import family_of
    from disttrain.parallel.stages import plan_for_model

    if cfg.precision.dtype == "fp16":
        raise ConfigError("parallel.pp > 1 runs without fp16's loss scaler (not composed yet); use bf16 or fp32")
    train, _, text = build_data(cfg)
    model = build_model(cfg, vocab_size(train, text), on_meta=True)
    plan_for_model(model, family_of(model).name, cfg.parallel, resolve_batch(cfg.train, dp_size).micro_batch)


def choose_strategy(cfg: JobConfig, nproc: int, nnodes: int, device: str) -> StrategyChoice:
    """'auto' from the memory plan; a forced strategy is checked against it (ConfigError unless it fits
    or ``parallel.force``). A model the planner cannot profile keeps a forced strategy, with a warning."""
    if cfg.checkpoint.create_seed:
        return StrategyChoice("single", "seed checkpoint: one process")
    tp, pp, world = cfg.parallel.tp, cfg.parallel.pp, nproc * nnodes
    if tp > 1 or pp > 1:  # the plan does not cover TP or PP yet: the layout as given (resolve_name decides auto)
        check_tp(tp, world)
        check_pp(pp, world // tp)
        if tp > 1:
            check_tp_fits(cfg, tp)
        if pp > 1:
            check_pipeline_fits(cfg, world // (tp * pp))
        forced = cfg.parallel.strategy
        reason = _as_given(forced, tp, pp)
        return StrategyChoice(strategies.resolve_name(forced, world // (tp * pp), tp, pp), reason)
    layout = Layout(
        nproc,
        nnodes,
        resolve_device_memory(cfg.parallel.device_memory, device, nproc),
        cfg.parallel.memory_headroom,
    )
    try:
        est = plan_job(cfg, layout, cross_entropy)
    except ConfigError as e:
        forced = cfg.parallel.strategy
        meta = isinstance(e, MetaDeviceError) and strategies.get(forced).shards_parameters
        if forced == "auto" or meta or isinstance(e, ModelBuildError | VocabularyError):  # the job's, not the plan's
            raise
        print(f"disttrain: warning: no memory plan ({e})", file=sys.stderr)
        return StrategyChoice(strategies.resolve_name(forced, nproc * nnodes), "forced; no memory plan")
    strategy, reason, tuned = decide(cfg, est)
    return StrategyChoice(strategy, reason, render(est), est.to_json(), tuned)
