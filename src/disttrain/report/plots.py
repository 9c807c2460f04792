"""The report's plots, drawn with matplotlib (object API, no pyplot state: the live server draws from
several threads) into PNG bytes: each command's panels (:mod:`disttrain.report.panels`) with every run
overlaid, then any other key the records hold. Run i has colour ``C<i>`` in every panel (its ranks: shades of
it); y axes carry the quantity and its unit; a panel with no points is left out and one flat at zero is only
named; events (restarts, hangs, rollbacks, ...) are marked on the step axis."""

from __future__ import annotations

import io
import math
from dataclasses import dataclass, field
from typing import Any

from matplotlib.colors import to_rgb
from matplotlib.figure import Figure
from matplotlib.ticker import FuncFormatter, MaxNLocator

from disttrain.report.panels import COMMANDS, Command, Panel, generic_panel
from disttrain.report.runs import Run
from disttrain.report.units import Unit, axis_scale, readable, si

MARKED = {"restart", "hang", "rollback", "bad_steps", "stop", "peer_lost", "preempted", "ps_server_down"}
STYLES = ("-", "--", ":", "-.")
DPI = 80
FEW = 40
"""Lines with at most this many points get a marker on each (a single point is a dot, not nothing)."""


@dataclass
class Plot:
    name: str
    title: str
    png: bytes
    xlabel: str = ""
    ylabel: str = ""
    points: int = 0
    """Data points drawn (the page shows it; a test reads it)."""
    axes: tuple[int, int, int, int] = (0, 0, 0, 0)
    """The data area in the PNG, in pixels from its top-left corner: left, top, right, bottom."""
    zero: bool = False
    """Every value is 0: not drawn (png empty), only named on the page."""


@dataclass
class Line:
    x: list[float]
    y: list[float]
    label: str
    colour: Any
    style: str = "-"
    dots: bool = False
    """Markers only (evaluations)."""


@dataclass
class Frame:
    """What a panel's axes say: title, labels, the unit the y values are in, where y starts."""

    name: str
    title: str
    xlabel: str
    ylabel: str
    unit: Unit = ""
    from_zero: bool = False
    xunit: Unit = ""
    marks: list[Run] = field(default_factory=list)
    """Runs whose events are marked (step axes only)."""


def run_colour(i: int) -> str:
    return f"C{i % 10}"


def shade(colour: str, i: int, n: int) -> tuple[float, float, float]:
    """Rank ``i`` of ``n``: the run's colour, lighter for higher ranks (still a colour, never grey)."""
    t = 0.55 * i / max(n - 1, 1)
    return tuple(c + (1 - c) * t for c in to_rgb(colour))  # type: ignore[return-value]


def _finite(xs: list[float], ys: list[Any]) -> tuple[list[float], list[float]]:
    pts = [(x, float(y)) for x, y in zip(xs, ys, strict=True) if _num(y) and math.isfinite(y)]
    return [p[0] for p in pts], [p[1] for p in pts]


def _num(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def series(run: Run, key: str, scale: float) -> list[tuple[list[float], list[float]]]:
    """The run's ``key`` as one (x, y) series, or one per rank when its values are lists."""
    xs, values = run.steps_of(key)
    xs = [x * scale for x in xs]
    if not any(isinstance(v, list) for v in values):
        return [_finite(xs, values)]
    ranks = max((len(v) for v in values if isinstance(v, list)), default=0)
    out = []
    for r in range(ranks):
        pts = [(x, v[r]) for x, v in zip(xs, values, strict=True) if isinstance(v, list) and r < len(v)]
        out.append(_finite([p[0] for p in pts], [p[1] for p in pts]))
    return out


def panel_lines(panel: Panel, i: int, run: Run, several: bool) -> list[Line]:
    """Run ``i``'s lines in ``panel``: its colour; a later key dashed; ranks in shades; evaluations as dots."""
    scale = float(run.tokens_per_step() or 0) if panel.by_tokens else 1.0
    if not scale:
        return []  # by tokens, but not a language-model run
    colour, lines = run_colour(i), []
    for k, key in enumerate(panel.keys):
        parts = series(run, key, scale)
        for r, (x, y) in enumerate(parts):
            what = [run.name] if several else []
            what += [readable(key)] if len(panel.keys) > 1 else []
            what += [f"rank {r}"] if len(parts) > 1 else []
            c = shade(colour, r, len(parts)) if len(parts) > 1 else colour
            lines.append(Line(x, y, " ".join(what) or run.name, c, STYLES[(k + r) % len(STYLES)]))
    if panel.dots:
        x, y = series(run, panel.dots, scale)[0]
        lines.append(Line(x, y, f"{run.name} eval" if several else "eval", colour, dots=True))
    return [line for line in lines if line.x]


def _figure() -> tuple[Figure, Any]:
    fig = Figure(figsize=(7.2, 3.0), dpi=DPI, layout="constrained")
    return fig, fig.subplots()


def _marks(ax: Any, runs: list[Run]) -> None:
    """A dashed grey vertical line, labelled, at the step of each marked event."""
    for run in runs:
        for e in run.events:
            kind = e.get("event")
            step = e.get("resumed_from") if kind == "restart" else e.get("step")
            if kind in MARKED and _num(step):
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


def _y_range(ax: Any, ys: list[float], from_zero: bool) -> None:
    """From zero when asked; otherwise a span of at least 10% of the values' size, so noise stays noise."""
    lo, hi = min(ys), max(ys)
    if from_zero and lo >= 0:
        ax.set_ylim(0, hi * 1.08 if hi > 0 else 1)
        return
    least = 0.1 * max(abs(lo), abs(hi))
    if hi - lo < least:
        mid = (lo + hi) / 2
        bottom = mid - least / 2
        ax.set_ylim(0 if lo >= 0 > bottom else bottom, mid + least / 2)


def _ticks(axis: Any, unit: Unit) -> None:
    if unit in ("per_s", "count"):
        axis.set_major_formatter(FuncFormatter(lambda v, _: si(v)))
    if unit == "count":
        axis.set_major_locator(MaxNLocator(integer=True))


def draw(frame: Frame, lines: list[Line]) -> Plot:
    """One panel's PNG; all-zero lines give an undrawn Plot with ``zero`` set."""
    points = sum(len(line.x) for line in lines)
    ys = [y for line in lines for y in line.y]
    if all(y == 0 for y in ys):
        return Plot(frame.name, frame.title, b"", zero=True, points=points)
    factor, unit_text = axis_scale(frame.unit, max(abs(y) for y in ys))
    ylabel = f"{frame.ylabel} ({unit_text})" if unit_text else frame.ylabel
    fig, ax = _figure()
    for line in lines:
        y = [v * factor for v in line.y]
        if line.dots:
            ax.plot(line.x, y, "o", color=line.colour, markersize=5, label=line.label)
            continue
        marker = "o" if len(line.x) <= FEW else None
        ax.plot(line.x, y, line.style, color=line.colour, marker=marker, markersize=3, linewidth=1.3, label=line.label)
    _y_range(ax, [y * factor for y in ys], frame.from_zero)
    _ticks(ax.yaxis, frame.unit)
    _ticks(ax.xaxis, frame.xunit)
    _marks(ax, frame.marks)
    ax.set_title(frame.title, fontsize=10)
    ax.set_xlabel(frame.xlabel, fontsize=9)
    ax.set_ylabel(ylabel, fontsize=9)
    ax.tick_params(labelsize=8)
    ax.grid(alpha=0.3)
    if len(lines) > 1:  # outside the data area: it hides no point (and a test counts coloured pixels there)
        fig.legend(loc="outside right upper", fontsize=7)
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=DPI)
    box, height = ax.get_window_extent(), fig.bbox.height
    axes = (round(box.x0), round(height - box.y1), round(box.x1), round(height - box.y0))
    return Plot(frame.name, frame.title, buf.getvalue(), frame.xlabel, ylabel, points, axes)


def panel_plot(panel: Panel, members: list[tuple[int, Run]], cmd: Command, name: str) -> Plot | None:
    """``panel`` over ``members`` (index, run); None when no run has a point for it."""
    several = len(members) > 1
    lines = [line for i, run in members for line in panel_lines(panel, i, run, several)]
    if not lines:
        return None
    title = panel.title + (" (line: train, dots: eval)" if any(line.dots for line in lines) else "")
    xlabel = "tokens seen" if panel.by_tokens else cmd.xlabel
    marks = [] if panel.by_tokens or cmd.x != "step" else [run for _, run in members]
    xunit: Unit = "count"  # steps, tokens, env steps: whole numbers
    frame = Frame(name, title, xlabel, panel.ylabel, panel.unit, panel.from_zero, xunit, marks)
    return draw(frame, lines)


def command_panels(cmd: Command, runs: list[Run]) -> list[Panel]:
    """The command's panels, then one per key its runs record that no panel draws and that is not hidden."""
    named = {k for p in cmd.panels for k in (*p.keys, p.dots)}
    extra: dict[str, None] = {}
    for run in runs:
        keys = [*run.scalar_keys(), *run.per_rank_keys()]
        extra.update(dict.fromkeys(k for k in keys if k not in named and k not in cmd.hidden))
    return [*cmd.panels, *(generic_panel(k) for k in extra)]


def checkpoint_plot(runs: list[tuple[int, Run]]) -> Plot | None:
    """Per save (x = step): how long training waited (blocked) and how long until it was committed."""
    lines = []
    for i, run in runs:
        saves = run.saves
        lines.append(Line([s["step"] for s in saves], [s["blocked_s"] or 0.0 for s in saves], "", run_colour(i)))
        done = [s for s in saves if s["save_s"] is not None]
        lines.append(Line([s["step"] for s in done], [s["save_s"] for s in done], "", run_colour(i), "--"))
        who = f"{run.name}: " if len(runs) > 1 else ""
        lines[-2].label, lines[-1].label = f"{who}training blocked", f"{who}until committed"
    lines = [line for line in lines if line.x]
    if not lines:
        return None
    title = "checkpoint saves (solid: training blocked, dashed: until committed)"
    return draw(Frame("checkpoints", title, "step", "time per save", "s", True, "count"), lines)


def all_plots(runs: list[Run]) -> list[Plot]:
    """Every panel the runs' records allow, each command's in its order (loss first), checkpoints last."""
    indexed = list(enumerate(runs))
    plots: list[Plot] = []
    for cmd_name in dict.fromkeys(r.command for r in runs):
        cmd = COMMANDS[cmd_name]
        members = [(i, r) for i, r in indexed if r.command == cmd_name]
        for panel in command_panels(cmd, [r for _, r in members]):
            taken = {p.name for p in plots}
            name = panel.name if panel.name not in taken else f"{cmd_name}_{panel.name}"
            plot = panel_plot(panel, members, cmd, name)
            if plot is not None:
                plots.append(plot)
    ck = checkpoint_plot([(i, r) for i, r in indexed if r.saves])
    return plots + ([ck] if ck else [])
