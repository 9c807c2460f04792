"""`disttrain run` across two hosts (network namespaces, one launcher each, rendezvous on host A's address):
HSDP over 2 hosts x 2 ranks reproduces a single process; its checkpoint resumes on one host; a host that
disappears stops the other with a message instead of a hang, and both resume from the last checkpoint; a cut link
ends the step on both with one line."""

from __future__ import annotations

import json
import os
import re
import statistics
import subprocess
import time
from pathlib import Path

import pytest
import torch
from torch.testing import assert_close

from disttrain.testing.launch import DISTTRAIN, together
from disttrain.testing.netns import Host, two_hosts, why_not
from disttrain.testing.tiny import tiny_cli_args

from conftest import disttrain, metric_steps

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]
if (reason := why_not()) is not None:
    pytestmark.append(pytest.mark.skip(reason=reason))

PORT = 29_467


def job(data: Path, root: Path, name: str, steps: int, *extra: str) -> list[str]:
    """The tiny GPT with a global batch of 32 (4 ranks x 8, or 1 rank x 4 micro-steps), fp32."""
    args = tiny_cli_args(data, steps, "--run.root", str(root), "--run.name", name, "--parallel.timeout-s", "20")
    return [*args, "--train.global-batch", "32", "--checkpoint.interval", "4", "--metrics.progress", "off", *extra]


def launch(a: Host, b: Host, args: list[str]) -> list[subprocess.Popen[str]]:
    nodes = ["--parallel.nproc", "2", "--launch.nnodes", "2", "--launch.rdzv-endpoint", f"{a.addr}:{PORT}"]
    return [h.disttrain(*args, *nodes, "--launch.node-rank", str(r)) for r, h in enumerate((a, b))]


def finish(procs: list[subprocess.Popen[str]], timeout: float = 300) -> list[subprocess.CompletedProcess[str]]:
    out = []
    for p in procs:
        stdout, stderr = p.communicate(timeout=timeout)
        out.append(subprocess.CompletedProcess(p.args, p.returncode, stdout, stderr))
    return out


def on_two_hosts(a: Host, b: Host, args: list[str]) -> list[subprocess.CompletedProcess[str]]:
    return finish(launch(a, b, args))


def wait_for_step(run: Path, step: int, timeout_s: float = 200) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if (run / "metrics.jsonl").is_file() and f'"step": {step},' in (run / "metrics.jsonl").read_text():
            return
        time.sleep(0.05)
    raise AssertionError(f"step {step} never came")


def losses(run: Path) -> torch.Tensor:
    recs = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    return torch.tensor([r["loss"] for r in recs if "loss" in r], dtype=torch.float64)


def test_hsdp_over_two_hosts_equals_one_process_and_resumes_on_one_host(tmp_path: Path, small_text: Path) -> None:
    with two_hosts() as (a, b):
        args = job(small_text, tmp_path, "hsdp", 6, "--parallel.strategy", "hsdp")
        single = job(small_text, tmp_path, "single", 8, "--parallel.nproc", "1", "--parallel.strategy", "single")
        ref, (ra, rb) = together(lambda: disttrain(*single), lambda: on_two_hosts(a, b, args))  # independent jobs
        assert ref.returncode == 0, ref.stderr[-3000:]
        assert ra.returncode == 0 and rb.returncode == 0, ra.stderr[-3000:] + rb.stderr[-3000:]
        assert_close(losses(tmp_path / "hsdp"), losses(tmp_path / "single")[:6], rtol=1e-5, atol=1e-5)
        # host A alone, 2 ranks of FSDP, goes on from the 2-host checkpoint (DCP reshards 4 ranks -> 2)
        more = job(small_text, tmp_path, "hsdp", 8, "--parallel.strategy", "fsdp", "--parallel.nproc", "2")
        alone = subprocess.run(a.cmd(*disttrain_cmd(more)), capture_output=True, text=True, timeout=300)
        assert alone.returncode == 0, alone.stderr[-3000:]
    steps = metric_steps(tmp_path / "hsdp")
    assert steps == list(range(1, 9)), steps  # 6 steps on two hosts, then 7 and 8 on one
    assert_close(losses(tmp_path / "hsdp")[-2:], losses(tmp_path / "single")[6:8], rtol=1e-5, atol=1e-5)


def disttrain_cmd(args: list[str]) -> list[str]:
    return [str(DISTTRAIN), *args]


@pytest.mark.timing
def test_a_host_that_dies_stops_the_other_with_one_line_and_both_resume_bitwise(
    tmp_path: Path, small_text: Path
) -> None:
    """Host B gone mid-run: host A's job ends within seconds, naming it; both hosts again resume from the newest
    checkpoint, and the steps run twice give the same losses bit for bit. (A preempted host, SIGTERM, saving on
    both: tests/multinode/test_k8s_pods.py, whose pods are two such hosts.)"""
    run = tmp_path / "lost"
    args = job(small_text, tmp_path, "lost", 16, "--parallel.strategy", "hsdp")
    with two_hosts() as (a, b):
        procs = launch(a, b, args)
        wait_for_step(run, 6)
        b.kill_all()  # host B is gone: its launcher and its workers
        died = time.monotonic()
        ra = finish(procs[:1])[0]
        took = time.monotonic() - died
        procs[1].communicate(timeout=30)
        assert ra.returncode != 0 and took < 20, (ra.returncode, took)  # no hang: well within the timeout
        line = f"lost contact with {b.addr}"
        assert line in ra.stderr and "start the job on every node again to resume" in ra.stderr, ra.stderr[-3000:]
        assert "Traceback" not in ra.stderr, ra.stderr[-3000:]
        lost_at = max(metric_steps(run))
        ra, rb = on_two_hosts(a, b, args)  # both hosts again: on from the newest checkpoint
        assert ra.returncode == 0 and rb.returncode == 0, ra.stderr[-3000:] + rb.stderr[-3000:]
    recs = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    first: dict[int, float] = {}
    again = []
    for r in recs:
        if "loss" not in r:
            continue
        if r["step"] in first:
            assert r["loss"] == first[r["step"]], r  # a step run twice gives the same loss, bit for bit
            again.append(r["step"])
        first[r["step"]] = r["loss"]
    assert sorted(first) == list(range(1, 17)) and again, (sorted(first), again)
    assert max(again) <= lost_at, (again, lost_at)  # only the steps after the newest checkpoint ran twice


@pytest.mark.timing
def test_a_cut_link_ends_the_step_on_both_hosts_with_one_line_and_leaves_an_intact_checkpoint(
    tmp_path: Path, small_text: Path
) -> None:
    """Both hosts live on, without a link: each says which peer it lost, and the newest complete checkpoint is
    intact (a resume from it is the host-loss test's)."""
    from disttrain.checkpoint.commit import latest
    from disttrain.checkpoint.verify import verify_checkpoint

    args = job(small_text, tmp_path, "cut", 10, "--parallel.strategy", "hsdp", "--parallel.timeout-s", "8")
    args += ["--checkpoint.async-mode", "off"]  # step 4's checkpoint is committed before step 5 begins
    with two_hosts() as (a, b):
        procs = launch(a, b, args)
        wait_for_step(tmp_path / "cut", 5)
        a.link(up=False)  # the network between the hosts goes down; both hosts live on
        cut = time.monotonic()
        ra, rb = finish(procs, timeout=90)
        took = time.monotonic() - cut
        a.link(up=True)
    print(f"cut link: both hosts out {took:.1f} s after the cut")
    assert ra.returncode != 0 and rb.returncode != 0 and took < 60, (ra.returncode, rb.returncode, took)
    assert f"lost contact with {b.addr}" in ra.stderr and f"lost contact with {a.addr}" in rb.stderr
    for r in (ra, rb):
        assert "Traceback" not in r.stderr, r.stderr[-3000:]
    newest, ran = latest(tmp_path / "cut"), max(metric_steps(tmp_path / "cut"))
    assert newest is not None and 4 <= int(newest.name.split("-")[1]) <= ran < 10, (newest, ran)
    assert verify_checkpoint(newest)["problems"] == [], verify_checkpoint(newest)


@pytest.mark.timing
def test_an_elastic_job_goes_on_alone_when_a_host_dies(tmp_path: Path, small_text: Path) -> None:
    run = tmp_path / "el"
    args = job(
        small_text,
        tmp_path,
        "el",
        12,
        "--parallel.strategy",
        "fsdp",
        "--launch.max-restarts",
        "1",
        "--launch.elastic-wait-s",
        "5",
    )
    with two_hosts() as (a, b):
        nodes = ["--parallel.nproc", "2", "--launch.nnodes", "1:2", "--launch.rdzv-endpoint", f"{a.addr}:{PORT}"]
        procs = [h.disttrain(*args, *nodes, "--launch.node-rank", str(r)) for r, h in enumerate((a, b))]
        wait_for_step(run, 6)
        b.kill_all()
        died = time.monotonic()
        ra = finish(procs[:1], timeout=200)[0]
        procs[1].communicate(timeout=30)
    assert ra.returncode == 0, ra.stderr[-3000:]
    said = "\n".join(x for x in ra.stderr.splitlines() if "hostname of the client socket" not in x)
    assert f"lost contact with {b.addr}" in said and "resuming with the nodes that are left" in said, said
    recs = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    assert sorted({r["step"] for r in recs}) == list(range(1, 13))
    restart = [json.loads(x) for x in (run / "health" / "events.jsonl").read_text().splitlines()]
    print("elastic: training again", time.monotonic() - died, "s after the host died;", restart[-3:])


@pytest.mark.timing  # the plan's samples/s against the job's
def test_doctor_across_a_slow_link_measures_it_and_ps_plan_predicts_the_ps_job_over_it(tmp_path: Path) -> None:
    """Two hosts joined by a 20 Mbit/s link (tc), each in its own PID namespace (else TensorPipe copies tensors
    between them in memory): doctor checks the rendezvous, the clocks and the links within minutes, and caches
    the RPC link and that both "nodes" share one machine; `ps --plan` for 2 nodes predicts, from it, the
    samples/s the ps job then reaches over it. The plan predicts for nodes whose cores the job has (its CPU is
    timed on the CPU clock), so the job runs ahead of whatever else this machine runs (real-time priority): on a
    busy machine it would otherwise measure the other work's share of the cores, not the plan."""
    from disttrain.jobs.ps_plan import ERROR

    caches = [tmp_path / "cache-a", tmp_path / "cache-b"]
    job = ["ps", "--train.steps", "60", "--train.eval-interval", "0", "--train.eval-samples", "1000"]
    job += ["--run.root", str(tmp_path), "--run.name", "two"]
    with two_hosts(own_pids=True) as (a, b):
        for h in (a, b):
            h.limit("20mbit")
        nodes = ["--launch.nnodes", "2", "--launch.rdzv-endpoint", f"{a.addr}:{PORT}"]
        ra, rb = finish(
            [
                h.disttrain(
                    "doctor",
                    *nodes,
                    "--launch.node-rank",
                    str(r),
                    env={"DISTTRAIN_CACHE_DIR": str(caches[r])},
                    ahead=True,
                )
                for r, h in enumerate((a, b))
            ],
            timeout=200,
        )
        assert ra.returncode == 0 and rb.returncode == 0, ra.stdout + ra.stderr[-2000:] + rb.stdout + rb.stderr[-2000:]
        lines = {x.split()[1]: x for x in ra.stdout.splitlines() if x[:4] in ("OK  ", "WARN", "FAIL")}
        assert "this node (rank 0) will host it" in lines["rendezvous"], ra.stdout
        assert "2 nodes agree within" in lines["clocks"] and lines["clocks"].startswith("OK"), ra.stdout
        assert "all-reduce across nodes" in lines["inter-node"] and lines["inter-node"].startswith("WARN"), ra.stdout
        assert f"{a.addr}:{PORT} answers" in rb.stdout and "joined the test" in rb.stdout, rb.stdout
        rate = float(lines["rpc"].split("; ")[1].split()[0])  # '... ping rank 0 -> rank 3: 0.6 ms; 2.31 MB/s one way'
        assert 1.2 < rate < 2.6 and "MB/s one way" in lines["rpc"], lines["rpc"]  # 20 Mbit/s is 2.5 MB/s
        env = {"DISTTRAIN_CACHE_DIR": str(caches[0])}
        plan = subprocess.run(
            a.cmd(str(DISTTRAIN), *job, "--plan", "--launch.nnodes", "2", ahead=True),
            env={**os.environ, **env},
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert plan.returncode == 0 and "rpc across nodes" in plan.stdout, plan.stdout + plan.stderr[-2000:]
        speed = next(x for x in plan.stdout.splitlines() if x.startswith("speed"))
        # what sets the step is the machine's to say (a busy one's compute outlasted the messages once); the
        # messages are the link's: every byte of them crosses it
        assert re.search(r"set by (messages|compute)\)", speed), plan.stdout
        assert re.search(r"messages: [\d.]+ ms per step \(([\d.]+ KiB) per step, \1 across nodes\)", plan.stdout), (
            plan.stdout
        )
        assert "2 nodes sharing this machine's" in speed, plan.stdout  # one boot id at both ends: one machine's cores
        predicted = float(speed.split("~")[1].split()[0].replace(",", ""))
        runs = finish(
            [h.disttrain(*job, *nodes, "--launch.node-rank", str(r), ahead=True) for r, h in enumerate((a, b))]
        )
    assert all(r.returncode == 0 for r in runs), runs[0].stdout + runs[0].stderr[-2000:] + runs[1].stderr[-2000:]
    recs = [json.loads(x) for x in (tmp_path / "two" / "metrics.jsonl").read_text().splitlines()]
    measured = statistics.median([r["samples_per_s"] for r in recs if "samples_per_s" in r][10:])
    print(plan.stdout, f"ps over a 20 Mbit/s link: predicted {predicted:,.0f}, measured {measured:,.0f} samples/s")
    assert abs(measured / predicted - 1) <= ERROR, (predicted, measured, plan.stdout)
