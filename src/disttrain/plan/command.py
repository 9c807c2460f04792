"""The ``disttrain estimate`` command: the memory plan as a table or JSON and, with ``--measure``, the
plan against a few real steps of every strategy that fits, on this machine (error in percent).

The plan itself is :mod:`disttrain.plan.estimate`; the measurement is :mod:`disttrain.plan.measure`.
"""

from __future__ import annotations

import json
from typing import Any

from disttrain.config import JobConfig, parse_bytes
from disttrain.errors import ConfigError
from disttrain.plan.estimate import (
    COLUMNS,
    Estimate,
    Layout,
    advice,
    fmt_bytes,
    local_device,
    plan_job,
    render,
    resolve_device_memory,
    resolved_precision,
    sharded_bytes,
    target_device,
    with_parallel,
)


def compare(est: Estimate, measured: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    """Predicted vs measured per strategy: a text table and the same figures as JSON (error in %)."""
    prof = est.profile
    saved_pred = prof.activations(est.ac) - prof.largest_act  # what saved-tensor hooks can see
    lines = [f"predicted vs measured, per rank ({est.layout.nproc} rank(s) on this machine)"]
    lines.append(f"{'strategy':<16}{'row':<14}{'predicted':>12}{'measured':>12}{'error':>9}")
    table: dict[str, Any] = {}
    for s, m in measured.items():
        if "error" in m:
            lines.append(f"{s:<16}failed: {m['error']}")
            table[s] = m
            continue
        p = est.plans[s]
        shard_params, shard_grads = sharded_bytes(prof.params, p.shard, 4), sharded_bytes(prof.params, p.shard, 4, True)
        pairs = {
            "params": (p.params if s != "fsdp_offload" else shard_params, m["params"]),
            "grads": (p.grads if s != "fsdp_offload" else shard_grads, m["grads"]),
            "optimizer": (p.optimizer if s != "fsdp_offload" else p.host - shard_params - shard_grads, m["optimizer"]),
            "activations": (saved_pred, m["activations_saved"]),
            # on CPU the offloaded shards are in the same RSS as everything else
            "total peak": (p.total + (p.host if m["peak_source"] != "cuda max_memory_allocated" else 0), m["peak"]),
        }
        table[s] = {"peak_source": m["peak_source"]}
        for row, (pred, meas) in pairs.items():
            err = 100.0 * (pred - meas) / meas if meas else float("nan")
            table[s][row] = {"predicted": int(pred), "measured": int(meas), "error_pct": err}
            lines.append(f"{s:<16}{row:<14}{fmt_bytes(pred):>12}{fmt_bytes(meas):>12}{err:>8.1f}%")
    source = next((m["peak_source"] for m in measured.values() if "peak_source" in m), "-")
    lines.append(f"measured total peak: {source}, above the process before the model was built")
    return "\n".join(lines), table


def run_estimate(
    cfg: JobConfig,
    *,
    nproc: int | None = None,
    nnodes: int = 1,
    device_memory: str | None = None,
    as_json: bool = False,
    measure: bool = False,
) -> int:
    """``disttrain estimate``: print the plan (and, with ``measure``, predicted vs measured)."""
    from disttrain.launch.torchrun import check_nproc, default_nproc

    device = local_device(cfg)
    nproc = nproc or cfg.parallel.nproc or default_nproc(device)
    if nproc < 1 or nnodes < 1:
        raise ConfigError(f"--nproc ({nproc}) and --nnodes ({nnodes}) must be >= 1")
    target = target_device(cfg)
    if not device_memory and cfg.parallel.device_memory == "auto" and target == "cuda" and device != "cuda":
        raise ConfigError(
            "planning for CUDA devices on a machine without one: say how much memory each GPU has, "
            "e.g. --device-memory 80GiB"
        )
    mem = (
        parse_bytes(device_memory, "--device-memory")
        if device_memory
        else resolve_device_memory(cfg.parallel.device_memory, target, nproc)
    )
    est = plan_job(cfg, Layout(nproc, nnodes, mem, cfg.parallel.memory_headroom))
    out: dict[str, Any] = est.to_json()
    text = render(est)
    if not any(est.fits.values()):
        out["advice"] = advice(est, est.profile, resolved_precision(cfg, target))
        text += f"\nto fit: {out['advice']}"
    if measure:
        if nnodes != 1:
            raise ConfigError("--measure runs on this machine only; drop --nnodes (or set it to 1)")
        check_nproc(nproc, device, oversubscribe=cfg.parallel.oversubscribe or device == "cpu")
        from disttrain.plan.measure import measure as run_measure

        if nproc == 1:
            measured = {"ddp": run_measure(with_parallel(cfg, device=device), 1, ["single"])["single"]}
        else:
            cols = [c for c in COLUMNS if c != "hsdp" and (est.fits[c] or cfg.parallel.force)]
            measured = run_measure(with_parallel(cfg, device=device), nproc, cols)
        table, out["measured"] = compare(est, measured)
        text += "\n\n" + table
    print(json.dumps(out, indent=2) if as_json else text)
    return 0
