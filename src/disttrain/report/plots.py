"""The report's plots, drawn with matplotlib (object API, no pyplot state: the live server draws from
several threads) into PNG bytes. One figure per metric, every run overlaid; per-rank figures one line per
rank; events (restarts, hangs, rollbacks, lost nodes, preemptions) marked on the step axis."""

from __future__ import annotations

import io
from dataclasses import dataclass
from typing import Any

from matplotlib.figure import Figure

from disttrain.report.runs import Run

TITLES = {
    "loss": "loss (train, and eval as dots)",
    "grad_norm": "gradient norm (global)",
    "lr": "learning rate",
    "tokens_per_s": "tokens/s (all ranks)",
    "mfu": "MFU",
    "step_time_s": "step time (s)",
    "peak_memory_bytes": "peak memory per rank (MB)",
    "rank_compute_s": "compute time per step, per rank (s): stragglers stand out",
    "rank_data_s": "data-loading time per step, per rank (s)",
    "skipped_steps": "skipped steps (non-finite or spiking loss), cumulative",
}
SKIP = {"val_loss", "last_step_time_s", "tokens_per_s_per_rank", "nonfinite"}  # drawn with another figure
MARKED = {"restart", "hang", "rollback", "bad_steps", "stop", "peer_lost", "preempted", "ps_server_down"}


@dataclass
class Plot:
    name: str
    title: str
    png: bytes


def _figure() -> tuple[Figure, Any]:
    fig = Figure(figsize=(7.2, 3.0), layout="constrained")
    return fig, fig.subplots()


def _png(fig: Figure) -> bytes:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=80)
    return buf.getvalue()


def _marks(ax: Any, runs: list[Run]) -> None:
    """A dashed vertical line, labelled, at the step of each marked event."""
    for run in runs:
        for e in run.events:
            kind = e.get("event")
            step = e.get("resumed_from") if kind == "restart" else e.get("step")
            if kind in MARKED and isinstance(step, (int, float)):
                ax.axvline(step, color="grey", linestyle="--", linewidth=0.8)
                ax.annotate(
                    kind,
                    (step, 1),
                    xycoords=("data", "axes fraction"),
                    rotation=90,
                    fontsize=7,
                    va="top",
                    ha="right",
                    color="grey",
                )


def _finish(fig: Figure, ax: Any, runs: list[Run], title: str, xlabel: str = "step") -> bytes:
    ax.set_title(title, fontsize=10)
    ax.set_xlabel(xlabel, fontsize=8)
    ax.tick_params(labelsize=8)
    ax.grid(alpha=0.3)
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize=7)
    return _png(fig)


def loss_plots(runs: list[Run]) -> list[Plot]:
    """Loss vs step (eval losses as dots) and, for language-model runs, vs tokens seen."""
    out = []
    for by_tokens in (False, True):
        if by_tokens and not all(r.tokens_per_step() for r in runs):
            continue
        fig, ax = _figure()
        for run in runs:
            scale = run.tokens_per_step() if by_tokens else 1
            assert scale is not None
            steps, values = run.steps_of("loss")
            line = ax.plot([s * scale for s in steps], values, label=run.name, linewidth=1.2)
            vs, vv = run.steps_of("val_loss")
            if vs:
                ax.plot([s * scale for s in vs], vv, "o", color=line[0].get_color(), markersize=4)
        if not by_tokens:
            _marks(ax, runs)
        name, title = ("loss_vs_tokens", "loss vs tokens seen") if by_tokens else ("loss", TITLES["loss"])
        out.append(Plot(name, title, _finish(fig, ax, runs, title, "tokens" if by_tokens else "step")))
    return out


def scalar_plot(runs: list[Run], key: str) -> Plot:
    fig, ax = _figure()
    for run in runs:
        steps, values = run.steps_of(key)
        ax.plot(steps, values, label=run.name, linewidth=1.2)
    _marks(ax, runs)
    title = TITLES.get(key, key)
    return Plot(key, title, _finish(fig, ax, runs, title))


def per_rank_plot(runs: list[Run], key: str) -> Plot:
    fig, ax = _figure()
    scale = 1e-6 if key.endswith("_bytes") else 1.0
    for run in runs:
        steps, values = run.steps_of(key)
        ranks = max((len(v) for v in values), default=0)
        for r in range(ranks):
            pts = [(s, v[r] * scale) for s, v in zip(steps, values, strict=True) if r < len(v)]
            label = f"rank {r}" if len(runs) == 1 else f"{run.name} rank {r}"
            ax.plot([p[0] for p in pts], [p[1] for p in pts], label=label, linewidth=1.0)
    _marks(ax, runs)
    title = TITLES.get(key, f"{key} per rank")
    return Plot(key, title, _finish(fig, ax, runs, title))


def checkpoint_plot(runs: list[Run]) -> Plot | None:
    """Per save: how long training waited (blocked) and how long until it was committed."""
    if not any(r.saves for r in runs):
        return None
    fig, ax = _figure()
    for run in runs:
        steps = [s["step"] for s in run.saves]
        ax.plot(steps, [s["blocked_s"] or 0 for s in run.saves], "o-", label=f"{run.name}: training blocked")
        done = [(s["step"], s["save_s"]) for s in run.saves if s["save_s"] is not None]
        if done:
            ax.plot([d[0] for d in done], [d[1] for d in done], "s--", label=f"{run.name}: until committed")
    title = "checkpoint saves (s)"
    return Plot("checkpoints", title, _finish(fig, ax, runs, title))


def all_plots(runs: list[Run]) -> list[Plot]:
    """Every figure the runs' records allow, loss first."""
    plots = loss_plots(runs)
    scalars: dict[str, None] = {}
    per_rank: dict[str, None] = {}
    for run in runs:
        scalars.update(dict.fromkeys(k for k in run.scalar_keys() if k not in SKIP and k != "loss"))
        per_rank.update(dict.fromkeys(run.per_rank_keys()))
    plots += [scalar_plot(runs, k) for k in scalars]
    plots += [per_rank_plot(runs, k) for k in per_rank]
    ck = checkpoint_plot(runs)
    return plots + ([ck] if ck else [])
