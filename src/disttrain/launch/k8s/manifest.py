"""The manifests: a Kubeflow Training Operator ``PyTorchJob`` (kubeflow.org/v1) or a ``JobSet``
(jobset.x-k8s.io/v1alpha2), one pod per node, each running one disttrain launcher (a torchrun agent) that
finds its node rank and the rendezvous in the operator's variables (:mod:`disttrain.launch.k8s.env`).

A ``run``, ``ps`` or ``rl`` job's config travels as a ConfigMap beside the job, mounted at :data:`CONFIG_DIR`.
The run folder is on the volume (a rescheduled pod resumes from its checkpoints), /dev/shm is a memory volume
(the data loader's and NCCL's shared memory), and the grace period covers the step, the save and the launcher's
exit.
"""

from __future__ import annotations

import dataclasses
import re
import time
from pathlib import Path
from typing import Any

from disttrain.config.k8s import volume_parts
from disttrain.errors import ConfigError
from disttrain.launch.k8s.env import RDZV_PORT
from disttrain.launch.k8s.resources import PodResources, gib
from disttrain.launch.k8s.yaml import dump_all

KINDS = ("pytorchjob", "jobset")
CONFIG_DIR = "/etc/disttrain"
CONFIG_FILE = "job.toml"
CONTAINER = "pytorch"
"""The container name PyTorchJob requires (``PyTorchJobDefaultContainerName``)."""
PORT_NAME = "pytorchjob-port"
"""The port the operator reads MASTER_PORT from (``PyTorchJobDefaultPortName``)."""
REPLICATED_JOB = "node"
QUEUE_LABEL = "kueue.x-k8s.io/queue-name"


@dataclasses.dataclass(frozen=True)
class JobShape:
    """Everything a manifest says, decided before it is written."""

    name: str
    namespace: str
    image: str
    args: list[str]
    """The container's ``disttrain`` arguments."""
    nnodes: str
    """Pods: N, or MIN:MAX (an elastic PyTorchJob)."""
    nproc: int
    max_restarts: int
    resources: PodResources
    volume: str | None
    """PVC:/path, or None (one node: the pod's own disk)."""
    config_toml: str | None = None
    """The job's config, as a ConfigMap mounted at CONFIG_DIR (``run``); None for ``launch``."""
    queue: str | None = None
    pod_restarts: bool = True
    """Whether a failed pod may restart alone (a PyTorchJob's ``OnFailure``): its launcher rejoins the others in
    torchrun's rendezvous. False for a job whose launcher starts a fixed RPC group itself (``rl``, ``ps`` with
    spares or asp), which a lone restarted pod cannot rejoin: such a PyTorchJob's pods do not restart
    (``Never``); a JobSet restarts every pod together either way."""


def job_name(name: str | None) -> str:
    """A name Kubernetes takes for the job (a DNS-1035 label, short enough for the pods' names): ``name``
    lowercased with other characters as '-', or one from the time."""
    base = name or time.strftime("disttrain-%Y%m%d-%H%M%S")
    out = re.sub(r"[^a-z0-9-]+", "-", base.lower()).strip("-")[:40].rstrip("-")
    return out if out[:1].isalpha() else f"dt-{out}".rstrip("-")


def _volumes(shape: JobShape) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    mounts: list[dict[str, Any]] = [{"name": "dshm", "mountPath": "/dev/shm"}]
    vols: list[dict[str, Any]] = [
        {"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": gib(shape.resources.shm)}}
    ]
    if shape.volume is not None:
        claim, path = volume_parts(shape.volume)
        mounts.append({"name": "runs", "mountPath": path})
        vols.append({"name": "runs", "persistentVolumeClaim": {"claimName": claim}})
    if shape.config_toml is not None:
        mounts.append({"name": "config", "mountPath": CONFIG_DIR, "readOnly": True})
        vols.append({"name": "config", "configMap": {"name": f"{shape.name}-config"}})
    return mounts, vols


def pod_template(shape: JobShape, env: list[dict[str, Any]]) -> dict[str, Any]:
    mounts, vols = _volumes(shape)
    res = shape.resources
    container = {
        "name": CONTAINER,
        "image": shape.image,
        "command": ["disttrain"],
        "args": shape.args,
        "env": [{"name": "DISTTRAIN_RDZV_ID", "value": shape.name}, *env],
        "ports": [{"name": PORT_NAME, "containerPort": RDZV_PORT}],
        "resources": {"requests": res.requests(), "limits": res.limits()},
        "volumeMounts": mounts,
    }
    spec: dict[str, Any] = {
        "terminationGracePeriodSeconds": res.termination_grace_s,
        "containers": [container],
        "volumes": vols,
    }
    return {"spec": spec}


def _metadata(shape: JobShape) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": shape.name, "namespace": shape.namespace}
    if shape.queue:
        meta["labels"] = {QUEUE_LABEL: shape.queue}
    return meta


def _config_map(shape: JobShape) -> list[dict[str, Any]]:
    if shape.config_toml is None:
        return []
    meta = {"name": f"{shape.name}-config", "namespace": shape.namespace}
    return [{"apiVersion": "v1", "kind": "ConfigMap", "metadata": meta, "data": {CONFIG_FILE: shape.config_toml}}]


def pytorchjob(shape: JobShape) -> list[dict[str, Any]]:
    """A PyTorchJob: N fixed nodes as a Master (node 0, whose service ``<name>-master-0`` hosts the c10d
    rendezvous on MASTER_PORT) and N - 1 Workers; MIN:MAX nodes as MAX Workers under an elastic policy (the
    rendezvous on ``<name>-worker-0``). Restarts: the operator's backoff limit (and the elastic policy's
    maxRestarts, torchrun's inside each pod); none for a job whose pods cannot restart alone."""
    template = pod_template(shape, [])
    policy = "OnFailure" if shape.pod_restarts else "Never"

    def replicas(n: int) -> dict[str, Any]:
        return {"replicas": n, "restartPolicy": policy, "template": template}

    spec: dict[str, Any] = {"runPolicy": {"backoffLimit": shape.max_restarts}, "nprocPerNode": str(shape.nproc)}
    if ":" in shape.nnodes:
        low, high = (int(x) for x in shape.nnodes.split(":"))
        spec["elasticPolicy"] = {
            "minReplicas": low,
            "maxReplicas": high,
            "rdzvBackend": "c10d",
            "rdzvPort": RDZV_PORT,
            "maxRestarts": shape.max_restarts,
        }
        spec["pytorchReplicaSpecs"] = {"Worker": replicas(high)}
    else:
        n = int(shape.nnodes)
        spec["pytorchReplicaSpecs"] = {"Master": replicas(1), **({"Worker": replicas(n - 1)} if n > 1 else {})}
    job = {"apiVersion": "kubeflow.org/v1", "kind": "PyTorchJob", "metadata": _metadata(shape), "spec": spec}
    return [*_config_map(shape), job]


def jobset(shape: JobShape) -> list[dict[str, Any]]:
    """A JobSet: one replicated Job of N indexed pods (node rank = JOB_COMPLETION_INDEX), the rendezvous on pod
    0 in the JobSet's headless service (``<name>-node-0-0.<name>``); a failed pod restarts the whole set, up to
    launch.max_restarts times (failurePolicy)."""
    if ":" in shape.nnodes:
        raise ConfigError(
            f"launch.nnodes {shape.nnodes!r}: a JobSet has a fixed number of pods; use --k8s pytorchjob for an "
            "elastic job (its elastic policy), or a fixed --launch.nnodes"
        )
    n = int(shape.nnodes)
    annotation = "metadata.annotations['jobset.sigs.k8s.io/{}']"
    env = [
        {"name": "JOBSET_NAME", "valueFrom": {"fieldRef": {"fieldPath": annotation.format("jobset-name")}}},
        {
            "name": "REPLICATED_JOB_NAME",
            "valueFrom": {"fieldRef": {"fieldPath": annotation.format("replicatedjob-name")}},
        },
    ]
    template = pod_template(shape, env)
    template["spec"]["restartPolicy"] = "Never"  # a failure restarts the whole set: the nodes rendezvous again
    job_spec = {
        "parallelism": n,
        "completions": n,
        "completionMode": "Indexed",
        "backoffLimit": 0,
        "template": template,
    }
    spec = {
        "failurePolicy": {"maxRestarts": shape.max_restarts},
        "network": {"enableDNSHostnames": True},
        "replicatedJobs": [{"name": REPLICATED_JOB, "replicas": 1, "template": {"spec": job_spec}}],
    }
    job = {"apiVersion": "jobset.x-k8s.io/v1alpha2", "kind": "JobSet", "metadata": _metadata(shape), "spec": spec}
    return [*_config_map(shape), job]


def manifest(kind: str, shape: JobShape) -> list[dict[str, Any]]:
    if kind not in KINDS:
        raise ConfigError(f"--k8s takes {' or '.join(KINDS)}, got {kind!r}")
    return pytorchjob(shape) if kind == "pytorchjob" else jobset(shape)


def write_manifest(path: Path, docs: list[dict[str, Any]]) -> str:
    """Write the manifest; the line that tells the user how to submit it."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(dump_all(docs))
    return f"wrote {path}; submit it with: kubectl apply -f {path}"
