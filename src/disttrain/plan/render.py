"""The memory plan as text: the per-rank table with the recommendation (:func:`render`), and the plan against
what ranks measured (:func:`compare`, for ``disttrain estimate --measure``).

Presentation only, over an :class:`~disttrain.plan.estimate.Estimate` it is given: the arithmetic is in
:mod:`disttrain.plan.estimate`, which never imports this module (the columns' names are the strategy registry's).
May import: ``disttrain.utils``, ``disttrain.plan.profile``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from disttrain.errors import ConfigError
from disttrain.parallel import strategies
from disttrain.parallel.strategies import label
from disttrain.plan.profile import sharded_bytes
from disttrain.utils.fmt import fmt_bytes

if TYPE_CHECKING:
    from disttrain.plan.estimate import Estimate
    from disttrain.plan.timing import Machine

COLUMNS = tuple(strategies.COLUMNS)
ROWS = ("params", "grads", "optimizer", "step_temp", "gathered", "activations", "total")


def render(est: Estimate) -> str:
    """The per-rank table as text, then the recommendation."""
    lay = est.layout
    cols = list(COLUMNS)
    head = ["per rank", *(label(c, lay.tp) for c in cols)]
    shard_row = ["shard degree", *(str(est.plans[c].shard) for c in cols)]
    rows = [shard_row]
    if lay.tp > 1:
        rows.append(["tp degree", *(str(lay.tp) for _ in cols)])
    names = {
        "params": "parameters (fp32)",
        "grads": "gradients (fp32)",
        "optimizer": "optimizer (AdamW)",
        "step_temp": "optimizer step (temp.)",
        "gathered": "gathered / low-prec copies",
        "activations": f"activations (AC {est.ac})",
    }
    for key in ROWS[:-1]:
        rows.append([names[key], *(fmt_bytes(est.plans[c].row(key)) for c in cols)])
    rows.append([f"activations (AC {est.ac_alt})", *(fmt_bytes(est.activations_alt) for _ in cols)])
    rows.append(["host memory (offload)", *(fmt_bytes(est.plans[c].host) if est.plans[c].host else "-" for c in cols)])
    rows.append(["total peak", *(fmt_bytes(est.plans[c].total) for c in cols)])
    rows.append([f"fits {fmt_bytes(lay.budget)}?", *(_fits(est, c) for c in cols)])
    rows.extend(_time_rows(est, cols))
    widths = [max(len(r[i]) for r in [head, *rows]) for i in range(len(head))]
    line = "  ".join("-" * w for w in widths)
    out = [
        f"memory plan per rank: {est.profile.n_params / 1e6:,.1f}M parameters, {lay.nproc} rank(s) x "
        f"{lay.nnodes} node(s){_tp(lay.tp)}, micro-batch {est.profile.micro_batch}, "
        f"{est.profile.compute_dtype} compute, {est.profile.attention} attention, "
        f"device memory {fmt_bytes(lay.device_memory)} - {lay.headroom:.0%} headroom",
        _line(head, widths),
        line,
    ]
    out.extend(_line(r, widths) for r in rows)
    if est.machine is not None:
        out.append(machine_line(est))
    out.append(f"recommended: {est.choice} — {est.reason}")
    return "\n".join(out)


def _fits(est: Estimate, column: str) -> str:
    fits = "yes" if est.fits[column] else "NO"
    try:
        strategies.COLUMNS[column].strategy.check_tp(est.layout.dp_world, est.layout.tp)
    except ConfigError:
        return f"{fits} (not with TP)"
    return fits


def _tp(tp: int) -> str:
    return f" (tensor parallel: tp {tp})" if tp > 1 else ""


def _time_rows(est: Estimate, cols: list[str]) -> list[list[str]]:
    """Per strategy: the grouping, bytes sent per rank, compute, communication and the step time (predicted:
    the column that applies to the device; the other in brackets)."""
    if not est.times:
        return []
    t = {c: est.times[c] for c in cols}

    def sent(c: str) -> str:
        inter = f" ({fmt_bytes(int(t[c].sent_inter))} inter)" if t[c].sent_inter and t[c].sent_intra else ""
        return fmt_bytes(int(t[c].sent_intra + t[c].sent_inter)) + inter

    overlap = est.machine is not None and est.machine.overlap
    return [
        ["blocks per FSDP unit", *(str(t[c].blocks_per_unit) if t[c].blocks_per_unit else "-" for c in cols)],
        ["sent per rank / step", *(sent(c) for c in cols)],
        ["compute / step", *(seconds(t[c].compute_s) for c in cols)],
        ["optimizer / step", *(seconds(t[c].optimizer_s) for c in cols)],
        ["communication / step", *(seconds(t[c].comm_s + t[c].overhead_s) for c in cols)],
        ["step, no overlap" + (" *" if not overlap else ""), *(seconds(t[c].no_overlap_s) for c in cols)],
        ["step, with overlap" + (" *" if overlap else ""), *(seconds(t[c].overlap_s) for c in cols)],
    ]


def seconds(s: float) -> str:
    return f"{s * 1e3:.0f} ms" if s < 10 else f"{s:.1f} s"


def machine_line(est: Estimate) -> str:
    """Where the time figures come from (doctor's measurements, --bandwidth, or defaults)."""
    m = est.machine
    assert m is not None
    links = "; ".join(
        f"{name} {link.latency_s * 1e6:.0f} us + {link.bandwidth_Bps / 1e9:.3g} GB/s "
        f"({m.sources.get(name, link.source)})"
        for name, link in m.links.items()
        if name == "intra" or est.layout.nnodes > 1
    )
    how = (
        "with overlap: NCCL runs collectives beside compute"
        if m.overlap
        else ("without overlap: gloo runs them on the cores that compute")
    )
    return (
        f"* predicted step ({how}); "
        f"links: {links}; peak {m.tflops:.3g} TFLOP/s per {'device' if m.device == 'cuda' else 'thread'} "
        f"({m.sources.get('peak', '?')}) x efficiency {m.efficiency:.2f} ({m.sources.get('efficiency', '?')}); "
        f"element-wise {m.elementwise_rate / 1e9:.3g} G elements/s ({m.sources.get('elementwise', '?')})"
        + _framework(m)
        + ("; run `disttrain doctor` to measure this machine's links" if m.sources.get("intra") == "default" else "")
    )


def _framework(m: Machine) -> str:
    """'; framework 5.2 us per operator, FSDP 1.08 ms per unit pass (doctor)' where measured."""
    if m.sources.get("framework") != "doctor":
        return ""
    op_us, unit_ms = m.op_overhead_s * 1e6, m.unit_overhead_base_s * 1e3
    return f"; framework {op_us:.1f} us per operator, FSDP {unit_ms:.2f} ms per unit pass (doctor)"


def _line(cells: list[str], widths: list[int]) -> str:
    """First cell left-aligned, the others right-aligned."""
    return "  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(cells, widths, strict=True)))


def compare(est: Estimate, measured: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    """Predicted vs measured per strategy: a text table and the same figures as JSON (error in %)."""
    prof = est.profile
    saved_pred = prof.activations(est.ac) - prof.backward_transient  # what saved-tensor hooks can see
    lines = [f"predicted vs measured, per rank ({est.layout.nproc} rank(s) on this machine)"]
    lines.append(f"{'strategy':<16}{'row':<18}{'predicted':>12}{'measured':>12}{'error':>9}")
    table: dict[str, Any] = {}
    for s, m in measured.items():
        if "error" in m:
            lines.append(f"{s:<16}failed: {m['error']}")
            table[s] = m
            continue
        p, offload = est.plans[s], strategies.COLUMNS[s].offload
        shard_params, shard_grads = sharded_bytes(prof.params, p.shard, 4), sharded_bytes(prof.params, p.shard, 4, True)
        pairs = {
            "params": (p.params if not offload else shard_params, m["params"]),
            "grads": (p.grads if not offload else shard_grads, m["grads"]),
            "optimizer": (p.optimizer if not offload else p.host - shard_params - shard_grads, m["optimizer"]),
            "activations saved": (saved_pred, m["activations_saved"]),
            # on CPU the offloaded shards are in the same RSS as everything else
            "total peak": (p.total + (p.host if m["peak_source"] != "cuda max_memory_allocated" else 0), m["peak"]),
        }
        table[s] = {"peak_source": m["peak_source"]}
        for row, (pred, meas) in pairs.items():
            err = 100.0 * (pred - meas) / meas if meas else float("nan")
            table[s][row] = {"predicted": int(pred), "measured": int(meas), "error_pct": err}
            lines.append(f"{s:<16}{row:<18}{fmt_bytes(pred):>12}{fmt_bytes(meas):>12}{err:>8.1f}%")
        t = est.times.get(s)
        if t is None or "step_s" not in m:
            continue
        for name, secs, meas_s in (
            ("step time", t.predicted_s, m["step_s"]),
            ("communication", t.comm_s + t.overhead_s, m["comm_s"]),
        ):
            err = 100.0 * (secs - meas_s) / meas_s if meas_s else float("nan")
            table[s][name] = {"predicted_s": secs, "measured_s": meas_s, "error_pct": err}
            lines.append(f"{s:<16}{name:<18}{seconds(secs):>12}{seconds(meas_s):>12}{err:>8.1f}%")
    source = next((m["peak_source"] for m in measured.values() if "peak_source" in m), "-")
    lines.append(
        f"measured total peak: {source}, above the process before the model was built; activations saved: what "
        f"autograd saves in one forward (the plan's activations row, {fmt_bytes(prof.activations(est.ac))}, adds "
        f"the {fmt_bytes(prof.backward_transient)} of gradients that live at the start of backward, which "
        "saved-tensor hooks do not see); step time: median of 3 steps; communication: one more step under "
        "torch.profiler (gloo/NCCL ranges, c10d ops)"
    )
    return "\n".join(lines), table
