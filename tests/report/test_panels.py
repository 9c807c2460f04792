"""The report's panels and table on hand-made run folders (no processes, a few seconds): an rl folder (records
without ``step``) gets full panels, not empty ones; the loss title promises eval dots only when there are
evaluations; a flat-at-zero metric is named, not drawn; memory that barely moves stays flat; run i has one
colour in every panel; the table has readable headers, formatted cells with raw values, no duplicates."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from matplotlib.colors import to_rgb

from disttrain.report import load_run
from disttrain.report.page import render, table
from disttrain.report.plots import Plot, all_plots
from plot_pixels import coloured_pixels, pixels, spines_at

pytestmark = pytest.mark.timeout(60)


def folder(path: Path, records: list[dict[str, Any]], config: str = "", **files: Any) -> Path:
    path.mkdir(parents=True)
    (path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    if config:
        (path / "config.toml").write_text(config)
    for name, content in files.items():
        (path / f"{name}.json").write_text(json.dumps(content))
    return path


def rl_records(n: int = 6) -> list[dict[str, Any]]:
    """What `disttrain rl`'s learner writes: no ``step``; env steps, counters, means and rates."""
    return [
        {
            "time_s": 0.25 * i,
            "env_steps": 1400 * i,
            "episodes": 12 * i,
            "updates": 80 * i,
            "return": 20.0 + 9 * i,
            "return_all": 18.0 + 8 * i,
            "episode_length": 20.0 + 9 * i,
            "loss": 1.0 / i,
            "env_steps_per_s": 5000.0 + 100 * i,
            "updates_per_s": 390.0 + i,
            "replay_size": 1400 * i - 8,
            "actor_lag": 1.0 + i,
        }
        for i in range(1, n + 1)
    ]


def train_records(n: int = 8, evals: bool = True, memory: int = 340_000_000, k: float = 1.0) -> list[dict[str, Any]]:
    """What `disttrain run` writes (``k`` scales the curves: another run)."""
    recs: list[dict[str, Any]] = []
    for s in range(1, n + 1):
        rec = {
            "step": s,
            "loss": k * (4.0 - s / 10),
            "grad_norm": k * (2.0 - s / 20),
            "lr": k * 1e-4 * s,
            "tokens_per_s": k * (30000.0 + 100 * s),
            "mfu": k * (0.6 + s / 1000),
            "step_time_s": k * 0.03,
            "peak_memory_bytes": [memory + 1000 * s, memory + 900 * s],  # a 0.002% climb
            "skipped_steps": 0,
            "time": 1.8e9 + s,
        }
        recs.append({**rec, "val_loss": k * (3.9 - s / 10)} if evals and s % 4 == 0 else rec)
    return recs


def check_drawn(plot: Plot) -> None:
    """The panel has points, both axis labels, and coloured pixels inside its (real) data area."""
    assert plot.points > 0 and plot.xlabel and plot.ylabel, (plot.name, plot.points, plot.xlabel, plot.ylabel)
    assert spines_at(plot.png, plot.axes), (plot.name, plot.axes)
    assert coloured_pixels(plot.png, plot.axes) >= 20, plot.name


def test_an_rl_folder_gets_its_panels_drawn_against_env_steps(tmp_path: Path) -> None:
    run = load_run(folder(tmp_path / "rl", rl_records(), '[rl]\nalgo = "dqn"\n[train]\nmax_env_steps = 8400\n'))
    assert run.command == "rl" and run.x_key == "env_steps"
    plots = all_plots([run])
    want = ["return", "episode_length", "loss", "env_steps_per_s", "updates_per_s", "replay_size", "actor_lag"]
    assert [p.name for p in plots] == want  # counters and clocks (episodes, updates, time_s) are not panels
    for plot in plots:
        check_drawn(plot)
        assert plot.xlabel == "environment steps"
    # without config.toml, the records' keys say rl
    assert load_run(folder(tmp_path / "bare", rl_records())).command == "rl"


def test_the_loss_title_promises_eval_dots_only_when_there_are_evaluations(tmp_path: Path) -> None:
    with_evals = all_plots([load_run(folder(tmp_path / "a", train_records(evals=True)))])
    without = all_plots([load_run(folder(tmp_path / "b", train_records(evals=False)))])
    assert "dots: eval" in with_evals[0].title and with_evals[0].points == 8 + 2
    assert "dots" not in without[0].title and without[0].points == 8
    ps = [{"step": s, "loss": 0.7 - s / 100, "staleness": 0} for s in range(1, 11)]
    ps[-1].update(auc=0.8, logloss=0.47, ceiling_auc=0.86)  # ps evaluates: its eval loss is the log loss
    loss = all_plots([load_run(folder(tmp_path / "ps", ps, "[ps]\nservers = 1\n"))])[0]
    assert loss.name == "loss" and "dots: eval" in loss.title and loss.points == 11


def test_a_flat_zero_metric_is_named_not_drawn(tmp_path: Path) -> None:
    runs = [load_run(folder(tmp_path / "r", train_records()))]
    plots = all_plots(runs)
    zero = [p for p in plots if p.zero]
    assert [p.name for p in zero] == ["skipped_steps"] and zero[0].png == b""
    page = render(runs, plots)
    assert 'data-plot="skipped_steps"' not in page
    assert re.search(r'id="all-zero">All zero in every run, so not drawn: skipped steps', page), page[-3000:]


def test_memory_that_barely_moves_is_drawn_flat_from_zero(tmp_path: Path) -> None:
    plots = {p.name: p for p in all_plots([load_run(folder(tmp_path / "r", train_records()))])}
    mem = plots["peak_memory_bytes"]
    assert mem.ylabel == "memory (MiB)"
    left, top, right, bottom = mem.axes
    area = pixels(mem.png)[top + 2 : bottom - 2, left + 2 : right - 2]
    rows = np.nonzero((area.max(axis=2) - area.min(axis=2) > 0.25).any(axis=1))[0]
    assert rows.max() - rows.min() < 0.1 * (bottom - top), (rows.min(), rows.max(), mem.axes)  # a flat line
    assert rows.min() < 0.2 * (bottom - top)  # near the top: the axis starts at 0
    assert plots["mfu"].ylabel == "MFU (%)" and plots["step_time_s"].ylabel == "time per step (ms)"


def test_each_run_has_one_colour_in_every_panel(tmp_path: Path) -> None:
    runs = [
        load_run(folder(tmp_path / "a", train_records())),
        load_run(folder(tmp_path / "b", train_records(memory=10**9, k=1.3))),
    ]
    for plot in all_plots(runs):
        if plot.zero:
            continue
        left, top, right, bottom = plot.axes
        area = pixels(plot.png)[top + 2 : bottom - 2, left + 2 : right - 2]
        for colour in ("C0", "C1"):  # run 0, run 1 (rank 0 in its own colour, other ranks lighter)
            near = np.abs(area - np.array(to_rgb(colour))).max(axis=2) < 0.08
            assert near.sum() >= 10, (plot.name, colour)


def test_the_table_is_readable_and_keeps_raw_values(tmp_path: Path) -> None:
    summary = {"final_loss": 3.2, "final_val_loss": 3.1, "steps": 8, "wall_s": 125.4, "strategy": "ddp", "config": {}}
    run = load_run(folder(tmp_path / "r", train_records(), "[model]\ncontext = 32\n", summary=summary))
    page = table([run])
    heads = re.findall(r"<th>([^<]*)</th>", page)
    want = ["run", "step", "loss", "val loss", "grad norm", "tokens/s", "MFU", "step time", "peak memory"]
    assert heads == [*want, "wall time", "restarts"]
    got = dict(re.findall(r'data-key="([^"]+)" data-value="[^"]*">([^<]*)</td>', page))
    assert got["mfu"] == "60.8%" and got["tokens_per_s"] == "30.8k" and got["step_time_s"] == "30 ms"
    assert got["peak_memory_bytes"] == "max 324 MiB" and got["wall_s"] == "2 min 05 s" and got["loss"] == "3.2"
    raw = dict(re.findall(r'data-key="([^"]+)" data-value="([^"]*)"', page))
    assert float(raw["mfu"]) == pytest.approx(0.608) and float(raw["loss"]) == pytest.approx(3.2)
