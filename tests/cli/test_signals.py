"""Ctrl-C as the user's terminal sends it: every rank stops within seconds, one line says where the job was
and how to resume, no traceback. (SIGTERM with a checkpoint before leaving, for preemption, is not built yet.)"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from conftest import BIN, child_env, tiny_cli_args

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]


def test_ctrl_c_ends_every_rank_with_one_line(tmp_path: Path, small_text: Path) -> None:
    sig, code, said = signal.SIGINT, 130, "interrupted"
    args = tiny_cli_args(small_text, 2000, "--run.root", str(tmp_path), "--run.name", "sig", "--checkpoint.interval",
                         "4", "--metrics.progress", "off")  # fmt: skip
    proc = subprocess.Popen([str(BIN / "disttrain"), *args], env=child_env(), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)  # fmt: skip
    metrics = tmp_path / "sig" / "metrics.jsonl"
    deadline = time.monotonic() + 200
    while time.monotonic() < deadline and not (metrics.is_file() and metrics.read_text().count("\n") >= 9):
        time.sleep(0.1)
    os.killpg(proc.pid, sig)  # what a terminal's Ctrl-C does: the signal to the foreground process group
    sent = time.monotonic()
    _, err = proc.communicate(timeout=120)
    took = time.monotonic() - sent
    assert proc.returncode == code and took < 30, (proc.returncode, took, err[-3000:])
    assert "Traceback" not in err and "SignalException" not in err, err[-3000:]
    lines = [x for x in err.splitlines() if x.startswith("disttrain: ")]
    assert len(lines) == 1 and f"disttrain: {said} at step " in lines[0], err[-3000:]
    assert "resume with disttrain run --run.name sig" in lines[0] and "newest complete checkpoint: step" in lines[0]
    last = max(json.loads(x)["step"] for x in metrics.read_text().splitlines())
    assert f"at step {last};" in lines[0], (lines[0], last)
