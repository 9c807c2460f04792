"""`run --k8s pytorchjob` on a simulated cluster: two network-namespace hosts play the PyTorchJob's two pods
(Master 0 and Worker 0). Each runs the manifest's container command with the manifest's variables and the ones
the Training Operator v1.9.0 injects (pkg/controller.v1/pytorch/envvar.go and master.go: MASTER_ADDR,
MASTER_PORT, WORLD_SIZE, RANK, PET_NODE_RANK, PET_NNODES, PET_NPROC_PER_NODE, ...), the master's service name
resolving to host A (``ip netns exec`` reads /etc/netns/NS/hosts), the ConfigMap mounted as a folder and the
volume a folder both hosts see. The job trains; the Worker pod is preempted as the kubelet does it (SIGTERM,
then SIGKILL after terminationGracePeriodSeconds), both pods leave a complete checkpoint, the restarted pods
resume from it, and every step's loss equals an uninterrupted run's bit for bit."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
import yaml

from disttrain.checkpoint.layout import list_checkpoints
from disttrain.testing.launch import together
from disttrain.testing.netns import Host, two_hosts, why_not
from disttrain.testing.tiny import tiny_cli_args

from conftest import disttrain, metric_steps

pytestmark = [pytest.mark.slow, pytest.mark.timing, pytest.mark.timeout(240)]
if (reason := why_not()) is not None:
    pytestmark.append(pytest.mark.skip(reason=reason))

STEPS = 24  # long enough that the SIGTERM after step 3 lands mid-run, not as the job ends


def operator_env(job: dict[str, Any], replica: str, index: int) -> dict[str, str]:
    """The variables training-operator v1.9.0 gives the pod ``replica`` ``index`` (envvar.go setPodEnv, master.go)."""
    specs = job["spec"]["pytorchReplicaSpecs"]
    pods = sum(s["replicas"] for s in specs.values())
    nproc = int(job["spec"]["nprocPerNode"])
    container = specs["Master"]["template"]["spec"]["containers"][0]
    port = next(p["containerPort"] for p in container["ports"] if p["name"] == "pytorchjob-port")
    master = f"{job['metadata']['name']}-master-0"
    rank = index + (1 if replica == "Worker" else 0)
    return {
        "PYTHONUNBUFFERED": "1",
        "MASTER_PORT": str(port),
        "PET_MASTER_PORT": str(port),
        "MASTER_ADDR": master,
        "PET_MASTER_ADDR": master,
        "WORLD_SIZE": str(pods * nproc),
        "RANK": str(rank),
        "PET_NODE_RANK": str(rank),
        "PET_NPROC_PER_NODE": str(nproc),
        "PET_NNODES": str(pods),
    }


def pod_command(job: dict[str, Any], replica: str, config_dir: Path) -> tuple[list[str], dict[str, str]]:
    """The container's disttrain arguments (the ConfigMap's mount path replaced by ``config_dir``) and its
    own variables."""
    container = job["spec"]["pytorchReplicaSpecs"][replica]["template"]["spec"]["containers"][0]
    assert container["command"] == ["disttrain"]
    args = [a.replace("/etc/disttrain", str(config_dir)) for a in container["args"]]
    return args, {e["name"]: e["value"] for e in container["env"]}


def losses(run: Path) -> dict[int, float]:
    recs = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    return {r["step"]: r["loss"] for r in recs if "loss" in r}


@contextmanager
def cluster_dns(hosts: list[Host], names: dict[str, str]) -> Iterator[None]:
    """Service names as cluster DNS resolves them, for processes started with ``ip netns exec`` (which reads
    /etc/netns/NS/hosts as /etc/hosts)."""
    lines = "127.0.0.1 localhost\n" + "".join(f"{addr} {name}\n" for name, addr in names.items())
    try:
        for h in hosts:
            (Path("/etc/netns") / h.ns).mkdir(parents=True, exist_ok=True)
            (Path("/etc/netns") / h.ns / "hosts").write_text(lines)
        yield
    finally:
        for h in hosts:
            shutil.rmtree(Path("/etc/netns") / h.ns, ignore_errors=True)


def start(job: dict[str, Any], pods: dict[str, Host], config_dir: Path) -> list[subprocess.Popen[str]]:
    """Pod 0 of each replica type on its host: the container's command, its variables and the operator's."""
    out = []
    for replica, host in pods.items():
        args, env = pod_command(job, replica, config_dir)
        out.append(host.disttrain(*args, env={**env, **operator_env(job, replica, 0)}))
    return out


def finish(procs: list[subprocess.Popen[str]], timeout: float) -> list[tuple[int, str, str]]:
    outs = [p.communicate(timeout=timeout) for p in procs]
    return [(p.returncode, out, err) for p, (out, err) in zip(procs, outs, strict=True)]


def test_a_pytorchjob_on_two_pods_trains_and_a_preempted_pod_resumes_bitwise(tmp_path: Path, small_text: Path) -> None:
    common = ["--parallel.strategy", "ddp", "--parallel.timeout-s", "20", "--metrics.progress", "off"]
    common += ["--checkpoint.interval", "100", "--launch.preempt-grace-s", "10"]
    volume = tmp_path / "volume"
    k8s = ["--k8s", "pytorchjob", "--k8s.image", "disttrain:test", "--k8s.volume", f"runs-pvc:{volume}"]
    nodes = ["--parallel.nproc", "1", "--launch.nnodes", "2"]
    job_args = tiny_cli_args(small_text, STEPS, "--run.root", str(tmp_path), "--run.name", "kj", *common, *nodes)
    made = disttrain(*job_args, *k8s)
    assert made.returncode == 0, made.stderr[-2000:]
    config_map, job = yaml.safe_load_all((tmp_path / "kj.pytorchjob.yaml").read_text())
    config_dir = tmp_path / "configmap"  # the kubelet mounts the ConfigMap: here a folder
    config_dir.mkdir()
    for name, text in config_map["data"].items():
        (config_dir / name).write_text(text)
    grace = job["spec"]["pytorchReplicaSpecs"]["Worker"]["template"]["spec"]["terminationGracePeriodSeconds"]
    run = volume / "kj"
    ref = tiny_cli_args(small_text, STEPS, "--run.root", str(tmp_path), "--run.name", "ref", *common)
    with two_hosts() as (a, b), cluster_dns([a, b], {"kj-master-0": a.addr}):
        pods = {"Master": a, "Worker": b}
        procs = start(job, pods, config_dir)
        deadline = time.monotonic() + 90
        while len(metric_steps(run)) < 3 and time.monotonic() < deadline:
            time.sleep(0.05)
        os.kill(procs[1].pid, signal.SIGTERM)  # the kubelet stops the Worker pod's container (its PID 1)
        try:
            procs[1].wait(timeout=grace)
        except subprocess.TimeoutExpired:
            b.kill_all()  # ... and kills what is left after the grace period
        first = finish(procs, timeout=60)
        last = max(metric_steps(run))
        for code, out, err in first:
            assert code == 143, (code, out[-2000:], err[-3000:])
            assert f"terminated (SIGTERM) at step {last}; newest complete checkpoint: step {last}" in err, err
        assert "in a PyTorchJob pod: node rank 1 of 2 pod(s)" in first[1][1], first[1][1]
        assert [c.step for c in list_checkpoints(run / "checkpoints") if c.usable][-1] == last
        # the operator restarts the pods (restartPolicy OnFailure): they resume from the volume; beside them, the
        # same job uninterrupted on one node with 2 ranks
        reference, again = together(
            lambda: disttrain(*ref, "--parallel.nproc", "2"), lambda: finish(start(job, pods, config_dir), 150)
        )
    assert reference.returncode == 0, reference.stderr[-3000:]
    for code, out, err in again:
        assert code == 0, (code, out[-2000:], err[-3000:])
    assert 3 <= last < STEPS and metric_steps(run) == list(range(1, STEPS + 1))  # no step lost or run twice
    assert losses(run) == losses(tmp_path / "ref")  # bit for bit
