"""No rank watches alone (issue 28): a rank whose whole process stops (SIGSTOP, as a stuck driver call or a
debugger leaves it) is named by the launcher's watch, rank 0 included, within the hang timeout + 5 s; the job
restarts from the last checkpoint and ends with every logged loss bitwise equal to an uninterrupted run's."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest

from disttrain.testing.tiny import tiny_cli_args

from conftest import disttrain, losses_by_step

pytestmark = [pytest.mark.slow, pytest.mark.timing, pytest.mark.timeout(240)]

TIMEOUT_S = 3.0


def run_args(data: Path, root: Path, name: str, *extra: str) -> list[str]:
    run = ["--run.root", str(root), "--run.name", name, "--health.heartbeat-s", "0.25"]
    return tiny_cli_args(data, 10, *run, "--checkpoint.interval", "3", *extra)


def events(run: Path) -> list[dict[str, Any]]:
    return [json.loads(x) for x in (run / "health" / "events.jsonl").read_text().splitlines()]


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory, small_text: Path) -> dict[int, float]:
    root = tmp_path_factory.mktemp("reference")
    proc = disttrain(*run_args(small_text, root, "ref"), timeout=180)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return losses_by_step(root / "ref")


@pytest.mark.parametrize("rank", [0])  # rank 1 frozen: scripts/soak.py (its watchdog or the launcher names it)
def test_a_frozen_rank_is_named_from_outside_and_the_job_resumes_exactly(
    rank: int, reference: dict[int, float], tmp_path: Path, small_text: Path
) -> None:
    extra = ["--health.hang-timeout-s", str(TIMEOUT_S), "--max-restarts", "1"]
    proc = disttrain(*run_args(small_text, tmp_path, "f", *extra), env={"DISTTRAIN_FAULT": f"freeze:8:{rank}"})
    assert proc.returncode == 0, proc.stderr[-3000:]
    run = tmp_path / "f"
    hangs = [e for e in events(run) if e["event"] == "hang"]
    assert len(hangs) == 1, events(run)
    (stuck,) = hangs[0]["stuck"]
    if rank == 0:  # only the launcher's watch can see it: rank 0's own watchdog is frozen with it
        assert hangs[0]["by"] == "launcher" and stuck["frozen"] and stuck["process"] == "stopped", hangs[0]
        assert f"hang: rank 0 frozen (stopped, pid {stuck['pid']})" in proc.stderr, proc.stderr[-3000:]
        dump = (run / "health" / "stacks" / "attempt0-rank0-frozen.txt").read_text()
        assert "## /proc/" in dump and "## threads" in dump, dump
        if shutil.which("py-spy"):  # `make test` installs it: the frozen Python frame, read from outside
            assert "on_loss" in dump and "forward_backward_step" in dump, dump
        assert "in train_step" in (run / "health" / "stacks" / "attempt0-rank1.txt").read_text()  # it waited
        last_beat = json.loads((run / "health" / "attempt0-rank0.json").read_text())["time"]
        assert hangs[0]["time"] - last_beat <= TIMEOUT_S + 5, (hangs[0], last_beat)
    assert stuck["rank"] == rank and stuck["step"] == 8, hangs[0]
    assert stuck["phase"] in ("forward", "unknown"), hangs[0]  # unknown: it froze between two heartbeats
    (restart,) = [e for e in events(run) if e["event"] == "restart"]
    assert restart["cause"].startswith(f"hang: rank {rank}"), restart  # not "killed by a signal"
    assert restart["resumed_from"] in (3, 6)  # the newest save committed before the freeze
    assert losses_by_step(run) == reference  # bitwise: == on the floats as logged
