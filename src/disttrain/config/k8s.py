"""The k8s section: what ``disttrain run|ps|rl --k8s pytorchjob|jobset`` (and ``launch --k8s``) needs beyond the job
itself to write a Kubernetes manifest: the image, where the run folder lives, the namespace, the queue, GPUs and
CPUs."""

from __future__ import annotations

import dataclasses
import re

from disttrain.config.values import check, parse_bytes

_DNS_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?")


def volume_parts(volume: str) -> tuple[str, str]:
    """'runs-pvc:/runs' -> ('runs-pvc', '/runs'): the PersistentVolumeClaim and where it is mounted."""
    claim, sep, path = volume.partition(":")
    check(
        bool(sep) and _DNS_LABEL.fullmatch(claim) is not None and path.startswith("/") and path != "/",
        f"k8s.volume must be PVC:/absolute/path (a PersistentVolumeClaim in lowercase letters, digits and '-', "
        f"and where the pods mount it), got {volume!r}; e.g. --k8s.volume runs-pvc:/runs",
    )
    return claim, path.rstrip("/")


@dataclasses.dataclass
class K8sConfig:
    """Kubernetes manifests (``--k8s pytorchjob|jobset``): one pod per node."""

    image: str | None = None
    """Container image with disttrain (and your code) installed; required with --k8s."""
    namespace: str = "default"
    """Namespace of the job."""
    volume: str | None = None
    """PVC:/path: a PersistentVolumeClaim every pod mounts at /path, holding the run folders and checkpoints (a
    rescheduled pod resumes from there); required for more than one node (default for one node: the pod's own
    disk, lost with the pod)."""
    gpus_per_node: int | None = None
    """GPUs each pod asks for (nvidia.com/gpu; default: parallel.nproc on cuda, 0 on cpu)."""
    cpus_per_node: int | None = None
    """CPUs each pod asks for (default: one per process on cpu, 8 per GPU)."""
    queue: str | None = None
    """Kueue LocalQueue to submit to (the kueue.x-k8s.io/queue-name label); none: straight to the scheduler."""
    shm_size: str = "auto"
    """Size of /dev/shm (a memory volume, counted in the pod's memory) for the data loader and NCCL
    (auto: 2 GiB per process; ps and rl: 256 MiB, for RPC's shared-memory transport)."""
    save_gbps: float = 0.5
    """Write rate of the volume in GB/s, for the planned save time that the grace period adds to
    launch.preempt_grace_s."""

    def __post_init__(self) -> None:
        check(
            _DNS_LABEL.fullmatch(self.namespace) is not None,
            f"k8s.namespace must be a DNS label (lowercase letters, digits, '-'), got {self.namespace!r}",
        )
        if self.volume is not None:
            volume_parts(self.volume)
        for key in ("gpus_per_node", "cpus_per_node"):
            v = getattr(self, key)
            check(v is None or v >= 0, f"k8s.{key} must be >= 0, got {v}")
        if self.queue is not None:
            check(
                _DNS_LABEL.fullmatch(self.queue) is not None,
                f"k8s.queue must be a Kueue LocalQueue name (lowercase letters, digits, '-'), got {self.queue!r}",
            )
        if self.shm_size != "auto":
            parse_bytes(self.shm_size, "k8s.shm_size")
        check(self.save_gbps > 0, f"k8s.save_gbps must be > 0, got {self.save_gbps}")
