"""The report page: one self-contained HTML file (plots embedded as PNG data, no network needed to view
it) with a table of each run's final figures, the plots, each run's strategy, events and config; the PNGs
are also written beside it. The live server renders the same page with a refresh."""

from __future__ import annotations

import base64
import html
import json
import time
from pathlib import Path
from typing import Any

from disttrain.report.panels import COMMANDS, Column
from disttrain.report.plots import Plot, all_plots
from disttrain.report.runs import Run
from disttrain.report.units import fmt, readable, unit_of

STYLE = """body{font-family:system-ui,sans-serif;margin:1.5em;max-width:1280px;color:#222}
.wide{overflow-x:auto}
table{border-collapse:collapse;font-size:13px;margin:.5em 0}
td,th{border:1px solid #ccc;padding:3px 8px;text-align:right;white-space:nowrap}
th:first-child,td:first-child{text-align:left}figure{display:inline-block;margin:.3em;width:48%;min-width:420px}
img{width:100%}.note{color:#555}
pre{background:#f6f6f6;padding:.6em;font-size:12px;overflow:auto;max-height:20em}.warn{color:#a40}"""
# after load: how many images decoded, how wide the table is (a browser test reads these from the DOM)
CHECK_IMAGES = """<script>window.addEventListener('load',function(){var i=document.images,b=0;
for(var k=0;k<i.length;k++){if(!i[k].complete||i[k].naturalWidth===0)b++;}
document.body.dataset.images=i.length;document.body.dataset.brokenImages=b;
document.body.dataset.tableWidth=document.getElementById('final').offsetWidth;});</script>"""
SAME = {"final_loss": "loss", "final_val_loss": "val_loss", "steps": "last_step"}
"""summary.json keys that repeat a metric the figures already hold: shown once."""


def final_figures(run: Run) -> dict[str, Any]:
    """The last value of each metric, then what only the run's summary.json has (its ``final`` evaluation
    too); for a column marked ``summary``, summary.json's whole-run figure (what the table shows)."""
    out: dict[str, Any] = {}
    for key in (*run.scalar_keys(), *run.per_rank_keys()):
        _, values = run.steps_of(key)
        if values:
            out[key] = values[-1]
    steps, _ = run.steps_of("loss")
    if steps and run.x_key == "step":
        out["last_step"] = steps[-1]
    out["restarts"] = sum(1 for e in run.events if e.get("event") == "restart")
    final = run.summary.get("final")
    flat = {**(final if isinstance(final, dict) else {}), **run.summary}
    preferred = {c.key for c in COMMANDS[run.command].columns if c.summary}
    for k, v in flat.items():
        if isinstance(v, (int, float, str, list)) and (k in preferred or (k not in out and SAME.get(k) not in out)):
            out[k] = v
    for k in ("config", "final", "step", "time", "time_s"):
        out.pop(k, None)
    return out


def columns(runs: list[Run], figures: dict[str, dict[str, Any]]) -> list[Column]:
    """The runs' commands' columns (in order, each once) that some run has a value for."""
    cols: dict[str, Column] = {}
    for run in runs:
        cols.update({c.key: c for c in COMMANDS[run.command].columns if c.key not in cols})
    return [c for c in cols.values() if any(c.key in f for f in figures.values())]


def cell(run: Run, key: str, value: Any, unit: Any) -> str:
    """A table cell: the value formatted for people, the raw value in ``data-value`` for programs."""
    raw = html.escape(json.dumps(value), quote=True)
    return (
        f'<td data-run="{html.escape(run.name)}" data-key="{html.escape(key)}" data-value="{raw}">'
        f"{html.escape(fmt(value, unit))}</td>"
    )


def table(runs: list[Run]) -> str:
    """A row per run, the figures that matter for its command; the rest is under each run (`more figures`)."""
    figures = {r.name: final_figures(r) for r in runs}
    cols = columns(runs, figures)
    head = "<tr><th>run</th>" + "".join(f"<th>{html.escape(c.label)}</th>" for c in cols) + "</tr>"
    rows = []
    for run in runs:
        f = figures[run.name]
        cells = "".join(cell(run, c.key, f[c.key], c.unit) if c.key in f else "<td></td>" for c in cols)
        rows.append(f"<tr><td>{html.escape(run.name)}</td>{cells}</tr>")
    return f'<div class="wide"><table id="final">{head}{"".join(rows)}</table></div>'


def more_figures(run: Run) -> str:
    """The run's figures the summary table leaves out, as name / value rows."""
    shown = {c.key for c in COMMANDS[run.command].columns}
    rows = "".join(
        f"<tr><td>{html.escape(readable(k))}</td><td>{html.escape(fmt(v, unit_of(k)))}</td></tr>"
        for k, v in final_figures(run).items()
        if k not in shown
    )
    return f"<details><summary>more figures</summary><table>{rows}</table></details>" if rows else ""


def run_section(run: Run) -> str:
    strategy = run.strategy.get("strategy", "")
    reason = run.strategy.get("reason", "")
    events = "".join(
        "<tr>"
        + "".join(
            f"<td>{html.escape(str(v))[:300]}</td>"
            for v in (e.get("event"), e.get("step", e.get("resumed_from", "")), e.get("cause", e.get("reason", "")))
        )
        + "</tr>"
        for e in run.events
        if e.get("event") != "checkpoint"
    )
    parts = [f"<h3>{html.escape(run.name)}</h3><p>{html.escape(str(run.path))}</p>"]
    if strategy:
        parts.append(f"<p>strategy <b>{html.escape(strategy)}</b>: {html.escape(reason)}</p>")
    if events:
        parts.append(f"<table><tr><th>event</th><th>step</th><th>what</th></tr>{events}</table>")
    parts.append(more_figures(run))
    if run.config:
        parts.append(f"<details><summary>config.toml</summary><pre>{html.escape(run.config)}</pre></details>")
    return "".join(parts)


def figure(p: Plot) -> str:
    """A panel's image, with what a program checks: points drawn, axis labels, the data area in pixels."""
    meta = (
        f'data-plot="{p.name}" data-points="{p.points}" data-xlabel="{html.escape(p.xlabel)}" '
        f'data-ylabel="{html.escape(p.ylabel)}" data-axes="{",".join(map(str, p.axes))}"'
    )
    src = f"data:image/png;base64,{base64.b64encode(p.png).decode()}"
    return f'<figure><img alt="{html.escape(p.title)}" {meta} src="{src}" title="{html.escape(p.title)}"></figure>'


def render(runs: list[Run], plots: list[Plot], refresh_s: float | None = None) -> str:
    """The whole page as one string."""
    refresh = f'<meta http-equiv="refresh" content="{refresh_s:g}">' if refresh_s else ""
    warnings = [f"{r.name}: {w}" for r in runs for w in r.warnings]
    warn = "".join(f'<p class="warn">warning: {html.escape(w)}</p>' for w in warnings)
    figs = "".join(figure(p) for p in plots if not p.zero)
    zero = ", ".join(html.escape(p.title) for p in plots if p.zero)
    if zero:
        figs += f'<p class="note" id="all-zero">All zero in every run, so not drawn: {zero}.</p>'
    names = ", ".join(html.escape(r.name) for r in runs)
    return (
        f'<!doctype html><html><head><meta charset="utf-8">{refresh}<title>disttrain report: {names}</title>'
        f"<style>{STYLE}</style></head><body><h1>disttrain report</h1><p>{names} · "
        f"{time.strftime('%Y-%m-%d %H:%M:%S')}</p>{warn}<h2>Final figures</h2>{table(runs)}"
        f"<h2>Curves</h2>{figs}<h2>Runs</h2>{''.join(run_section(r) for r in runs)}{CHECK_IMAGES}</body></html>"
    )


def write_report(runs: list[Run], out_dir: Path) -> Path:
    """``out_dir/report.html`` and ``out_dir/plots/<name>.png``; the page's path."""
    plots = all_plots(runs)
    (out_dir / "plots").mkdir(parents=True, exist_ok=True)
    for p in (p for p in plots if not p.zero):
        (out_dir / "plots" / f"{p.name}.png").write_bytes(p.png)
    page = out_dir / "report.html"
    page.write_text(render(runs, plots))
    return page
