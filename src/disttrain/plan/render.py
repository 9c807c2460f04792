"""The memory plan as text: the per-rank table with the recommendation (:func:`render`), and the plan against
what ranks measured (:func:`compare`, for ``disttrain estimate --measure``).

Presentation only, over an :class:`~disttrain.plan.estimate.Estimate` it is given: the arithmetic is in
:mod:`disttrain.plan.estimate`, which uses this module for its messages (so this one imports it for types only).
May import: ``disttrain.utils``, ``disttrain.plan.profile``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from disttrain.plan.profile import sharded_bytes
from disttrain.utils.fmt import fmt_bytes

if TYPE_CHECKING:
    from disttrain.plan.estimate import Estimate

COLUMNS = ("ddp", "fsdp", "fsdp_no_reshard", "hsdp", "fsdp_offload")
LABELS = {
    "ddp": "DDP",
    "fsdp": "FSDP",
    "fsdp_no_reshard": "FSDP no-reshard",
    "hsdp": "HSDP",
    "fsdp_offload": "FSDP+offload",
}
ROWS = ("params", "grads", "optimizer", "gathered", "activations", "total")


def render(est: Estimate) -> str:
    """The per-rank table as text, then the recommendation."""
    lay = est.layout
    cols = list(COLUMNS)
    head = ["per rank", *(LABELS[c] for c in cols)]
    shard_row = ["shard degree", *(str(est.plans[c].shard) for c in cols)]
    rows = [shard_row]
    names = {
        "params": "parameters (fp32)",
        "grads": "gradients (fp32)",
        "optimizer": "optimizer (AdamW)",
        "gathered": "gathered / low-prec copies",
        "activations": f"activations (AC {est.ac})",
    }
    for key in ROWS[:-1]:
        rows.append([names[key], *(fmt_bytes(est.plans[c].row(key)) for c in cols)])
    rows.append([f"activations (AC {est.ac_alt})", *(fmt_bytes(est.activations_alt) for _ in cols)])
    rows.append(["host memory (offload)", *(fmt_bytes(est.plans[c].host) if est.plans[c].host else "-" for c in cols)])
    rows.append(["total peak", *(fmt_bytes(est.plans[c].total) for c in cols)])
    rows.append([f"fits {fmt_bytes(lay.budget)}?", *("yes" if est.fits[c] else "NO" for c in cols)])
    widths = [max(len(r[i]) for r in [head, *rows]) for i in range(len(head))]
    line = "  ".join("-" * w for w in widths)
    out = [
        f"memory plan per rank: {est.profile.n_params / 1e6:,.1f}M parameters, {lay.nproc} rank(s) x "
        f"{lay.nnodes} node(s), micro-batch {est.profile.micro_batch}, {est.profile.compute_dtype} compute, "
        f"{est.profile.attention} attention, "
        f"device memory {fmt_bytes(lay.device_memory)} - {lay.headroom:.0%} headroom",
        _line(head, widths),
        line,
    ]
    out.extend(_line(r, widths) for r in rows)
    out.append(f"recommended: {est.choice} — {est.reason}")
    return "\n".join(out)


def _line(cells: list[str], widths: list[int]) -> str:
    """First cell left-aligned, the others right-aligned."""
    return "  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(cells, widths, strict=True)))


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
