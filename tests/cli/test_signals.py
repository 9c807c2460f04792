"""Stop signals as users' terminals and schedulers send them, to the real `disttrain run` on 2 ranks:
Ctrl-C (twice) ends every rank within seconds with one line and no traceback; SIGTERM (preemption) makes
every rank finish its step and save it before leaving, and the job resumes from there. (SIGUSR1 and the
Slurm requeue: tests/multinode/test_slurm.py; both across two hosts: tests/multinode/test_two_hosts.py.)"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from disttrain.testing.launch import DISTTRAIN, pids_mentioning
from disttrain.testing.tiny import tiny_cli_args

from conftest import child_env, metric_steps

pytestmark = [pytest.mark.slow, pytest.mark.timing, pytest.mark.timeout(300)]


def start(args: list[str], env: dict[str, str] | None = None) -> subprocess.Popen[str]:
    pipe, env = subprocess.PIPE, {**child_env(), **(env or {})}
    return subprocess.Popen(
        [str(DISTTRAIN), *args], env=env, stdout=pipe, stderr=pipe, text=True, start_new_session=True
    )


def wait_for_steps(run: Path, n: int) -> None:
    deadline = time.monotonic() + 200
    while time.monotonic() < deadline and len(metric_steps(run)) < n:
        time.sleep(0.1)


def one_line(err: str) -> str:
    assert "Traceback" not in err and "SignalException" not in err, err[-3000:]
    # torchrun's agent's "Received SIGINT death signal, shutting down workers" and "Sending process N closing
    # signal SIGINT" (once per worker) said what our line says, three times, before it
    assert "death signal" not in err and "closing signal" not in err, err[-3000:]
    lines = [x for x in err.splitlines() if x.startswith("disttrain: ")]
    assert len(lines) == 1, err[-3000:]
    return lines[0]


def job(tmp_path: Path, data: Path, name: str, steps: int = 2000) -> list[str]:
    return tiny_cli_args(
        data,
        steps,
        "--run.root",
        str(tmp_path),
        "--run.name",
        name,
        "--checkpoint.interval",
        "4",
        "--metrics.progress",
        "off",
    )


def newest_checkpoint(run: Path) -> int:
    return max(int(p.name.split("-")[1]) for p in (run / "checkpoints").glob("step-*"))


def test_ctrl_c_twice_ends_every_rank_with_one_line(tmp_path: Path, small_text: Path) -> None:
    proc = start(job(tmp_path, small_text, "sig"))
    wait_for_steps(tmp_path / "sig", 9)
    os.killpg(proc.pid, signal.SIGINT)  # what a terminal's Ctrl-C does: the signal to the foreground group
    sent = time.monotonic()
    time.sleep(0.3)
    try:
        os.killpg(proc.pid, signal.SIGINT)  # an impatient second Ctrl-C changes nothing but the speed
    except ProcessLookupError:
        pass
    _, err = proc.communicate(timeout=120)
    took = time.monotonic() - sent
    assert proc.returncode == 130 and took < 30, (proc.returncode, took, err[-3000:])
    line = one_line(err)
    assert "disttrain: interrupted at step " in line, err[-3000:]
    assert "resume with disttrain run --run.name sig" in line and "newest complete checkpoint: step" in line
    assert f"at step {max(metric_steps(tmp_path / 'sig'))};" in line, line
    assert pids_mentioning(tmp_path / "sig") == []


def test_sigterm_saves_the_step_every_rank_finished_and_the_job_resumes_there(tmp_path: Path, small_text: Path) -> None:
    run = tmp_path / "pre"
    proc = start(job(tmp_path, small_text, "pre"))
    wait_for_steps(run, 6)
    os.kill(proc.pid, signal.SIGTERM)  # to the launcher only, as Kubernetes does (torchrun passes it on)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 143, (proc.returncode, err[-3000:])
    last = max(metric_steps(run))
    line = one_line(err)
    assert line.startswith(f"disttrain: terminated (SIGTERM) at step {last}; newest complete checkpoint: step {last};")
    assert newest_checkpoint(run) == last, (newest_checkpoint(run), last)
    events = [json.loads(x) for x in (run / "health" / "events.jsonl").read_text().splitlines()]
    assert any(e["event"] == "preempted" and e["step"] == last for e in events), events
    again = subprocess.run(
        [str(DISTTRAIN), *job(tmp_path, small_text, "pre", last + 2)],
        env=child_env(),
        capture_output=True,
        text=True,
        timeout=200,
    )
    assert again.returncode == 0, again.stderr[-3000:]
    assert metric_steps(run) == list(range(1, last + 3))  # on from the saved step, none twice
