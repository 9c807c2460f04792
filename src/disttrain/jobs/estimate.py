"""The ``disttrain estimate`` command's work: the memory plan as a table or JSON and, with ``--measure``, the
plan against a few real steps of every strategy that fits, on this machine (error in percent).

The plan itself is :mod:`disttrain.plan.estimate`, its table :mod:`disttrain.plan.render`; the measurement
is :mod:`disttrain.jobs.measure`. ``disttrain.cli.estimate`` parses the arguments and calls :func:`run_estimate`.
May import: everything below ``disttrain.cli`` (it starts workers to measure, and supplies the loss the plan
profiles with, :func:`disttrain.train.loss.cross_entropy`).
"""

from __future__ import annotations

import json
from typing import Any

from disttrain.config import JobConfig
from disttrain.errors import ConfigError
from disttrain.jobs.doctor import ensure_machine
from disttrain.launch.torchrun import check_nproc, default_nproc
from disttrain.parallel.mesh import check_tp
from disttrain.parallel.strategies import COLUMNS as STRATEGY_COLUMNS
from disttrain.plan.choose import tuned_parallel
from disttrain.plan.estimate import (
    AUTO_COLUMNS,
    Estimate,
    Layout,
    advice,
    local_device,
    plan_job,
    resolve_device_memory,
    resolved_precision,
    target_device,
    with_parallel,
)
from disttrain.plan.explain import explain_plan
from disttrain.plan.render import COLUMNS, compare, render
from disttrain.plan.timing import EFFICIENCY_RUNS, remember_efficiency, resolve_machine
from disttrain.train.loss import cross_entropy


def run_estimate(
    cfg: JobConfig,
    *,
    as_json: bool = False,
    measure: bool = False,
    explain: bool = False,
    bandwidth: str | None = None,
    inter_bandwidth: str | None = None,
) -> int:
    """``disttrain estimate``: print the plan for ``parallel.nproc`` ranks on each of ``launch.nnodes`` nodes
    (elastic MIN:MAX: MIN, the fewest ranks, where each holds the most) of ``parallel.device_memory`` each (and,
    with ``measure``, predicted vs measured)."""
    device = local_device(cfg)
    nproc = cfg.parallel.nproc or default_nproc(device)
    nnodes = int(cfg.launch.nnodes.split(":")[0])
    target = target_device(cfg)
    if cfg.parallel.device_memory == "auto" and target == "cuda" and device != "cuda":
        raise ConfigError(
            "planning for CUDA devices on a machine without one: say how much memory each GPU has, "
            "e.g. --parallel.device-memory 80GiB"
        )
    mem = resolve_device_memory(cfg.parallel.device_memory, target, nproc)
    cfg = resolved_precision(cfg, target)
    dtype = cfg.precision.dtype
    if target == device:
        ensure_machine(device, dtype, nproc)
    machine = resolve_machine(
        target, dtype, bandwidth=bandwidth, inter_bandwidth=inter_bandwidth, measure_peak=target == device, nproc=nproc
    )
    tp = cfg.parallel.tp
    if tp > 1:
        check_tp(tp, nproc)
    est = plan_job(cfg, Layout(nproc, nnodes, mem, cfg.parallel.memory_headroom, tp), cross_entropy, machine)
    out: dict[str, Any] = est.to_json()
    text = render(est)
    if explain:
        text += "\n\n" + explain_plan(est, cfg)
    if not any(est.fits[c] for c in AUTO_COLUMNS):  # what `auto` chooses from: offload is a fix, not a choice
        out["advice"] = advice(est, est.profile, resolved_precision(cfg, target))
        text += f"\nto fit: {out['advice']}"
    if est.layout.tp > 1:
        given = (
            "given by --parallel.tp"
            if tp > 1
            else "chosen by `auto` (see the reason; `estimate --explain` lists the candidate layouts)"
        )
        out["tp_note"] = (
            f"each column is that strategy over the {est.layout.dp_world} data-parallel group(s) of "
            f"tp {est.layout.tp} ranks, {given}"
        )
        text += f"\nnote: {out['tp_note']}"
    if measure:
        table, out["measured"] = measure_here(cfg, est, device)
        text += "\n\n" + table
    print(json.dumps(out, indent=2) if as_json else text)
    return 0


def measure_here(cfg: JobConfig, est: Estimate, device: str) -> tuple[str, dict[str, Any]]:
    """``--measure``: a few real steps of every strategy that fits (or all with ``parallel.force``; HSDP needs
    several nodes) on this machine's ranks; predicted vs measured as text and JSON."""
    from disttrain.jobs.measure import measure as run_measure

    nproc, nnodes = est.layout.nproc, est.layout.nnodes
    if nnodes != 1:
        raise ConfigError("--measure runs on this machine only; drop --launch.nnodes (or set it to 1)")
    if est.layout.tp > 1:
        raise ConfigError(
            f"--measure runs data-parallel layouts only (not yet tensor parallelism), and this plan is at "
            f"tp {est.layout.tp}; measure without it with --parallel.strategy fsdp --parallel.force, or drop --measure"
        )
    check_nproc(nproc, device, oversubscribe=cfg.parallel.oversubscribe or device == "cpu")
    if nproc == 1:
        measured = {"ddp": run_measure(with_parallel(cfg, device=device), 1, ["single"])["single"]}
    else:
        cols = [
            c for c in COLUMNS if STRATEGY_COLUMNS[c].distinct_at(nproc, nnodes) and (est.fits[c] or cfg.parallel.force)
        ]
        tuned = {c: tuned_parallel(cfg, est, c) for c in cols}
        measured = run_measure(with_parallel(cfg, device=device), nproc, cols, tuned=tuned)
    learned = learn_efficiency(est, measured)
    table, data = compare(est, measured)
    return (f"{table}\n{learned}" if learned else table), data


def learn_efficiency(est: Estimate, measured: dict[str, Any]) -> str:
    """Keep the compute efficiency the measured steps reached (their FLOPs / (step - communication - framework
    and element-wise time - optimizer) / peak, the median over strategies) in this machine's cache, for the next
    plans' compute time; only from steps that FLOPs dominate (a tiny model's step is framework time, and says
    nothing about the FLOPs).
    Returns the line that says so ("" where nothing was learned)."""
    m = est.machine
    if m is None:
        return ""
    effs = []
    for col, res in measured.items():
        t = est.times.get(col)
        if t is None or "step_s" not in res or not res["step_s"] > res.get("comm_s", 0):
            continue
        flops_s = res["step_s"] - res["comm_s"] - t.overhead_s - t.framework_s - t.optimizer_s
        predicted = t.compute_s - t.framework_s
        if flops_s > 0 and predicted > 2 * t.framework_s:
            effs.append(m.efficiency * predicted / flops_s)  # predicted FLOP time scales as 1 / efficiency
    if not effs:
        return ""
    now = sorted(effs)[len(effs) // 2]
    if now > 1.0:  # faster than the peak allows: the model of this machine is wrong, not the efficiency
        return (
            f"compute efficiency: these steps ran at {now:.2f} of the {est.profile.compute_dtype} matmul peak, above "
            "what the peak allows: the plan's figures for this machine are off (a peak measured low, or element-wise "
            "and framework time counted high); not kept. `disttrain doctor` measures the peak and rates again"
        )
    used = remember_efficiency(m, est.profile.compute_dtype, now)
    return (
        f"compute efficiency: these steps reached {now:.2f} of the {est.profile.compute_dtype} matmul peak; "
        f"the next plans use {used:.2f}, the median of up to the last {EFFICIENCY_RUNS} runs here"
    )
