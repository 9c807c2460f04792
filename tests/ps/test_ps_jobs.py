"""`disttrain ps` as a user runs it: BSP over 2 trainers and 2 servers equals one trainer on the combined
batch; ASP runs without waiting; mistakes are one line."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest
import torch
from torch.testing import assert_close

from disttrain.config import load_toml, to_dict
from disttrain.ps.clicks import ClickLog, write_criteo
from disttrain.ps.config import PSJobConfig
from disttrain.testing.launch import DISTTRAIN, together
from disttrain.testing.ports import free_port

from conftest import child_env, disttrain

SMALL = [
    "--ps.tables",
    "1000",
    "500",
    "50",
    "--ps.dim",
    "8",
    "--ps.hidden",
    "16",
    "--train.steps",
    "8",
    "--train.eval-interval",
    "0",
    "--train.eval-samples",
    "2000",
    "--ps.dense-lr",
    "0.01",
    "--ps.cache-staleness",
    "0",  # the cache at bound 0: exactly BSP (tests/ps/test_ps_cache.py tries other bounds)
    "--ps.overlap",
    "off",  # every read after every update: exactly one process (test_ps_cache.py overlaps)
]
TWO = ["--ps.trainers", "2", "--ps.servers", "2", "--train.batch", "64"]
"""Two trainers against two servers, 64 samples each per step."""


def ps_job(
    tmp: Path, name: str, *args: str, env: dict[str, str] | None = None
) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    proc = disttrain("ps", *SMALL, "--run.root", str(tmp), "--run.name", name, *args, timeout=200, env=env)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    run = tmp / name
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    summary = json.loads((run / "summary.json").read_text())
    # the resolved job in the run folder is the one the workers ran
    written = load_toml(run / "config.toml", job=PSJobConfig)
    assert json.loads(json.dumps(to_dict(written))) == summary["config"] and written.run.name == name
    assert not empty_folders(run), "a run folder holds no empty folders (torchrun's per-rank log folders)"
    return records, summary


def empty_folders(run: Path) -> list[Path]:
    return [p for p in run.rglob("*") if p.is_dir() and not any(p.iterdir())]


# BSP over 2 trainers x 2 servers, 12 steps, server checkpoints every 4: the reference of the BSP equalities and
# the clean run the killed runs must reproduce (one launch for both tests)
TWO_BY_TWO = [*TWO, "--ps.mode", "bsp", "--train.steps", "12", "--checkpoint.interval", "4", "--ps.colocate", "off"]


@pytest.fixture(scope="module")
def bsp_2x2(tmp_path_factory: pytest.TempPathFactory) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """TWO_BY_TWO, from a TOML file (--config) but for the steps, an override on top of it and of SMALL."""
    tmp = tmp_path_factory.mktemp("ps-bsp")
    job = tmp / "job.toml"
    job.write_text(
        '[ps]\ntrainers = 2\nservers = 2\nmode = "bsp"\ncolocate = "off"\n'
        "[train]\nbatch = 64\n[checkpoint]\ninterval = 4\n"
    )
    records, summary = ps_job(tmp, "bsp", "--config", str(job), "--train.steps", "12")
    assert (summary["config"]["train"]["steps"], summary["config"]["checkpoint"]["interval"]) == (12, 4)
    return records, summary


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_bsp_over_two_trainers_equals_one_trainer_on_the_combined_batch(
    tmp_path: Path, bsp_2x2: tuple[list[dict[str, Any]], dict[str, Any]]
) -> None:
    bsp, summary = bsp_2x2
    assert [r["step"] for r in bsp] == list(range(1, 13))
    (one, ref), (on_server, _), (colocated, _), (ddp, _) = together(
        lambda: ps_job(
            tmp_path, "one", "--ps.trainers", "1", "--ps.servers", "1", "--train.batch", "128", "--train.steps", "12"
        ),
        # the dense part on server 0 instead of DDP: a step's two gradients averaged into one Adam step
        lambda: ps_job(
            tmp_path,
            "server",
            "--ps.trainers",
            "2",
            "--train.batch",
            "64",
            "--train.steps",
            "12",
            "--ps.dense",
            "server",
        ),
        # each server in its trainer's process (the default for as many servers as trainers), no cache
        lambda: ps_job(tmp_path, "colocated", *TWO, "--train.steps", "12", "--ps.cache-rows", "0"),
        # the dense gradients all-reduced by DDP instead of averaged in the step's message
        lambda: ps_job(tmp_path, "ddp", *TWO, "--train.steps", "12", "--ps.dense", "ddp", "--ps.colocate", "off"),
    )
    losses = torch.tensor([r["loss"] for r in bsp], dtype=torch.float64)
    assert_close(losses, torch.tensor([r["loss"] for r in one], dtype=torch.float64), rtol=1e-5, atol=1e-6)
    assert losses[-1] < losses[0]
    assert summary["final"]["auc"] == pytest.approx(ref["final"]["auc"], abs=1e-4)
    # the same job over two "nodes" (two launchers meeting at a c10d rendezvous on this host)
    port = free_port()
    nodes = ["--launch.nnodes", "2", "--launch.rdzv-endpoint", f"127.0.0.1:{port}", "--launch.node-rank"]
    two = [*SMALL, *TWO, "--train.steps", "12", "--run.root", str(tmp_path / "nodes")]
    other = subprocess.Popen(
        [str(DISTTRAIN), "ps", *two, "--run.name", "n", *nodes, "1"],
        env=child_env(),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    proc = disttrain("ps", *two, "--run.name", "n", *nodes, "0", timeout=200)
    _, err = other.communicate(timeout=60)
    assert proc.returncode == 0 and other.returncode == 0, proc.stderr[-2000:] + err[-2000:]
    metrics = [json.loads(x) for x in (tmp_path / "nodes" / "n" / "metrics.jsonl").read_text().splitlines()]
    assert_close(torch.tensor([r["loss"] for r in metrics], dtype=torch.float64), losses, rtol=1e-5, atol=1e-6)
    assert_close(torch.tensor([r["loss"] for r in on_server], dtype=torch.float64), losses, rtol=1e-5, atol=1e-6)
    assert_close(torch.tensor([r["loss"] for r in ddp], dtype=torch.float64), losses, rtol=1e-5, atol=1e-6)
    assert [r["loss"] for r in colocated] == [r["loss"] for r in bsp]  # bit for bit: the same sums in the same order


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_a_tiny_ps_run_leaves_no_empty_folders(tmp_path: Path) -> None:
    """torchrun made a log folder per rank that nothing was written to, and the health monitor a stacks folder
    for the stacks of a hang that never came: ps_job checks every run folder has none."""
    ps_job(tmp_path, "tiny", *TWO, "--train.steps", "3")


@pytest.mark.slow
@pytest.mark.timeout(600)
@pytest.mark.timing
def test_ssp_keeps_its_bound_with_a_slow_trainer_and_asp_never_waits(tmp_path: Path) -> None:
    slow = {"DISTTRAIN_FAULT": "ps_slow:0:1"}  # trainer 1 sleeps 50 ms per step
    two = [*TWO, "--train.steps", "16"]
    ssp, summary = ps_job(tmp_path, "ssp", *two, "--ps.mode", "ssp", "--ps.staleness", "1", env=slow)
    assert summary["max_staleness"] == 1, [r["staleness"] for r in ssp]  # ran ahead, never past the bound
    assert all(0 <= r["staleness"] <= 1 for r in ssp)
    asp, summary = ps_job(tmp_path, "asp", *two, "--ps.mode", "asp", env=slow)
    assert summary["max_staleness"] > 1, [r["staleness"] for r in asp]  # nobody waited for the slow one
    assert all(torch.isfinite(torch.tensor(r["loss"])) for r in asp) and asp[-1]["loss"] < asp[0]["loss"] + 0.05


def test_a_bad_ps_option_is_one_line(tmp_path: Path) -> None:
    servers, dense, nodes = together(
        lambda: disttrain("ps", "--ps.servers", "0", "--run.root", str(tmp_path), timeout=60),
        lambda: disttrain("ps", "--ps.dense", "ddp", "--ps.mode", "asp", "--run.root", str(tmp_path), timeout=60),
        lambda: disttrain("ps", "--launch.nnodes", "3", "--launch.rdzv-endpoint", "h:1", "--run.root", str(tmp_path)),
    )
    assert servers.returncode == 2 and "ps.servers must be >= 1, got 0" in servers.stderr, servers.stderr
    assert "Traceback" not in servers.stderr
    assert dense.returncode == 2 and "use --ps.dense server (or auto) with --ps.mode asp" in dense.stderr, dense.stderr
    assert nodes.returncode == 2 and "2 processes (2 trainers, each with its server)" in nodes.stderr, nodes.stderr


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_a_criteo_format_file_trains(tmp_path: Path) -> None:
    data = tmp_path / "day_0.tsv"
    write_criteo(data, ClickLog([100] * 26, n_dense=13, seed=2), 600)
    args = [
        "--ps.data-path",
        str(data),
        "--ps.tables",
        "100",
        "--ps.trainers",
        "1",
        "--ps.servers",
        "2",
        "--train.steps",
        "4",
        "--train.batch",
        "64",
        "--train.eval-samples",
        "200",
        "--run.root",
        str(tmp_path),
        "--run.name",
        "criteo",
    ]
    # server0 (rank 1) dies applying its third update: the restarted job resumes after step 2 and reads the
    # file on from there, so its last steps equal the uninterrupted run's
    kill = {"DISTTRAIN_FAULT": "ps_server_kill:3:1"}
    more = ["--checkpoint.interval", "2", "--launch.max-restarts", "1"]
    proc, killed_proc, bad = together(
        lambda: disttrain("ps", *args, "--checkpoint.interval", "2", timeout=200),
        lambda: disttrain("ps", *args[:-1], "criteo-killed", *more, timeout=200, env=kill),
        lambda: disttrain("ps", *args[:-2], "--run.name", "bad", "--ps.tables", "100", "200", timeout=60),
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    final = json.loads((tmp_path / "criteo" / "summary.json").read_text())["final"]
    assert 0.0 <= final["auc"] <= 1.0 and final["logloss"] > 0
    assert killed_proc.returncode == 0, killed_proc.stderr[-3000:]
    clean, killed = (
        [(r["step"], r["loss"]) for r in map(json.loads, (tmp_path / name / "metrics.jsonl").read_text().splitlines())]
        for name in ("criteo", "criteo-killed")
    )
    assert dict(killed) == dict(clean), (clean, killed)  # the steps after 2 (some logged twice) as in the clean run
    events = (tmp_path / "criteo-killed" / "health" / "events.jsonl").read_text()
    assert '"event": "ps_resume"' in events and '"step": 2' in events, events
    assert bad.returncode == 2 and "give 1 or 26 table sizes (got 2)" in bad.stderr, bad.stderr


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_a_server_killed_mid_run_resumes_from_its_checkpoint_with_no_row_lost(
    tmp_path: Path, bsp_2x2: tuple[list[dict[str, Any]], dict[str, Any]]
) -> None:
    two, (clean, _) = TWO_BY_TWO, bsp_2x2  # the same job, not killed
    kill = {"DISTTRAIN_FAULT": "ps_server_kill:7:2"}  # server0 (rank 2) dies applying step 7
    # Without restarts ("down"), a server that stays down ends the job with one line naming it; running the
    # same run name again resumes from the server checkpoint and ends as the clean run did.
    args = [*SMALL, *two, "--run.root", str(tmp_path), "--run.name", "down"]
    (killed, _), proc = together(
        lambda: ps_job(tmp_path, "killed", *two, "--launch.max-restarts", "1", env=kill),
        lambda: disttrain("ps", *args, timeout=200, env=kill),
    )
    steps = [r["step"] for r in killed]
    assert steps == [*range(1, 7), *range(5, 13)], steps  # step 7 never finished; resumed after step 4
    after = torch.tensor([r["loss"] for r in killed[-8:]], dtype=torch.float64)
    assert_close(after, torch.tensor([r["loss"] for r in clean[4:]], dtype=torch.float64), rtol=0, atol=0)
    events = [json.loads(x) for x in (tmp_path / "killed" / "health" / "events.jsonl").read_text().splitlines()]
    assert {e["server"] for e in events if e["event"] == "ps_server_down"} == {"server0"}, events
    assert (events[-1]["event"], events[-1]["step"]) == ("ps_resume", 4), events
    ckpts = sorted(p.name for p in (tmp_path / "killed" / "checkpoints").iterdir())
    assert ckpts == ["step-00000004", "step-00000008", "step-00000012"], ckpts  # no half checkpoint left
    assert proc.returncode != 0 and "Traceback" not in proc.stderr, proc.stderr[-3000:]
    # a trainer says it ("server0 (rank 2) is down or not answering"), or the launcher, if torchrun stopped
    # the trainers first ("server0 (rank 2) failed with exit code -9")
    assert "server0 (rank 2)" in proc.stderr, proc.stderr[-3000:]
    assert "run again with --run.name down to resume" in proc.stderr, proc.stderr[-3000:]
    again, _ = ps_job(tmp_path, "down", *two)
    assert_close(torch.tensor([r["loss"] for r in again[-8:]]), torch.tensor([r["loss"] for r in clean[4:]]))


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_the_default_job_learns_the_click_model(tmp_path: Path) -> None:
    """The default tables and 2 x 2 layout, seeded, 60 of the default 400 steps: AUC >= 0.75 already."""
    proc = disttrain(
        "ps",
        "--train.steps",
        "60",
        "--train.eval-interval",
        "0",
        "--train.eval-samples",
        "4000",
        "--run.root",
        str(tmp_path),
        "--run.name",
        "default",
        timeout=240,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    final = json.loads((tmp_path / "default" / "summary.json").read_text())["final"]
    assert final["auc"] >= 0.75 and final["auc"] < final["ceiling_auc"], final
    assert "auc" in proc.stdout and "ceiling" in proc.stdout


@pytest.mark.slow
@pytest.mark.timeout(300)
@pytest.mark.timing
def test_a_wedged_server_is_caught_by_the_trainers_hang_watchdog(tmp_path: Path) -> None:
    """server1 (rank 3) stops answering in step 3's push: the trainers' heartbeats stop moving in phase
    'optimizer' (the step's message), the watchdog names them, every trainer dumps its stacks and the job
    ends."""
    hang = {"DISTTRAIN_FAULT": "ps_server_hang:3:3"}
    fast = ["--health.hang-timeout-s", "4", "--health.heartbeat-s", "0.5", "--run.root", str(tmp_path)]
    fast += ["--ps.colocate", "off"]
    proc = disttrain("ps", *SMALL, *fast, "--run.name", "hang", env=hang, timeout=200)
    assert proc.returncode != 0, proc.stderr[-3000:]
    assert "hang: rank 0 made no progress for" in proc.stderr and "in phase 'optimizer' of step 3" in proc.stderr
    stacks = tmp_path / "hang" / "health" / "stacks"
    assert sorted(p.name for p in stacks.glob("*.txt")) == ["attempt0-rank0.txt", "attempt0-rank1.txt"]
    stack = (stacks / "attempt0-rank0.txt").read_text()
    assert "bsp_loop.py" in stack and "in wait" in stack, stack  # the stack shows where it waits


@pytest.mark.slow
@pytest.mark.timeout(600)
@pytest.mark.timing
def test_a_frozen_server_is_named_by_the_launcher_and_the_job_resumes_exactly(
    tmp_path: Path, bsp_2x2: tuple[list[dict[str, Any]], dict[str, Any]]
) -> None:
    """server0 (rank 2) stops (SIGSTOP) applying step 7: its heartbeat file goes silent, the launcher names it
    within the hang timeout + 5 s, the trainers leave on its verdict, and the restarted job resumes after step 4
    with the clean run's losses."""
    _, (clean, _) = TWO_BY_TWO, bsp_2x2
    freeze = {"DISTTRAIN_FAULT": "ps_server_freeze:7:2"}
    fast = ["--health.hang-timeout-s", "4", "--health.heartbeat-s", "0.5", "--launch.max-restarts", "1"]
    records, _ = ps_job(tmp_path, "frozen", *TWO_BY_TWO, *fast, env=freeze)
    events = [json.loads(x) for x in (tmp_path / "frozen" / "health" / "events.jsonl").read_text().splitlines()]
    (hang,) = [e for e in events if e["event"] == "hang"]
    (stuck,) = hang["stuck"]
    assert hang["by"] == "launcher" and stuck["rank"] == 2 and stuck["role"] == "server0", hang
    assert stuck["process"] == "stopped" and stuck["silent_s"] <= 4 + 5, hang
    steps = [r["step"] for r in records]
    assert steps[-1] == 12 and steps.count(5) == 2, steps  # steps 5.. ran again after the resume
    after = torch.tensor([r["loss"] for r in records[-8:]], dtype=torch.float64)
    assert_close(after, torch.tensor([r["loss"] for r in clean[4:]], dtype=torch.float64), rtol=0, atol=0)
