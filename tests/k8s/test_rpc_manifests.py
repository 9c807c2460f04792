"""`ps --k8s` / `rl --k8s` manifests, without processes: they fit the vendored CRDs, run the command's own
launcher on the job's config (the ConfigMap), one pod per node with the processes the job spreads over them;
memory counts the servers' shards (ps) or the replay (rl); what an RPC group's fixed size rules out is one
line, exit 2; inside a pod the ps and rl launchers take their node rank and rendezvous from the operator."""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Any

import pytest
import yaml
from crd_schema import validate

from disttrain.cli import main
from disttrain.config import K8sConfig, load_toml
from disttrain.jobs.k8s_rpc import RPC_SHM_PER_PROCESS, TRANSITION_SCALARS, ps_node_bytes, replay_bytes
from disttrain.launch.k8s.resources import GiB, pod_resources
from disttrain.ps.config import PSCheckpointConfig, PSConfig, PSJobConfig
from disttrain.ps.plan import server_bytes
from disttrain.rl.config import RLConfig, RLJobConfig
from disttrain.rl.envs import EnvSpec

pytest.importorskip("jsonschema", reason="the CRD checks need jsonschema (pip install -e '.[dev]')")
pytestmark = pytest.mark.timeout(60)

K8S = ["--k8s.image", "ghcr.io/me/dt:1", "--k8s.volume", "runs-pvc:/mnt/runs"]
# the PyTorchJob "tj" of test_manifest.py: the pod of Worker 1 (node rank 2 of 3), 2 processes per pod
WORKER_1 = {
    "MASTER_PORT": "29400",
    "MASTER_ADDR": "tj-master-0",
    "WORLD_SIZE": "6",
    "RANK": "2",
    "PET_NODE_RANK": "2",
    "PET_NPROC_PER_NODE": "2",
    "PET_NNODES": "3",
}


def written(tmp: Path, command: str, kind: str, *extra: str) -> tuple[dict[str, Any], str]:
    """(the job, the config the pods run) of `disttrain COMMAND --k8s KIND` named 'Big_One'."""
    args = [command, "--run.root", str(tmp), "--run.name", "Big_One", *extra, "--k8s", kind, *K8S]
    assert main(args) == 0
    config_map, job = yaml.safe_load_all((tmp / f"big-one.{kind}.yaml").read_text())
    assert config_map["kind"] == "ConfigMap" and config_map["metadata"]["name"] == "big-one-config"
    validate(job)
    return job, config_map["data"]["job.toml"]


def containers(job: dict[str, Any]) -> list[tuple[dict[str, Any], dict[str, Any]]]:
    """(pod spec, container) of every pod template."""
    if job["kind"] == "PyTorchJob":
        templates = [r["template"] for r in job["spec"]["pytorchReplicaSpecs"].values()]
    else:
        templates = [job["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]]
    return [(t["spec"], t["spec"]["containers"][0]) for t in templates]


def test_ps_writes_a_pytorchjob_of_its_trainers_and_servers(tmp_path: Path, capsys) -> None:
    ps = ["--ps.trainers", "4", "--ps.servers", "2", "--ps.colocate", "off", "--ps.tables", "100000", "3000"]
    nodes = ["--launch.nnodes", "2", "--launch.max-restarts", "3", "--checkpoint.interval", "50"]
    job, toml = written(tmp_path, "ps", "pytorchjob", *ps, *nodes)
    assert "kubectl apply -f" in capsys.readouterr().out
    spec = job["spec"]
    assert spec["nprocPerNode"] == "3" and spec["runPolicy"]["backoffLimit"] == 3  # 6 processes over 2 pods
    replicas = spec["pytorchReplicaSpecs"]
    assert (replicas["Master"]["replicas"], replicas["Worker"]["replicas"]) == (1, 1)
    assert {r["restartPolicy"] for r in replicas.values()} == {"OnFailure"}  # torchrun's agents take a pod back
    for pod, container in containers(job):
        assert container["args"] == ["ps", "--config", "/etc/disttrain/job.toml"]
        mounts = {m["name"]: m["mountPath"] for m in container["volumeMounts"]}
        assert mounts == {"dshm": "/dev/shm", "runs": "/mnt/runs", "config": "/etc/disttrain"}
        assert pod["terminationGracePeriodSeconds"] == 30 + 10  # no save when stopped: the grace and the exit
        dshm = next(v for v in pod["volumes"] if v["name"] == "dshm")
        assert dshm["emptyDir"] == {"medium": "Memory", "sizeLimit": "1Gi"}  # 3 x 256 MiB: TensorPipe's rings
    # the pods' config loads as the ps job: the run named and on the volume, no node rank or rendezvous of its own
    path = tmp_path / "pod.toml"
    path.write_text(toml)
    cfg = load_toml(str(path), job=PSJobConfig)
    assert (cfg.run.name, cfg.run.root, cfg.launch.nnodes, cfg.launch.rdzv_endpoint) == (
        "big-one",
        "/mnt/runs",
        "2",
        None,
    )
    assert (cfg.ps.trainers, cfg.checkpoint.interval, cfg.launch.max_restarts) == (4, 50, 3)
    # memory: node 1 holds trainer 3 and both servers, each shard twice (a resumed server loads its checkpoint whole)
    shards = sum(b for _, b in server_bytes(cfg.ps))
    assert ps_node_bytes(cfg, 3) == 2 * shards
    expect = pod_resources(
        K8sConfig(),
        nproc=3,
        device="cpu",
        preempt_grace_s=30,
        host_bytes=2 * shards,
        shm_per_process=RPC_SHM_PER_PROCESS,
    )
    limits = containers(job)[0][1]["resources"]["limits"]
    assert limits == {"memory": f"{-(-expect.memory // GiB)}Gi"}


def test_ps_with_spare_servers_restarts_as_a_whole_jobset(tmp_path: Path) -> None:
    ps = ["--ps.colocate", "off", "--ps.spare-servers", "2", "--checkpoint.interval", "20"]
    job, _ = written(tmp_path, "ps", "jobset", *ps, "--launch.nnodes", "3", "--launch.max-restarts", "2")
    assert job["spec"]["failurePolicy"] == {"maxRestarts": 2}
    js = job["spec"]["replicatedJobs"][0]["template"]["spec"]
    assert js["parallelism"] == 3 and js["template"]["spec"]["restartPolicy"] == "Never"  # 6 processes, 2 a pod
    # as a PyTorchJob without restarts: its pods do not restart alone either
    job, _ = written(tmp_path, "ps", "pytorchjob", *ps, "--launch.nnodes", "3")
    assert {r["restartPolicy"] for r in job["spec"]["pytorchReplicaSpecs"].values()} == {"Never"}


def test_ps_node_memory_counts_the_shards_spares_and_caches() -> None:
    shard = 500 * 8 * 4 * 2  # 1000 rows over 2 servers, 8 fp32 numbers a row and Adagrad's sums
    cache = 1000 * 13 + 100 * (2 * 8 * 4 + 16)  # per trainer: per row counts and slots; per cached row values, sums
    own = PSConfig(trainers=2, servers=2, colocate="off", spare_servers=1, tables=(1000,), dim=8, cache_rows=100)
    one_node = PSJobConfig(ps=own, checkpoint=PSCheckpointConfig(interval=10))
    assert ps_node_bytes(one_node, 5) == 2 * cache + 2 * 3 * shard  # 2 servers and a spare, each twice
    colocated = PSJobConfig(ps=PSConfig(trainers=2, servers=2, tables=(1000,), dim=8))
    assert ps_node_bytes(colocated, 1) == 2 * shard  # one pod a trainer with its server


def test_rl_writes_a_jobset_with_the_replay_on_every_pod(tmp_path: Path) -> None:
    rl = ["--rl.actors", "5", "--rl.replay-capacity", "200000", "--rl.prioritized"]
    job, toml = written(tmp_path, "rl", "jobset", *rl, "--launch.nnodes", "3", "--launch.max-restarts", "4")
    assert job["spec"]["failurePolicy"] == {"maxRestarts": 4}
    js = job["spec"]["replicatedJobs"][0]["template"]["spec"]
    assert js["parallelism"] == 3
    ((pod, container),) = containers(job)
    assert container["args"] == ["rl", "--config", "/etc/disttrain/job.toml"]
    assert pod["restartPolicy"] == "Never" and pod["terminationGracePeriodSeconds"] == 40
    path = tmp_path / "pod.toml"
    path.write_text(toml)
    cfg = load_toml(str(path), job=RLJobConfig)
    assert (cfg.run.name, cfg.run.root, cfg.launch.nnodes, cfg.rl.actors) == ("big-one", "/mnt/runs", "3", 5)
    # CartPole: 4 float32 numbers an observation; the sum tree: 2 x 262144 leaves' float64 nodes
    replay = 200_000 * (2 * 4 * 4 + TRANSITION_SCALARS) + 2 * 262_144 * 8
    assert replay_bytes(cfg, EnvSpec(4, 2)) == replay
    expect = pod_resources(
        K8sConfig(),
        nproc=2,
        device="cpu",
        preempt_grace_s=30,
        host_bytes=2 * replay,
        shm_per_process=RPC_SHM_PER_PROCESS,
    )
    assert container["resources"]["requests"] == {"cpu": "2", "memory": f"{-(-expect.memory // GiB)}Gi"}


def test_rl_replay_bytes_by_observation_kind() -> None:
    frames = EnvSpec(4 * 84 * 84, 6, (4, 84, 84), "uint8")
    atari = RLJobConfig(rl=RLConfig(env_id="ALE/Pong-v5"))
    assert replay_bytes(atari, frames) == 20_000 * (2 * 28_224 + 20)  # the frames' default capacity, uint8
    reinforce = RLJobConfig(rl=RLConfig(algo="reinforce"))
    assert replay_bytes(reinforce, EnvSpec(4, 2)) == 0  # no replay


@pytest.mark.parametrize(
    ("argv", "needle"),
    [
        (["ps", "--launch.nnodes", "1:2", "--k8s", "pytorchjob", *K8S], "fixed when it starts: launch.nnodes must"),
        (["ps", "--ps.trainers", "3", "--ps.servers", "3", "--launch.nnodes", "2", "--k8s", "jobset", *K8S], "divide"),
        (["rl", "--launch.nnodes", "1:4", "--k8s", "pytorchjob", *K8S], "(MIN:MAX is for elastic training jobs)"),
        (["rl", "--launch.nnodes", "2", "--launch.max-restarts", "1", "--k8s", "pytorchjob", *K8S], "use --k8s jobset"),
        (
            [
                "ps",
                "--ps.mode",
                "asp",
                "--ps.colocate",
                "off",
                "--launch.max-restarts",
                "1",
                "--k8s",
                "pytorchjob",
                *K8S,
            ],
            "disttrain ps with spare servers or asp trainers on a PyTorchJob",
        ),
        (["rl", "--launch.nnodes", "2", "--k8s", "jobset", "--k8s.image", "i"], "needs --k8s.volume PVC:/path"),
        (["ps", "--k8s", "jobset"], "--k8s needs --k8s.image IMAGE"),
        (["rl", "--rl.env-id", "Nope-v0", "--k8s", "jobset", "--k8s.image", "i"], "rl.env_id 'Nope-v0'"),
        (["rl", "--k8s", "helm", "--k8s.image", "i"], "--k8s takes pytorchjob or jobset"),
    ],
)
def test_what_a_fixed_rpc_group_rules_out_is_one_line(tmp_path: Path, capsys, argv: list[str], needle: str) -> None:
    assert main([*argv, "--run.root", str(tmp_path)]) == 2
    err = [x for x in capsys.readouterr().err.splitlines() if x.strip()]
    assert len(err) == 1 and err[0].startswith("disttrain: error: ") and needle in err[0], err
    assert not list(tmp_path.glob("*.yaml"))


def test_in_a_pod_ps_and_rl_take_their_node_from_the_operator(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys
) -> None:
    """The pods' command has no node options: the launchers read them (nothing is started here)."""
    from disttrain.jobs import ps as ps_job
    from disttrain.jobs import rl as rl_job

    for k, v in WORKER_1.items():
        monkeypatch.setenv(k, v)
    monkeypatch.delenv("TORCHELASTIC_RUN_ID", raising=False)
    monkeypatch.setenv("TORCH_CPP_LOG_LEVEL", "ERROR")  # launch_ps sets it (setdefault): restored after the test
    seen: dict[str, Any] = {}
    monkeypatch.setattr(ps_job, "torchrun_argv", lambda nproc, launch, **_: seen.update(ps=(nproc, launch)) or [])
    monkeypatch.setattr(ps_job, "run_torchrun", lambda *a, **k: 0)
    monkeypatch.setattr(ps_job, "watch_frozen", lambda *a: contextlib.nullcontext())
    cfg = PSJobConfig(ps=PSConfig(trainers=6, servers=6))
    cfg.run.root, cfg.launch.nnodes = str(tmp_path), "3"
    assert ps_job.launch_ps(cfg) == 0
    nproc, launch = seen["ps"]
    assert (nproc, launch.nnodes, launch.node_rank, launch.rdzv_endpoint) == (2, "3", 2, "tj-master-0:29400")

    started: list[tuple[int, int, str, int]] = []
    monkeypatch.setattr(rl_job, "start", lambda m, r, w, h, p, *a: started.append((r, w, h, p)))
    monkeypatch.setattr(rl_job, "run_watched", lambda *a: 0)
    rl = RLJobConfig(rl=RLConfig(actors=5))
    rl.run.root, rl.launch.nnodes = str(tmp_path), "3"
    assert rl_job.launch_rl(rl) == 0
    assert started == [(4, 6, "tj-master-0", 29400), (5, 6, "tj-master-0", 29400)]  # node 2's two actors
    assert "disttrain: in a PyTorchJob pod: node rank 2 of 3 pod(s)" in capsys.readouterr().out


@pytest.mark.timing
def test_a_stopped_pods_rpc_launcher_stops_its_workers_at_once(tmp_path: Path) -> None:
    """The kubelet's SIGTERM to the container's first process, the ps / rl launcher (`run_watched`): its workers
    get SIGTERM, it exits 143 with one line, within seconds instead of the grace period."""
    import os
    import signal
    import subprocess
    import sys
    import threading
    import time

    from disttrain.config import HealthConfig
    from disttrain.launch.direct import run_watched

    procs = {r: subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"]) for r in range(2)}

    def watch() -> int:
        while True:
            time.sleep(0.05)

    before = signal.getsignal(signal.SIGTERM)
    threading.Timer(0.5, os.kill, (os.getpid(), signal.SIGTERM)).start()
    t0 = time.monotonic()
    code = run_watched(procs, HealthConfig(enabled=False), tmp_path, 0, watch)
    assert code == 143 and time.monotonic() - t0 < 10
    assert [p.poll() for p in procs.values()] == [-signal.SIGTERM, -signal.SIGTERM]
    assert signal.getsignal(signal.SIGTERM) is before  # the launcher's handler lasts as long as its watch
