"""The report page: one self-contained HTML file (plots embedded as PNG data, no network needed to view
it) with a table of each run's final figures, the plots, each run's strategy, events and config; the PNGs
are also written beside it. The live server renders the same page with a refresh."""

from __future__ import annotations

import base64
import html
import time
from pathlib import Path
from typing import Any

from disttrain.report.plots import Plot, all_plots
from disttrain.report.runs import Run

TABLE_SKIP = {"last_step_time_s", "tokens_per_s_per_rank", "bad_steps", "lr"}
FINAL_KEYS = ("loss", "val_loss", "grad_norm", "tokens_per_s", "mfu", "step_time_s", "skipped_steps", "rollbacks")
STYLE = """body{font-family:system-ui,sans-serif;margin:1.5em;max-width:1400px;color:#222}
.wide{overflow-x:auto}
table{border-collapse:collapse;font-size:13px;margin:.5em 0}
td,th{border:1px solid #ccc;padding:3px 8px;text-align:right}
th:first-child,td:first-child{text-align:left}figure{display:inline-block;margin:.3em;width:48%;min-width:420px}img{width:100%}
pre{background:#f6f6f6;padding:.6em;font-size:12px;overflow:auto;max-height:20em}.warn{color:#a40}"""
# after load: how many images decoded (a browser test reads these from the DOM)
CHECK_IMAGES = """<script>window.addEventListener('load',function(){var i=document.images,b=0;
for(var k=0;k<i.length;k++){if(!i[k].complete||i[k].naturalWidth===0)b++;}
document.body.dataset.images=i.length;document.body.dataset.brokenImages=b;});</script>"""


def fmt(v: Any) -> str:
    if isinstance(v, float):
        return f"{v:.6g}"
    if isinstance(v, list) and v and all(isinstance(x, (int, float)) for x in v):
        return f"max {max(v):.6g}"
    return html.escape(str(v))


def final_figures(run: Run) -> dict[str, Any]:
    """The last value of each headline metric, then the run's summary.json (what the table shows)."""
    out: dict[str, Any] = {}
    others = [k for k in run.scalar_keys() if k not in FINAL_KEYS and k not in TABLE_SKIP]  # any command's metrics
    for key in (*FINAL_KEYS, *others):
        steps, values = run.steps_of(key)
        if values:
            out[key] = values[-1]
    steps, _ = run.steps_of("loss")
    if steps:
        out["last_step"] = steps[-1]
    out["restarts"] = sum(1 for e in run.events if e.get("event") == "restart")
    for k, v in run.summary.items():
        if isinstance(v, (int, float, str)) and k not in out:
            out[k] = v
    return out


def table(runs: list[Run]) -> str:
    figures = {r.name: final_figures(r) for r in runs}
    keys: dict[str, None] = {}
    for f in figures.values():
        keys.update(dict.fromkeys(f))
    head = "<tr><th>run</th>" + "".join(f"<th>{html.escape(k)}</th>" for k in keys) + "</tr>"
    rows = []
    for run in runs:
        cells = "".join(
            f'<td data-run="{html.escape(run.name)}" data-key="{html.escape(k)}">{fmt(figures[run.name][k])}</td>'
            if k in figures[run.name]
            else "<td></td>"
            for k in keys
        )
        rows.append(f"<tr><td>{html.escape(run.name)}</td>{cells}</tr>")
    return f'<div class="wide"><table id="final">{head}{"".join(rows)}</table></div>'


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
    if run.config:
        parts.append(f"<details><summary>config.toml</summary><pre>{html.escape(run.config)}</pre></details>")
    return "".join(parts)


def render(runs: list[Run], plots: list[Plot], refresh_s: float | None = None) -> str:
    """The whole page as one string."""
    refresh = f'<meta http-equiv="refresh" content="{refresh_s:g}">' if refresh_s else ""
    warnings = [f"{r.name}: {w}" for r in runs for w in r.warnings]
    warn = "".join(f'<p class="warn">warning: {html.escape(w)}</p>' for w in warnings)
    figs = "".join(
        f'<figure><img alt="{p.name}" data-plot="{p.name}" src="data:image/png;base64,'
        f'{base64.b64encode(p.png).decode()}" title="{html.escape(p.title)}"></figure>'
        for p in plots
    )
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
    for p in plots:
        (out_dir / "plots" / f"{p.name}.png").write_bytes(p.png)
    page = out_dir / "report.html"
    page.write_text(render(runs, plots))
    return page
