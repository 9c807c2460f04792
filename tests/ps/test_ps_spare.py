"""A parameter server killed with -9 mid-run: a spare server takes its shard, every trainer and server rolls
back to the newest checkpoint, and the job finishes without restarting anyone, its rows equal to an
uninterrupted run's."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from disttrain.testing.launch import together

from conftest import disttrain

JOB = [
    "--ps.tables",
    "1000",
    "500",
    "50",
    "--ps.dim",
    "8",
    "--ps.hidden",
    "16",
    "--ps.trainers",
    "2",
    "--ps.servers",
    "2",
    "--ps.spare-servers",
    "1",
    "--train.batch",
    "64",
    "--train.steps",
    "12",
    "--train.eval-interval",
    "0",
    "--train.eval-samples",
    "2000",
    "--checkpoint.interval",
    "4",
]


def shards(run: Path) -> list[dict[str, dict[str, torch.Tensor]]]:
    final = run / "checkpoints" / "step-00000012"
    return [torch.load(final / f"server{k}.pt", weights_only=True) for k in range(2)]


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_a_spare_takes_a_killed_servers_shard_and_the_rows_end_as_an_uninterrupted_runs(tmp_path: Path) -> None:
    clean, killed = together(
        lambda: disttrain("ps", *JOB, "--run.root", str(tmp_path), "--run.name", "clean", timeout=200),
        lambda: disttrain(
            "ps",
            *JOB,
            "--run.root",
            str(tmp_path),
            "--run.name",
            "killed",
            timeout=200,
            env={"DISTTRAIN_FAULT": "ps_server_kill:7:2"},  # server0 (rank 2) dies applying its 7th update
        ),
    )
    assert clean.returncode == 0 and killed.returncode == 0, clean.stderr[-2000:] + killed.stderr[-3000:]
    assert "server0 (rank 2) exited with code -9; a spare takes its shard" in killed.stderr, killed.stderr
    assert "shards now on spare0, server1, back at step" in killed.stdout, killed.stdout
    events = [json.loads(x) for x in (tmp_path / "killed" / "health" / "events.jsonl").read_text().splitlines()]
    kinds = [e["event"] for e in events]
    assert "ps_server_replaced" in kinds and "restart" not in kinds and "ps_resume" not in kinds, kinds
    # every row and its Adagrad state equal the uninterrupted run's
    for got, want in zip(shards(tmp_path / "killed"), shards(tmp_path / "clean"), strict=True):
        assert got.keys() == want.keys()
        for name in want:
            for key in ("weight", "sum_sq"):
                assert torch.equal(got[name][key], want[name][key]), (name, key)
    losses = {
        name: [json.loads(x) for x in (tmp_path / name / "metrics.jsonl").read_text().splitlines()]
        for name in ("clean", "killed")
    }
    assert len(losses["killed"]) > 12  # the steps after the checkpoint ran twice
    assert {r["step"]: r["loss"] for r in losses["killed"]} == {r["step"]: r["loss"] for r in losses["clean"]}


@pytest.mark.timeout(60)
def test_spares_need_checkpoints_bsp_and_servers_of_their_own(tmp_path: Path) -> None:
    root = ["--run.root", str(tmp_path)]
    no_ckpt, colocated = together(
        lambda: disttrain("ps", "--ps.spare-servers", "1", *root, timeout=60),
        lambda: disttrain("ps", "--ps.spare-servers", "1", "--ps.colocate", "on", "--checkpoint.interval", "5", *root),
    )
    assert no_ckpt.returncode == 2 and "give --checkpoint.interval N" in no_ckpt.stderr, no_ckpt.stderr
    assert colocated.returncode == 2 and "servers of their own (--ps.colocate off)" in colocated.stderr
    assert "Traceback" not in no_ckpt.stderr + colocated.stderr


@pytest.mark.slow
@pytest.mark.timeout(300)
@pytest.mark.timing
def test_an_asp_trainer_killed_mid_run_leaves_the_others_training_and_the_run_folder_names_it(tmp_path: Path) -> None:
    asp = [*JOB[: JOB.index("--ps.spare-servers")], "--ps.mode", "asp", "--ps.colocate", "off"]
    asp += ["--train.batch", "64", "--train.steps", "60", "--train.eval-interval", "0", "--train.eval-samples", "2000"]
    # trainer 1 (rank 1) takes 50 ms more a step, so trainer 0 runs ahead of it whatever the machine's load (it
    # once lagged on a busy machine and never got past the dead trainer's clock), and dies as its step 20 starts;
    # trainer 0 takes 50 ms a step from step 30 on (time for the servers to notice before it ends)
    kill = {"DISTTRAIN_FAULT": "ps_trainer_kill:20:1,ps_slow:1:1,ps_slow:30:0"}
    run = disttrain("ps", *asp, "--run.root", str(tmp_path), "--run.name", "asp", env=kill, timeout=200)
    assert run.returncode == 0, run.stderr[-3000:]
    assert "trainer1 (rank 1) exited with code -9; asp: the other trainers go on" in run.stderr, run.stderr
    assert "lost trainer(s) 1: the others went on" in run.stdout, run.stdout
    folder = tmp_path / "asp"
    summary = json.loads((folder / "summary.json").read_text())
    assert summary["trainers_lost"] == [1] and summary["final"]["step"] == 60, summary
    events = [json.loads(x) for x in (folder / "health" / "events.jsonl").read_text().splitlines()]
    assert [e["rank"] for e in events if e["event"] == "ps_trainer_lost"] == [1], events
    metrics = [json.loads(x) for x in (folder / "metrics.jsonl").read_text().splitlines()]
    assert metrics[-1]["step"] == 60  # trainer 0 went on to the end
    # trainer 0 ran ahead of the dead trainer's last clock until server 0 left it out of the clocks
    assert max(r["staleness"] for r in metrics) > 0 and metrics[-1]["staleness"] == 0, metrics
