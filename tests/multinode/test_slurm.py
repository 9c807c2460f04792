"""`--slurm` writes an sbatch script; run here under a fake `srun` (one launcher per "node", SLURM_NODEID set,
all on this host) and a fake `scontrol`, it trains one job over 2 nodes."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from disttrain.testing.launch import pids_mentioning
from disttrain.testing.ports import free_port
from disttrain.testing.tiny import tiny_cli_args

from conftest import child_env, disttrain, metric_steps

pytestmark = [pytest.mark.slow, pytest.mark.timeout(400)]

FAKE_SRUN = """#!/bin/bash
# fake srun: start the step's command once per node of the allocation, on this host, and wait for all
shift  # --kill-on-bad-exit=1
pids=()
for ((i = 0; i < SLURM_NNODES; i++)); do SLURM_NODEID=$i "$@" & pids+=($!); done
rc=0
for p in "${pids[@]}"; do wait "$p" || rc=$?; done
exit $rc
"""
FAKE_SCONTROL = """#!/bin/bash
[ "$1 $2" = "show hostnames" ] && echo 127.0.0.1
[ "$1" = "requeue" ] && echo "$@" >> "$SCONTROL_LOG"
exit 0
"""


def fake_slurm(tmp: Path) -> dict[str, str]:
    bin_dir = tmp / "fakebin"
    bin_dir.mkdir()
    for name, text in (("srun", FAKE_SRUN), ("scontrol", FAKE_SCONTROL)):
        (bin_dir / name).write_text(text)
        (bin_dir / name).chmod(0o755)
    port = free_port()
    return {
        **child_env(),
        "PATH": f"{bin_dir}:{os.environ['PATH']}",
        "SLURM_NNODES": "2",
        "SLURM_JOB_ID": "77",
        "SLURM_JOB_NODELIST": "node[1-2]",
        "DISTTRAIN_RDZV_PORT": str(port),
        "SCONTROL_LOG": str(tmp / "scontrol.log"),
    }


def test_run_slurm_writes_a_script_that_trains_over_two_nodes(tmp_path: Path, small_text: Path) -> None:
    args = tiny_cli_args(
        small_text,
        4,
        "--run.root",
        str(tmp_path),
        "--run.name",
        "sl",
        "--parallel.nproc",
        "1",
        "--launch.nnodes",
        "2",
        "--metrics.progress",
        "off",
    )
    proc = disttrain(*args, "--slurm")
    assert proc.returncode == 0, proc.stderr[-2000:]
    script = tmp_path / "sl.sbatch"
    assert f"submit it with: sbatch {script}" in proc.stdout
    text = script.read_text()
    assert "#SBATCH --nodes=2" in text and "srun --kill-on-bad-exit=1" in text and '"$SLURM_NODEID"' in text
    assert "#SBATCH --signal=USR1@90" in text and "#SBATCH --requeue" in text
    assert not (tmp_path / "sl").exists()  # nothing ran
    ran = subprocess.run(["bash", str(script)], env=fake_slurm(tmp_path), capture_output=True, text=True, timeout=300)
    assert ran.returncode == 0, ran.stdout[-2000:] + ran.stderr[-3000:]
    recs = [json.loads(x) for x in (tmp_path / "sl" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in recs if "loss" in r] == [1, 2, 3, 4]
    assert "ddp x 2 rank(s)" in ran.stdout or "2 cpu process" in ran.stdout or "x 2 node" in ran.stdout, ran.stdout


def test_launch_slurm_writes_a_script_for_a_users_program(tmp_path: Path) -> None:
    prog = tmp_path / "hello.py"
    prog.write_text(
        "import os, pathlib\nout = pathlib.Path(__file__).parent / f\"rank{os.environ['RANK']}.txt\"\n"
        "out.write_text(os.environ['WORLD_SIZE'] + ' ' + os.environ['LOCAL_RANK'])\n"
    )
    proc = disttrain("launch", "--slurm", "-n", "1", "--nnodes", "2", str(prog), "--flag")
    assert proc.returncode == 0, proc.stderr[-2000:]
    script = tmp_path / "hello.sbatch"
    ran = subprocess.run(["bash", str(script)], env=fake_slurm(tmp_path), capture_output=True, text=True, timeout=300)
    assert ran.returncode == 0, ran.stdout[-2000:] + ran.stderr[-3000:]
    assert sorted(p.read_text() for p in tmp_path.glob("rank*.txt")) == ["2 0", "2 0"]


@pytest.mark.timing
def test_the_time_limit_warning_saves_requeues_and_the_requeued_job_goes_on(tmp_path: Path, small_text: Path) -> None:
    """Slurm's SIGUSR1 (--signal=USR1@90) to every process of the step: both nodes save the same step, node 0
    asks for a requeue; the requeued script (the same one, run again) resumes from that step."""
    run = tmp_path / "rq"
    nodes = ["--parallel.nproc", "1", "--launch.nnodes", "2", "--checkpoint.interval", "50"]
    args = tiny_cli_args(small_text, 2000, "--run.root", str(tmp_path), "--run.name", "rq", *nodes)
    assert disttrain(*args, "--slurm").returncode == 0
    env, done = fake_slurm(tmp_path), []
    for _ in range(2):  # the job, then its requeued self
        job = subprocess.Popen(
            ["bash", str(tmp_path / "rq.sbatch")], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )
        before = len(metric_steps(run))
        deadline = time.monotonic() + 200
        while len(metric_steps(run)) < before + 4 and time.monotonic() < deadline:
            time.sleep(0.1)
        for pid in pids_mentioning(run):  # the launchers and workers (Python); not srun or the batch shell
            if "python" in os.readlink(f"/proc/{pid}/exe"):
                os.kill(pid, signal.SIGUSR1)
        out, err = job.communicate(timeout=120)
        assert job.returncode == 138, out[-2000:] + err[-3000:]
        done.append(max(metric_steps(run)))
        assert f"preempted (SIGUSR1) at step {done[-1]}; newest complete checkpoint: step {done[-1]}" in err, err
        assert err.count("requeued Slurm job 77") == 1, err  # node 0 only
    assert (tmp_path / "scontrol.log").read_text().split() == ["requeue", "77"] * 2
    assert metric_steps(run) == list(range(1, done[1] + 1)) and done[0] < done[1]  # no step lost or run twice
