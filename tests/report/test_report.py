"""`disttrain report`: two real runs (one process and DDP on 2 ranks, the second with TensorBoard files)
compared in one page whose table equals their metrics; a run cut short mid-write still reports; TensorBoard
files read back equal metrics.jsonl; headless Chromium opens the page from disk and the live page over HTTP
with every image decoded and no console error; and real `run`, `ps` and `rl` folders each get their own
panels in Chromium, none empty (coloured pixels in every data area) and every axis labelled, with a table
that fits a laptop screen."""

from __future__ import annotations

import base64
import html
import json
import re
import shutil
import subprocess
import time
import urllib.request
from pathlib import Path

import pytest

from disttrain.report import load_run
from disttrain.report.page import final_figures
from disttrain.testing.launch import DISTTRAIN, together
from disttrain.testing.tiny import tiny_cli_args
from plot_pixels import coloured_pixels, spines_at

from conftest import child_env, disttrain

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory, small_text: Path) -> tuple[Path, Path]:
    root = tmp_path_factory.mktemp("report")
    common = [
        "--run.root",
        str(root),
        "--checkpoint.interval",
        "3",
        "--metrics.progress",
        "off",
        "--train.eval-interval",
        "3",
    ]
    one, two = together(
        lambda: disttrain(*tiny_cli_args(small_text, 6, *common, "--run.name", "one", "--parallel.nproc", "1")),
        lambda: disttrain(
            *tiny_cli_args(
                small_text,
                6,
                *common,
                "--run.name",
                "ddp",
                "--parallel.nproc",
                "2",
                "--parallel.strategy",
                "ddp",
                "--metrics.tensorboard",
            )
        ),
    )
    assert one.returncode == 0 and two.returncode == 0, one.stderr[-2000:] + two.stderr[-2000:]
    return root / "one", root / "ddp"


def records(run: Path) -> list[dict]:
    return [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]


def cells(page: str) -> dict[tuple[str, str], str]:
    """The summary table's raw values (``data-value``), by (run, key)."""
    found = re.findall(r'<td data-run="([^"]+)" data-key="([^"]+)" data-value="([^"]*)">[^<]*</td>', page)
    return {(r, k): html.unescape(v) for r, k, v in found}


def shown(page: str) -> dict[tuple[str, str], str]:
    """The summary table's cells as people read them, by (run, key)."""
    return {
        (r, k): v for r, k, v in re.findall(r'data-run="([^"]+)" data-key="([^"]+)" data-value="[^"]*">([^<]*)<', page)
    }


def test_a_two_run_report_has_every_plot_and_the_runs_numbers(runs: tuple[Path, Path], tmp_path: Path) -> None:
    proc = disttrain("report", *map(str, runs), "-o", str(tmp_path / "cmp"))
    assert proc.returncode == 0, proc.stderr
    page = (tmp_path / "cmp" / "report.html").read_text()
    plots = set(re.findall(r'data-plot="([^"]+)"', page))
    want = {
        "loss",
        "loss_vs_tokens",
        "grad_norm",
        "lr",
        "tokens_per_s",
        "mfu",
        "step_time_s",
        "peak_memory_bytes",
        "checkpoints",
    }
    assert want <= plots, plots
    assert {p.stem for p in (tmp_path / "cmp" / "plots").glob("*.png")} == plots
    table = cells(page)
    for run in runs:
        last = [r for r in records(run) if "loss" in r][-1]
        for key in ("loss", "grad_norm", "tokens_per_s", "mfu"):
            assert float(table[(run.name, key)]) == pytest.approx(last[key], rel=1e-5), key
        val = [r["val_loss"] for r in records(run) if "val_loss" in r][-1]
        assert float(table[(run.name, "val_loss")]) == pytest.approx(val, rel=1e-5)
        assert shown(page)[(run.name, "mfu")] == f"{last['mfu'] * 100:.3g}%"
    assert ("one", "final_loss") not in table and ("one", "steps") not in table  # each figure once
    assert "strategy <b>ddp</b>" in page and "http" not in page.split("<style>")[0].lower().replace("http-equiv", "")


def test_a_metrics_file_cut_short_still_reports_with_a_warning(runs: tuple[Path, Path], tmp_path: Path) -> None:
    cut = tmp_path / "cut"
    shutil.copytree(runs[0], cut)
    text = (cut / "metrics.jsonl").read_text()
    (cut / "metrics.jsonl").write_text(text[: len(text) - 40])  # the last line half written
    proc = disttrain("report", str(cut))
    assert proc.returncode == 0, proc.stderr
    assert "line 6 is not valid JSON (cut short" in proc.stderr, proc.stderr
    assert (cut / "report" / "report.html").is_file() and (cut / "report" / "plots" / "loss.png").is_file()
    assert final_figures(load_run(cut))["last_step"] == 5
    bad = disttrain("report", str(tmp_path))
    assert bad.returncode == 2 and "not a run folder" in bad.stderr and "Traceback" not in bad.stderr


def test_tensorboard_files_equal_metrics_jsonl(runs: tuple[Path, Path]) -> None:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(runs[1] / "tensorboard"))
    acc.Reload()
    tags = set(acc.Tags()["scalars"])
    recs = records(runs[1])
    for key in ("loss", "grad_norm", "lr", "tokens_per_s", "val_loss"):
        want = [(r["step"], r[key]) for r in recs if key in r]
        got = [(e.step, e.value) for e in acc.Scalars(key)]
        assert [s for s, _ in got] == [s for s, _ in want], key
        assert [v for _, v in got] == pytest.approx([v for _, v in want], rel=1e-6), key
    assert {"peak_memory_bytes/rank0", "peak_memory_bytes/rank1"} <= tags, tags  # per-rank: a tag each


def chromium(profile: Path, *args: str) -> subprocess.CompletedProcess[str]:
    exe = shutil.which("chromium") or shutil.which("chromium-browser")
    if exe is None:
        pytest.skip("no chromium (Debian package `chromium`; `make setup` installs it as root)")
    # 3 s of virtual time for scripts and images, less than the live page's refresh (it would reload)
    flags = [
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-quic",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--enable-logging=stderr",
        "--v=0",
        "--virtual-time-budget=3000",
        f"--user-data-dir={profile}",
    ]
    return subprocess.run([exe, *flags, *args], capture_output=True, text=True, timeout=90)


def check_in_browser(url: str, shot: Path, plots: int) -> None:
    dom = chromium(shot.parent / "chromium", "--dump-dom", url)
    body = re.search(r"<body[^>]*>", dom.stdout)
    assert body is not None, dom.stderr[-2000:]
    assert f'data-images="{plots}"' in body.group(0) and 'data-broken-images="0"' in body.group(0), body.group(0)
    errors = [x for x in dom.stderr.splitlines() if ":CONSOLE" in x]
    assert errors == [], errors
    chromium(shot.parent / "chromium", f"--screenshot={shot}", "--window-size=1200,1600", url)
    assert shot.is_file() and shot.stat().st_size > 20_000


@pytest.mark.timing
def test_chromium_shows_the_report_from_disk_and_live(runs: tuple[Path, Path], tmp_path: Path) -> None:
    run = tmp_path / "live"
    shutil.copytree(runs[1], run)
    assert disttrain("report", str(run)).returncode == 0
    page = run / "report" / "report.html"
    n = len(list((run / "report" / "plots").glob("*.png")))
    check_in_browser(page.as_uri(), tmp_path / "disk.png", n)
    server = subprocess.Popen(
        [str(DISTTRAIN), "report", "--live", "--port", "0", "--refresh-s", "10", str(run)],
        env=child_env(),
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert server.stdout is not None
        line = server.stdout.readline()
        url = re.search(r"http://127\.0\.0\.1:\d+/", line)
        assert url is not None, line
        check_in_browser(url.group(0), tmp_path / "live.png", n)
        first = urllib.request.urlopen(url.group(0), timeout=30).read().decode()
        assert '<meta http-equiv="refresh" content="10">' in first
        # the job goes on: a new record shows up at the next request
        last = records(run)[-1]
        with open(run / "metrics.jsonl", "a") as f:
            f.write(json.dumps({**last, "step": 7, "loss": 1.25}) + "\n")
        time.sleep(0.05)
        again = urllib.request.urlopen(url.group(0), timeout=30).read().decode()
        assert cells(again)[("live", "last_step")] == "7" and cells(again)[("live", "loss")] == "1.25"
    finally:
        server.terminate()
        server.wait(timeout=30)


def test_any_run_folder_reports_what_its_metrics_contain(tmp_path: Path) -> None:
    """A parameter-server-like run (no config, other keys, a per-rank list) plots its own keys."""
    run = tmp_path / "ps-run"
    run.mkdir()
    recs = [{"step": s, "loss": 0.7 - s / 100, "auc": 0.5 + s / 50, "staleness": [s % 2, 0]} for s in range(1, 9)]
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs))
    proc = disttrain("report", str(run))
    assert proc.returncode == 0, proc.stderr
    page = (run / "report" / "report.html").read_text()
    assert set(re.findall(r'data-plot="([^"]+)"', page)) == {"loss", "auc", "staleness"}
    assert float(cells(page)[("ps-run", "auc")]) == recs[-1]["auc"] and shown(page)[("ps-run", "auc")] == "0.66"


def test_the_report_reads_the_job_the_run_resolved(tmp_path: Path) -> None:
    """Tokens per step come from resolved.json (the batch the job ran with), config.toml only for older runs."""
    from disttrain.config import JobConfig, ResolvedJob, resolve_batch

    cfg = JobConfig()
    job = ResolvedJob(cfg, "cpu", 2, 1, "ddp", 2, 1, resolve_batch(cfg.train, 2), reason="forced")
    job.write(tmp_path)
    (tmp_path / "metrics.jsonl").write_text(json.dumps({"step": 1, "loss": 4.0}) + "\n")
    run = load_run(tmp_path)
    assert run.resolved["strategy"] == "ddp" and run.resolved["batch"]["accum_steps"] == job.batch.accum_steps
    assert run.tokens_per_step() == cfg.train.global_batch * cfg.model.context
    assert ResolvedJob.read(tmp_path) == job  # what the workers read back is what the parent wrote
    (tmp_path / "resolved.json").unlink()
    assert load_run(tmp_path).tokens_per_step() == cfg.train.global_batch * cfg.model.context


@pytest.fixture(scope="module")
def ps_and_rl(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """Real `disttrain ps` (1 trainer, 1 server, 20 steps, evaluated every 10) and `disttrain rl` (1 actor,
    6,000 env steps, a record every 0.25 s) run folders: a few seconds each, side by side."""
    root = tmp_path_factory.mktemp("commands")
    where = ["--run.root", str(root), "--run.name"]
    ps_args = ["--ps.tables", "1000", "500", "50", "--ps.dim", "8", "--ps.hidden", "16", "--ps.dense-lr", "0.01"]
    ps_args += ["--ps.trainers", "1", "--ps.servers", "1", "--train.batch", "64", "--train.steps", "20"]
    ps_args += ["--ps.overlap", "off"]  # every read after every update: staleness 0 throughout
    ps_args += ["--train.eval-interval", "10", "--train.eval-samples", "1000", *where, "ps"]
    rl_args = ["--rl.actors", "1", "--train.max-env-steps", "6000", "--train.log-interval-s", "0.25", *where, "rl"]
    ps, rl = together(lambda: disttrain("ps", *ps_args), lambda: disttrain("rl", *rl_args))
    assert ps.returncode == 0 and rl.returncode == 0, ps.stderr[-2000:] + rl.stderr[-2000:]
    return root / "ps", root / "rl"


PANELS = {
    "run": {"loss", "loss_vs_tokens", "lr", "grad_norm", "tokens_per_s", "mfu", "step_time_s", "peak_memory_bytes"}
    | {"checkpoints"},
    "ps": {"loss", "auc", "samples_per_s", "bytes_per_step"},
    "rl": {"return", "episode_length", "loss", "env_steps_per_s", "updates_per_s", "replay_size", "actor_lag"},
}


def figures_in(dom: str) -> list[dict[str, str]]:
    """Each panel image's attributes, as the browser has them."""
    return [dict(re.findall(r'([\w-]+)="([^"]*)"', img)) for img in re.findall(r"<img [^>]*>", dom)]


def check_panels(dom: str, command: str) -> None:
    """No empty panel (points drawn, coloured pixels inside the data area, whose edges are the spines) and
    an x and a y label on each."""
    figs = figures_in(dom)
    assert PANELS[command] <= {f["data-plot"] for f in figs}, (command, [f["data-plot"] for f in figs])
    for f in figs:
        name, png = f["data-plot"], base64.b64decode(f["src"].split(",", 1)[1])
        box = tuple(int(v) for v in f["data-axes"].split(","))
        assert len(box) == 4 and spines_at(png, box), (command, name, box)  # type: ignore[arg-type]
        assert int(f["data-points"]) > 0 and coloured_pixels(png, box) >= 20, (command, name)  # type: ignore[arg-type]
        assert f["data-xlabel"].strip() and f["data-ylabel"].strip(), (command, name, f)


def test_chromium_shows_run_ps_and_rl_folders_with_no_empty_panel_and_every_axis_labelled(
    runs: tuple[Path, Path], ps_and_rl: tuple[Path, Path], tmp_path: Path
) -> None:
    for command, run in zip(("run", "ps", "rl"), (runs[1], *ps_and_rl), strict=True):
        out = tmp_path / command
        proc = disttrain("report", str(run), "-o", str(out))
        assert proc.returncode == 0, proc.stderr
        page = (out / "report.html").read_text()
        dom = chromium(tmp_path / "chromium", "--window-size=1280,1600", "--dump-dom", (out / "report.html").as_uri())
        body = re.search(r"<body[^>]*>", dom.stdout)
        assert body is not None, dom.stderr[-2000:]
        assert 'data-broken-images="0"' in body.group(0), body.group(0)
        width = re.search(r'data-table-width="(\d+)"', body.group(0))
        assert width is not None and int(width.group(1)) <= 1200, body.group(0)  # a laptop's 1280 px, margins
        check_panels(dom.stdout, command)
        chromium(
            tmp_path / "chromium",
            f"--screenshot={tmp_path / command}.png",
            "--window-size=1280,1600",
            (out / "report.html").as_uri(),
        )
        if command == "ps":  # exact BSP: staleness 0 throughout; said, not drawn as an empty-looking panel
            assert "so not drawn: staleness" in page
        if command == "run":  # the final save, at the last step, is one of the saves drawn
            saves = load_run(run).saves
            assert saves and saves[-1]["step"] == records(run)[-1]["step"] and saves[-1]["final"], saves
