"""``disttrain run --k8s KIND`` and ``disttrain launch --k8s KIND``: the job resolved here once (nodes,
processes per node, the memory plan), turned into one pod's requests and grace period, written as a
PyTorchJob or JobSet manifest (:mod:`disttrain.launch.k8s.manifest`) with the line that submits it.
:func:`write_pods` is the one writer every command's manifest goes through (``ps`` and ``rl``:
:mod:`disttrain.jobs.k8s_rpc`)."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any, TypeVar

from disttrain.config import JobConfig, K8sConfig, LaunchConfig, to_toml
from disttrain.errors import ConfigError
from disttrain.launch.k8s.manifest import CONFIG_DIR, CONFIG_FILE, JobShape, job_name, manifest, write_manifest
from disttrain.launch.k8s.resources import PodResources, gib, plan_bytes, pod_resources

J = TypeVar("J")


def check_k8s(k8s: K8sConfig, nnodes: str) -> str:
    """The image (required), and a volume for more than one node; returns the image."""
    if not k8s.image:
        raise ConfigError(
            "--k8s needs --k8s.image IMAGE: a container image with disttrain (and your code) installed, "
            "e.g. --k8s.image ghcr.io/you/disttrain:0.1"
        )
    if nnodes != "1" and k8s.volume is None:
        raise ConfigError(
            f"--k8s with launch.nnodes {nnodes} needs --k8s.volume PVC:/path: a PersistentVolumeClaim every pod "
            "mounts (ReadWriteMany), where the run folder and its checkpoints live, e.g. --k8s.volume runs-pvc:/runs"
        )
    return k8s.image


def summary(res: PodResources, nnodes: str, nproc: int, preempt_grace_s: int) -> str:
    gpus = f", {res.gpus} GPU(s)" if res.gpus else ""
    return (
        f"{nnodes} pod(s) x {nproc} process(es): {res.cpus} CPU(s){gpus}, {gib(res.memory)} memory "
        f"({gib(res.shm)} of it /dev/shm); grace period {res.termination_grace_s} s (launch.preempt_grace_s "
        f"{preempt_grace_s} + planned save {res.save_s} s + exit)"
    )


def pod_config(cfg: J, name: str, k8s: K8sConfig, res: PodResources) -> J:
    """``cfg`` (a job config with ``run`` and ``launch`` sections) as the pods run it: the run named ``name`` in
    the volume's folder (a rescheduled pod resumes there), no node rank or rendezvous of its own (the operator's
    variables give them), and the launcher's grace."""
    c: Any = cfg
    root = k8s.volume.partition(":")[2].rstrip("/") if k8s.volume else c.run.root
    return dataclasses.replace(  # type: ignore[no-any-return]
        c,
        run=dataclasses.replace(c.run, name=name, root=root),
        launch=dataclasses.replace(c.launch, node_rank=0, rdzv_endpoint=None, preempt_grace_s=res.rank_grace_s),
    )


def write_pods(
    kind: str,
    k8s: K8sConfig,
    launch: LaunchConfig,
    *,
    name: str,
    args: list[str],
    nproc: int,
    res: PodResources,
    path: Path,
    config_toml: str | None = None,
    pod_restarts: bool = True,
) -> int:
    """The one writer of every command's manifest: ``launch.nnodes`` pods of ``nproc`` processes, each running
    ``disttrain ARGS`` with ``res``'s requests and grace, ``config_toml`` as the ConfigMap; written to ``path``
    with the line that submits it."""
    shape = JobShape(
        name=name,
        namespace=k8s.namespace,
        image=check_k8s(k8s, launch.nnodes),
        args=args,
        nnodes=launch.nnodes,
        nproc=nproc,
        max_restarts=launch.max_restarts,
        resources=res,
        volume=k8s.volume,
        config_toml=config_toml,
        queue=k8s.queue,
        pod_restarts=pod_restarts,
    )
    docs = manifest(kind, shape)
    print(summary(res, launch.nnodes, nproc, launch.preempt_grace_s))
    print(write_manifest(path, docs))
    return 0


def write_run_manifest(cfg: JobConfig, kind: str) -> int:
    """The job's config (as a ConfigMap) and one pod per node that runs it, in one named run folder on the
    volume (a rescheduled pod resumes there); the manifest goes to ``run.root`` here."""
    import torch

    from disttrain.resolve import resolve

    check_k8s(cfg.k8s, cfg.launch.nnodes)
    if cfg.parallel.nproc is None and cfg.k8s.gpus_per_node:
        cfg = dataclasses.replace(cfg, parallel=dataclasses.replace(cfg.parallel, nproc=cfg.k8s.gpus_per_node))
    wants_gpu = cfg.parallel.device == "cuda" or bool(cfg.k8s.gpus_per_node)
    if wants_gpu and not torch.cuda.is_available():
        # the plan needs the device it plans for: the pods get the processes asked for, without a memory plan
        nproc, device, plan, column = cfg.parallel.nproc or 1, "cuda", None, None
        print("disttrain: no GPU here: the pods' memory comes without a memory plan (run --k8s on a GPU machine)")
    else:
        job = resolve(cfg)
        nproc, device, plan = job.nproc, job.device, job.plan_json
        column = "fsdp_offload" if job.config.parallel.offload else job.strategy
    host, state = plan_bytes(plan, column, nproc, device)
    grace = cfg.launch.preempt_grace_s
    res = pod_resources(cfg.k8s, nproc=nproc, device=device, preempt_grace_s=grace, host_bytes=host, save_bytes=state)
    name = job_name(cfg.run.name)
    pod_cfg = pod_config(cfg, name, cfg.k8s, res)
    pod_cfg = dataclasses.replace(pod_cfg, parallel=dataclasses.replace(cfg.parallel, nproc=nproc))
    return write_pods(
        kind,
        cfg.k8s,
        cfg.launch,
        name=name,
        args=["run", "--config", f"{CONFIG_DIR}/{CONFIG_FILE}"],
        nproc=nproc,
        res=res,
        path=Path(cfg.run.root) / f"{name}.{kind}.yaml",
        config_toml=to_toml(pod_cfg),
    )


def write_launch_manifest(
    kind: str, k8s: K8sConfig, nproc: int | None, launch: LaunchConfig, script: str, args: list[str]
) -> int:
    """``disttrain launch --k8s KIND -n N --nnodes M script.py ...``: ``<script>.<kind>.yaml`` beside the script;
    the script's path is the one inside the image."""
    check_k8s(k8s, launch.nnodes)
    n = nproc or k8s.gpus_per_node or 1
    device = "cuda" if k8s.gpus_per_node else "cpu"
    res = pod_resources(k8s, nproc=n, device=device, preempt_grace_s=launch.preempt_grace_s)
    restarts = ["--max-restarts", str(launch.max_restarts)] if launch.max_restarts else []
    return write_pods(
        kind,
        k8s,
        launch,
        name=job_name(Path(script).stem),
        args=["launch", "-n", str(n), "--nnodes", launch.nnodes, *restarts, script, *args],
        nproc=n,
        res=res,
        path=Path(script).resolve().with_suffix(f".{kind}.yaml"),
    )
