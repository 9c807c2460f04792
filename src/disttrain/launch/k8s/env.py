"""Inside a pod: which operator started it, and what that says about the job's nodes.

The names are the operators' own, read from their sources:

- Kubeflow Training Operator v1.9.0 (github.com/kubeflow/training-operator, tag v1.9.0),
  ``pkg/controller.v1/pytorch/envvar.go``, ``master.go`` and ``elastic.go``: with a Master replica every pod
  gets ``MASTER_ADDR`` (``<job>-master-0``, the master's service), ``MASTER_PORT`` (the container port named
  ``pytorchjob-port``), ``PET_MASTER_ADDR`` / ``PET_MASTER_PORT``, ``WORLD_SIZE`` (pods x nprocPerNode),
  ``RANK`` and ``PET_NODE_RANK`` (the pod's index: master 0, worker i -> i + 1); ``PET_NPROC_PER_NODE`` from
  ``spec.nprocPerNode``; ``PET_NNODES`` (the number of pods, or ``MIN:MAX`` with an elastic policy). With an
  elastic policy: ``PET_RDZV_ENDPOINT`` (``<job>-worker-0:<rdzvPort>``), ``PET_RDZV_BACKEND``,
  ``PET_MAX_RESTARTS``, ``PET_RDZV_ID`` (and no rank: the c10d rendezvous numbers the nodes).
- JobSet v0.12.0 (github.com/kubernetes-sigs/jobset, tag v0.12.0) injects no variables into the main
  container; it annotates each pod (``api/jobset/v1alpha2/jobset_types.go``: ``jobset.sigs.k8s.io/jobset-name``,
  ``jobset.sigs.k8s.io/replicatedjob-name``) and names it ``<jobset>-<replicatedjob>-<job index>-<pod index>``
  under a headless service named after the JobSet (``spec.network.subdomain``); the Job controller of an
  Indexed Job sets ``JOB_COMPLETION_INDEX``. Our manifest passes the two annotations in as ``JOBSET_NAME`` and
  ``REPLICATED_JOB_NAME`` (the downward API; ``JOBSET_NAME`` is also what JobSet's in-place-restart agent reads).
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping

from disttrain.config import LaunchConfig
from disttrain.errors import ConfigError

RDZV_PORT = 29400
"""The c10d rendezvous port of a JobSet (the PyTorchJob's is its ``pytorchjob-port``); DISTTRAIN_RDZV_PORT wins."""


@dataclasses.dataclass(frozen=True)
class Cluster:
    """What the operator's variables say about this pod's place in the job."""

    operator: str
    """'PyTorchJob' or 'JobSet'."""
    nnodes: str
    """Pods (N, or MIN:MAX for an elastic PyTorchJob); '' when the variables do not say (JobSet)."""
    node_rank: int
    """This pod's node rank (0 in an elastic job: the rendezvous numbers the nodes)."""
    rdzv_endpoint: str
    """host:port of the c10d rendezvous (the master's service, or pod 0's name in the headless service)."""
    nproc: int | None
    """Processes per pod, when the operator says."""
    source: str
    """The variables it was read from, for doctor and the launcher's first line."""

    def describe(self) -> str:
        nodes = f"{self.nnodes} pod(s)" if self.nnodes else "pods"
        return (
            f"a {self.operator} pod: node rank {self.node_rank} of {nodes}, rendezvous at {self.rdzv_endpoint} "
            f"(from {self.source})"
        )


def _int(env: Mapping[str, str], name: str) -> int:
    value = env[name]
    if not value.isdigit():
        raise ConfigError(f"{name}={value!r} in this pod's environment is not a number; the operator sets it")
    return int(value)


def detect(env: Mapping[str, str] | None = None) -> Cluster | None:
    """The operator that started this pod, from ``env`` (default: this process's); None outside one, and in
    a worker that torchrun started (TORCHELASTIC_RUN_ID): the launcher reads the variables, its ranks do not."""
    env = os.environ if env is None else env
    if "TORCHELASTIC_RUN_ID" in env:
        return None
    nproc = _int(env, "PET_NPROC_PER_NODE") if env.get("PET_NPROC_PER_NODE", "").isdigit() else None
    if "PET_NNODES" in env and "PET_RDZV_ENDPOINT" in env:  # elastic PyTorchJob
        return Cluster(
            "PyTorchJob", env["PET_NNODES"], 0, env["PET_RDZV_ENDPOINT"], nproc, "PET_RDZV_ENDPOINT, PET_NNODES"
        )
    if "PET_NNODES" in env and "MASTER_ADDR" in env and "MASTER_PORT" in env:
        rank = _int(env, "PET_NODE_RANK" if "PET_NODE_RANK" in env else "RANK")
        endpoint = f"{env['MASTER_ADDR']}:{_int(env, 'MASTER_PORT')}"
        return Cluster(
            "PyTorchJob",
            env["PET_NNODES"],
            rank,
            endpoint,
            nproc,
            "MASTER_ADDR, MASTER_PORT, PET_NODE_RANK, PET_NNODES",
        )
    if "JOBSET_NAME" in env and "JOB_COMPLETION_INDEX" in env:
        name, rjob = env["JOBSET_NAME"], env.get("REPLICATED_JOB_NAME", "node")
        port = _int(env, "DISTTRAIN_RDZV_PORT") if "DISTTRAIN_RDZV_PORT" in env else RDZV_PORT
        # pod 0 of job 0 of the replicated job, in the JobSet's headless service (its subdomain)
        host = f"{name}-{rjob}-0-0.{name}"
        rank = _int(env, "JOB_COMPLETION_INDEX")
        return Cluster(
            "JobSet", "", rank, f"{host}:{port}", None, "JOBSET_NAME, REPLICATED_JOB_NAME, JOB_COMPLETION_INDEX"
        )
    return None


def in_cluster(launch: LaunchConfig, cluster: Cluster) -> LaunchConfig:
    """``launch`` with what the operator says filled in: the node rank and the rendezvous (where the config
    names none), the number of nodes (which must agree with the config's unless that is the default, 1)."""
    if cluster.nnodes and launch.nnodes not in ("1", cluster.nnodes):
        raise ConfigError(
            f"launch.nnodes is {launch.nnodes} but this {cluster.operator} has {cluster.nnodes} pod(s) "
            f"(PET_NNODES): write the manifest again with --k8s, or set --launch.nnodes {cluster.nnodes}"
        )
    return dataclasses.replace(
        launch,
        nnodes=cluster.nnodes or launch.nnodes,
        node_rank=cluster.node_rank,
        rdzv_endpoint=launch.rdzv_endpoint or cluster.rdzv_endpoint,
    )


def from_pod(launch: LaunchConfig, nproc: int | None) -> tuple[LaunchConfig, int | None, Cluster | None]:
    """The launch section and processes per node as this pod's operator sets them (unchanged outside a pod),
    and the operator found; the launcher's first line says which."""
    cluster = detect()
    if cluster is None:
        return launch, nproc, None
    print(f"disttrain: in {cluster.describe()}", flush=True)
    return in_cluster(launch, cluster), nproc or cluster.nproc, cluster
