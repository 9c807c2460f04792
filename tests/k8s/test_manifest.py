"""`run --k8s` / `launch --k8s` manifests, without processes: they fit the Training Operator's PyTorchJob CRD
(v1.9.0) and the JobSet CRD (v0.12.0), vendored in crds/; nodes and processes come from the plan, the elastic
policy from MIN:MAX, restarts, the grace period, the volume and /dev/shm; a pod reads the variables the
operators inject; bad combinations are one line, exit 2."""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Any

import pytest
import yaml
from crd_schema import schema, validate

from disttrain.cli import main
from disttrain.config import K8sConfig, LaunchConfig
from disttrain.errors import ConfigError
from disttrain.launch.k8s.env import Cluster, detect, in_cluster
from disttrain.launch.k8s.resources import GiB, plan_bytes, pod_resources
from disttrain.launch.k8s.yaml import dump
from disttrain.testing.tiny import tiny_cli_args

pytest.importorskip("jsonschema", reason="the CRD checks need jsonschema (pip install -e '.[dev]')")
pytestmark = pytest.mark.timeout(120)


def manifest(tmp: Path, data: Path, kind: str, *extra: str) -> tuple[dict[str, Any], dict[str, Any], str]:
    """(the job, the config the pods run, stdout) of `disttrain run --k8s KIND` for the tiny GPT."""
    args = tiny_cli_args(data, 10, "--run.root", str(tmp), "--run.name", "Tiny_Job", *extra)
    args += ["--k8s", kind, "--k8s.image", "ghcr.io/me/dt:1", "--k8s.volume", "runs-pvc:/mnt/runs"]
    assert main(args) == 0
    docs = list(yaml.safe_load_all((tmp / f"tiny-job.{kind}.yaml").read_text()))
    config_map, job = docs
    assert config_map["kind"] == "ConfigMap" and config_map["metadata"]["name"] == "tiny-job-config"
    validate(job)
    return job, tomllib.loads(config_map["data"]["job.toml"]), ""


def pod_spec(template: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    spec = template["spec"]
    return spec, spec["containers"][0]


def test_a_pytorchjob_fits_the_crd_and_runs_the_plan(tmp_path: Path, small_text: Path, capsys) -> None:
    nodes = ["--parallel.nproc", "2", "--launch.nnodes", "3", "--launch.max-restarts", "2"]
    job, cfg, _ = manifest(tmp_path, small_text, "pytorchjob", *nodes, "--train.global-batch", "48")
    out = capsys.readouterr().out
    assert f"kubectl apply -f {tmp_path / 'tiny-job.pytorchjob.yaml'}" in out
    spec = job["spec"]
    assert job["metadata"] == {"name": "tiny-job", "namespace": "default"}
    assert spec["nprocPerNode"] == "2" and spec["runPolicy"]["backoffLimit"] == 2 and "elasticPolicy" not in spec
    replicas = spec["pytorchReplicaSpecs"]
    assert replicas["Master"]["replicas"] == 1 and replicas["Worker"]["replicas"] == 2
    pod, container = pod_spec(replicas["Worker"]["template"])
    assert container["name"] == "pytorch" and container["image"] == "ghcr.io/me/dt:1"
    assert [container["command"], container["args"]] == [["disttrain"], ["run", "--config", "/etc/disttrain/job.toml"]]
    assert container["ports"] == [{"name": "pytorchjob-port", "containerPort": 29400}]
    # the pods' config: the plan's nodes and processes, the run folder on the volume, no rendezvous of its own
    assert cfg["launch"]["nnodes"] == "3" and cfg["parallel"]["nproc"] == 2 and cfg["launch"]["max_restarts"] == 2
    assert cfg["run"] == {"name": "tiny-job", "root": "/mnt/runs"} and "rdzv_endpoint" not in cfg["launch"]
    mounts = {m["name"]: m["mountPath"] for m in container["volumeMounts"]}
    assert mounts == {"dshm": "/dev/shm", "runs": "/mnt/runs", "config": "/etc/disttrain"}
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert volumes["runs"]["persistentVolumeClaim"] == {"claimName": "runs-pvc"}
    assert volumes["dshm"]["emptyDir"] == {"medium": "Memory", "sizeLimit": "4Gi"}  # 2 GiB per process
    assert volumes["config"]["configMap"] == {"name": "tiny-job-config"}
    # grace: the step's 30 s + the planned save (the tiny model: under a second) + the launcher's exit
    assert cfg["launch"]["preempt_grace_s"] == 31 and pod["terminationGracePeriodSeconds"] == 41
    res = container["resources"]
    assert res["requests"]["cpu"] == "2" and res["requests"]["memory"] == res["limits"]["memory"]
    assert int(res["limits"]["memory"][:-2]) >= 4 + 2  # /dev/shm + a GiB per process at least
    assert "nvidia.com/gpu" not in res["limits"]


def test_an_elastic_pytorchjob_has_the_operators_elastic_policy(tmp_path: Path, small_text: Path) -> None:
    nodes = ["--parallel.nproc", "1", "--launch.nnodes", "1:4", "--launch.max-restarts", "3", "--k8s.queue", "team-a"]
    job, cfg, _ = manifest(tmp_path, small_text, "pytorchjob", *nodes, "--train.global-batch", "32")
    spec = job["spec"]
    assert spec["elasticPolicy"] == {
        "minReplicas": 1,
        "maxReplicas": 4,
        "rdzvBackend": "c10d",
        "rdzvPort": 29400,
        "maxRestarts": 3,
    }
    assert list(spec["pytorchReplicaSpecs"]) == ["Worker"] and spec["pytorchReplicaSpecs"]["Worker"]["replicas"] == 4
    assert job["metadata"]["labels"] == {"kueue.x-k8s.io/queue-name": "team-a"}
    assert cfg["launch"]["nnodes"] == "1:4"


def test_a_jobset_fits_the_crd_with_indexed_pods_and_a_headless_service(tmp_path: Path, small_text: Path) -> None:
    nodes = ["--parallel.nproc", "2", "--launch.nnodes", "2", "--launch.max-restarts", "5"]
    job, cfg, _ = manifest(tmp_path, small_text, "jobset", *nodes, "--train.global-batch", "32")
    spec = job["spec"]
    assert spec["failurePolicy"] == {"maxRestarts": 5} and spec["network"] == {"enableDNSHostnames": True}
    (rjob,) = spec["replicatedJobs"]
    assert rjob["name"] == "node" and rjob["replicas"] == 1
    js = rjob["template"]["spec"]
    assert (js["parallelism"], js["completions"], js["completionMode"], js["backoffLimit"]) == (2, 2, "Indexed", 0)
    pod, container = pod_spec(js["template"])
    env = {e["name"]: e.get("valueFrom", {}).get("fieldRef", {}).get("fieldPath") for e in container["env"]}
    assert env["JOBSET_NAME"] == "metadata.annotations['jobset.sigs.k8s.io/jobset-name']"
    assert env["REPLICATED_JOB_NAME"] == "metadata.annotations['jobset.sigs.k8s.io/replicatedjob-name']"
    assert pod["restartPolicy"] == "Never" and pod["terminationGracePeriodSeconds"] == 41
    assert cfg["launch"]["nnodes"] == "2"


def test_the_crd_check_rejects_what_the_api_server_would(tmp_path: Path, small_text: Path) -> None:
    import jsonschema

    job, _, _ = manifest(tmp_path, small_text, "pytorchjob", "--parallel.nproc", "1", "--launch.nnodes", "2")
    job["spec"]["nprocsPerNode"] = job["spec"].pop("nprocPerNode")  # a misspelled field
    with pytest.raises(jsonschema.ValidationError):
        validate(job)
    assert "additionalProperties" in schema("JobSet")["properties"]["spec"]


def test_launch_k8s_writes_a_manifest_for_a_users_script(tmp_path: Path, capsys) -> None:
    script = tmp_path / "train.py"
    script.write_text("print('hi')\n")
    k8s = ["--k8s", "jobset", "--k8s.image", "me/img:2", "--k8s.volume", "data:/data", "--k8s.gpus-per-node", "8"]
    assert main(["launch", *k8s, "--nnodes", "2", "--max-restarts", "1", str(script), "--lr", "3"]) == 0
    (job,) = [d for d in yaml.safe_load_all((tmp_path / "train.jobset.yaml").read_text())]
    validate(job)
    _, container = pod_spec(job["spec"]["replicatedJobs"][0]["template"]["spec"]["template"])
    assert container["args"] == ["launch", "-n", "8", "--nnodes", "2", "--max-restarts", "1", str(script), "--lr", "3"]
    assert container["resources"]["limits"]["nvidia.com/gpu"] == 8 and container["resources"]["requests"]["cpu"] == "64"
    assert "kubectl apply -f" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("extra", "needle"),
    [
        (["--k8s", "pytorchjob", "--launch.nnodes", "2"], "--k8s needs --k8s.image IMAGE"),
        (["--k8s", "pytorchjob", "--k8s.image", "i", "--launch.nnodes", "2"], "needs --k8s.volume PVC:/path"),
        (["--k8s", "jobset", "--k8s.image", "i", "--k8s.volume", "runs:relative"], "k8s.volume must be PVC:/absolute"),
        (["--k8s", "jobset", "--k8s.image", "i", "--k8s.volume", "r:/r", "--launch.nnodes", "1:2"], "fixed number"),
        (["--k8s", "helm", "--k8s.image", "i"], "--k8s takes pytorchjob or jobset"),
    ],
)
def test_bad_combinations_are_one_line(tmp_path: Path, small_text: Path, capsys, extra: list[str], needle: str) -> None:
    args = tiny_cli_args(small_text, 10, "--run.root", str(tmp_path), "--parallel.nproc", "1", *extra)
    assert main(args) == 2
    err = [x for x in capsys.readouterr().err.splitlines() if x.strip()]
    assert len(err) == 1 and err[0].startswith("disttrain: error: ") and needle in err[0], err
    assert not list(tmp_path.glob("*.yaml"))


def test_pod_resources_follow_the_memory_plan() -> None:
    plan = {"strategies": {"fsdp": {"params": 10 * GiB, "optimizer": 20 * GiB, "host": 0, "total": 50 * GiB}}}
    k8s = K8sConfig(save_gbps=1.0)
    host, state = plan_bytes(plan, "fsdp", 8, "cuda")
    assert (host, state) == (8 * 30 * GiB, 8 * 30 * GiB) and plan_bytes(plan, "ddp", 8, "cuda") == (0, 0)
    res = pod_resources(k8s, nproc=8, device="cuda", preempt_grace_s=30, host_bytes=host, save_bytes=state)
    assert (res.gpus, res.cpus, res.shm) == (8, 64, 16 * GiB)
    # per rank: 4 GiB of process + the 30 GiB of state the async save stages in host memory; and /dev/shm
    assert res.memory == 8 * (4 + 30) * GiB + 16 * GiB
    assert res.save_s == -(-8 * 30 * GiB // 10**9) and res.rank_grace_s == 30 + res.save_s
    assert res.termination_grace_s == res.rank_grace_s + 10
    small_shm = K8sConfig(shm_size="1GiB")
    host, state = plan_bytes(plan, "fsdp", 2, "cpu")
    on_cpu = pod_resources(small_shm, nproc=2, device="cpu", preempt_grace_s=30, host_bytes=host, save_bytes=state)
    assert on_cpu.gpus == 0 and on_cpu.cpus == 2 and on_cpu.memory == 2 * (1 + 30 + 50) * GiB + GiB
    assert pod_resources(K8sConfig(gpus_per_node=4), nproc=4, device="cuda", preempt_grace_s=5).save_s == 0


# What the operators inject (pkg/controller.v1/pytorch/envvar.go, master.go, elastic.go of training-operator
# v1.9.0): a 3-pod PyTorchJob "tj" with nprocPerNode 2, the pod of Worker index 1 (node rank 2).
PYTORCHJOB_WORKER_1 = {
    "PYTHONUNBUFFERED": "1",
    "MASTER_PORT": "29400",
    "PET_MASTER_PORT": "29400",
    "MASTER_ADDR": "tj-master-0",
    "PET_MASTER_ADDR": "tj-master-0",
    "WORLD_SIZE": "6",
    "RANK": "2",
    "PET_NODE_RANK": "2",
    "PET_NPROC_PER_NODE": "2",
    "PET_NNODES": "3",
}
ELASTIC = {
    "PET_RDZV_ENDPOINT": "tj-worker-0:29400",
    "PET_RDZV_BACKEND": "c10d",
    "PET_NNODES": "1:4",
    "PET_MAX_RESTARTS": "3",
    "PET_NPROC_PER_NODE": "1",
}
# JobSet v0.12.0 "js": our manifest's downward-API variables; JOB_COMPLETION_INDEX from the Indexed Job.
JOBSET_POD_1 = {"JOBSET_NAME": "js", "REPLICATED_JOB_NAME": "node", "JOB_COMPLETION_INDEX": "1"}


def test_a_pod_reads_the_operators_variables() -> None:
    pt = detect(PYTORCHJOB_WORKER_1)
    assert pt == Cluster("PyTorchJob", "3", 2, "tj-master-0:29400", 2, pt.source if pt else "")
    el = detect(ELASTIC)
    assert el is not None and (el.nnodes, el.node_rank, el.rdzv_endpoint) == ("1:4", 0, "tj-worker-0:29400")
    js = detect(JOBSET_POD_1)
    assert js is not None and (js.operator, js.node_rank, js.rdzv_endpoint) == ("JobSet", 1, "js-node-0-0.js:29400")
    assert detect({**PYTORCHJOB_WORKER_1, "TORCHELASTIC_RUN_ID": "x"}) is None  # a rank, not the launcher
    assert detect({"RANK": "0", "MASTER_ADDR": "h", "MASTER_PORT": "1"}) is None  # plain torchrun: not a pod
    launch = in_cluster(LaunchConfig(nnodes="3"), pt)  # type: ignore[arg-type]
    assert (launch.nnodes, launch.node_rank, launch.rdzv_endpoint) == ("3", 2, "tj-master-0:29400")
    assert in_cluster(LaunchConfig(nnodes="2"), js).nnodes == "2"  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match=r"launch.nnodes is 2 but this PyTorchJob has 3 pod\(s\)"):
        in_cluster(LaunchConfig(nnodes="2"), pt)  # type: ignore[arg-type]
    assert "PyTorchJob pod: node rank 2 of 3 pod(s)" in pt.describe()  # type: ignore[union-attr]


def test_the_yaml_reads_back_as_written() -> None:
    doc = {
        "a": ["--config", "yes", "1", "x: y", "#c", "", "plain/path.toml", 3, True, None],
        "b": {"c": "line1\nline2\n", "d": [], "e": {}, "f": [{"g": 1, "h": [1, {"i": "j"}]}]},
        "metadata.annotations['k']": "v",
    }
    assert yaml.safe_load(dump(doc)) == doc
