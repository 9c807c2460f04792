"""A pod's requests from the memory plan: GPUs and CPUs per node, host memory per node, /dev/shm, and the grace
period a preempted pod needs to finish its step and write its checkpoint."""

from __future__ import annotations

import dataclasses
import math
from typing import Any

from disttrain.config import K8sConfig, parse_bytes

GiB = 2**30
PROCESS_BASE = {"cpu": 1 * GiB, "cuda": 4 * GiB}
"""Host memory of one rank besides its model state: Python, torch and its libraries (and on a GPU node the CUDA
context, NCCL's and the pinned staging buffers)."""
SHM_PER_PROCESS = 2 * GiB
EXIT_MARGIN_S = 10
"""After the ranks' grace: the launcher's last line and exit, before the kubelet's SIGKILL."""


@dataclasses.dataclass(frozen=True)
class PodResources:
    """What one pod (one node) asks for, and how long it gets to stop."""

    gpus: int
    cpus: int
    memory: int
    """Bytes of host memory (request = limit), /dev/shm included: a memory volume counts against the pod."""
    shm: int
    """Bytes of /dev/shm."""
    save_s: int
    """Planned time to write one node's share of a checkpoint to the volume."""
    rank_grace_s: int
    """The launcher's grace (launch.preempt_grace_s in the pod): the step's grace plus the planned save."""

    @property
    def termination_grace_s(self) -> int:
        """The pod's terminationGracePeriodSeconds: the kubelet's SIGKILL comes after the launcher's own."""
        return self.rank_grace_s + EXIT_MARGIN_S

    def requests(self) -> dict[str, Any]:
        out: dict[str, Any] = {"cpu": str(self.cpus), "memory": gib(self.memory)}
        if self.gpus:
            out["nvidia.com/gpu"] = self.gpus
        return out

    def limits(self) -> dict[str, Any]:
        out: dict[str, Any] = {"memory": gib(self.memory)}
        if self.gpus:
            out["nvidia.com/gpu"] = self.gpus
        return out


def gib(n: int) -> str:
    """Bytes as whole GiB, rounded up, as Kubernetes writes quantities ('12Gi')."""
    return f"{max(1, math.ceil(n / GiB))}Gi"


def plan_bytes(plan: dict[str, Any] | None, column: str | None, nproc: int, device: str) -> tuple[int, int]:
    """(host bytes, checkpoint bytes) of one node of ``nproc`` ranks in the memory plan's ``column`` (the strategy
    that runs; 0, 0 without a plan): the state a checkpoint holds (parameters and optimizer, fp32; what offload
    keeps in host memory) is also copied to host memory by the asynchronous save; on CPU the whole plan is host
    memory."""
    strategies = (plan or {}).get("strategies", {})
    if column not in strategies:
        return 0, 0
    s = strategies[column]
    state = int(s["params"]) + int(s["optimizer"]) + int(s.get("host", 0))
    host = state + int(s.get("host", 0)) + (int(s["total"]) if device == "cpu" else 0)
    return nproc * host, nproc * state


def pod_resources(
    k8s: K8sConfig,
    *,
    nproc: int,
    device: str,
    preempt_grace_s: int,
    host_bytes: int = 0,
    save_bytes: int = 0,
    shm_per_process: int = SHM_PER_PROCESS,
) -> PodResources:
    """One pod's requests for ``nproc`` processes on ``device``: each process's base, ``host_bytes`` more of host
    memory on the node (what the job keeps there: :func:`plan_bytes` for ``run``, the tables for ``ps``, the
    replay for ``rl``) and /dev/shm; the grace period adds the planned time to write ``save_bytes`` (the node's
    share of a checkpoint written when the pod is stopped). /dev/shm: ``k8s.shm_size``, or (auto) ``shm_per_process``
    per process; whole GiB, as its volume's size limit is written."""
    gpus = k8s.gpus_per_node if k8s.gpus_per_node is not None else (nproc if device == "cuda" else 0)
    cpus = k8s.cpus_per_node or (8 * gpus if gpus else nproc)
    shm = shm_per_process * nproc if k8s.shm_size == "auto" else parse_bytes(k8s.shm_size, "k8s.shm_size")
    shm = GiB * max(1, math.ceil(shm / GiB))
    memory = nproc * PROCESS_BASE.get(device, PROCESS_BASE["cpu"]) + host_bytes + shm
    save_s = math.ceil(save_bytes / (k8s.save_gbps * 1e9))
    return PodResources(gpus, cpus, memory, shm, save_s, preempt_grace_s + save_s)
