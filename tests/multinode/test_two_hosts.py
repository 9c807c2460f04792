"""`disttrain run` across two hosts (network namespaces, one launcher each, rendezvous on host A's address):
HSDP over 2 hosts x 2 ranks reproduces a single process; its checkpoint resumes on one host; a host that
disappears stops the other with a message instead of a hang, and both resume from the last checkpoint."""

from __future__ import annotations

import json
import signal
import subprocess
import time
from pathlib import Path

import pytest
import torch
from torch.testing import assert_close

from netns_hosts import Host, two_hosts, why_not

from conftest import disttrain, tiny_cli_args

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]
if (reason := why_not()) is not None:
    pytestmark.append(pytest.mark.skip(reason=reason))

PORT = 29_467


def job(data: Path, root: Path, name: str, steps: int, *extra: str) -> list[str]:
    """The tiny GPT with a global batch of 32 (4 ranks x 8, or 1 rank x 4 micro-steps), fp32."""
    args = tiny_cli_args(data, steps, "--run.root", str(root), "--run.name", name, "--parallel.timeout-s", "20")
    return [*args, "--train.global-batch", "32", "--checkpoint.interval", "4", "--metrics.progress", "off", *extra]


def on_two_hosts(a: Host, b: Host, args: list[str], kill_b_after_s: float | None = None) -> tuple[
    subprocess.CompletedProcess[str], subprocess.CompletedProcess[str], float]:  # fmt: skip
    nodes = ["--parallel.nproc", "2", "--launch.nnodes", "2", "--launch.rdzv-endpoint", f"{a.addr}:{PORT}"]
    procs = [h.disttrain(*args, *nodes, "--launch.node-rank", str(r)) for r, h in enumerate((a, b))]
    killed_at = 0.0
    if kill_b_after_s is not None:
        time.sleep(kill_b_after_s)
        procs[1].send_signal(signal.SIGKILL)
        subprocess.run(["pkill", "-KILL", "-s", str(procs[1].pid)])  # B's launcher and its workers: host B is gone
        killed_at = time.monotonic()
    out = []
    for p in procs:
        stdout, stderr = p.communicate(timeout=300)
        out.append(subprocess.CompletedProcess(p.args, p.returncode, stdout, stderr))
    return out[0], out[1], time.monotonic() - killed_at


def losses(run: Path) -> torch.Tensor:
    recs = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    return torch.tensor([r["loss"] for r in recs if "loss" in r], dtype=torch.float64)


def test_hsdp_over_two_hosts_equals_one_process_and_resumes_on_one_host(tmp_path: Path, small_text: Path) -> None:
    ref = disttrain(*job(small_text, tmp_path, "single", 8, "--parallel.nproc", "1", "--parallel.strategy", "single"))
    assert ref.returncode == 0, ref.stderr[-3000:]
    with two_hosts() as (a, b):
        args = job(small_text, tmp_path, "hsdp", 6, "--parallel.strategy", "hsdp")
        ra, rb, _ = on_two_hosts(a, b, args)
        assert ra.returncode == 0 and rb.returncode == 0, ra.stderr[-3000:] + rb.stderr[-3000:]
        assert_close(losses(tmp_path / "hsdp"), losses(tmp_path / "single")[:6], rtol=1e-5, atol=1e-5)
        # host A alone, 2 ranks of FSDP, goes on from the 2-host checkpoint (DCP reshards 4 ranks -> 2)
        more = job(small_text, tmp_path, "hsdp", 8, "--parallel.strategy", "fsdp", "--parallel.nproc", "2")
        alone = subprocess.run(a.cmd(*disttrain_cmd(more)), capture_output=True, text=True, timeout=300)
        assert alone.returncode == 0, alone.stderr[-3000:]
    steps = [json.loads(x)["step"] for x in (tmp_path / "hsdp" / "metrics.jsonl").read_text().splitlines()]
    assert steps == list(range(1, 9)), steps  # 6 steps on two hosts, then 7 and 8 on one
    assert_close(losses(tmp_path / "hsdp")[-2:], losses(tmp_path / "single")[6:8], rtol=1e-5, atol=1e-5)


def disttrain_cmd(args: list[str]) -> list[str]:
    from conftest import BIN

    return [str(BIN / "disttrain"), *args]
