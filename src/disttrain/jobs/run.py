"""``disttrain run``, the parent's side: resolve the job, write the run folder (``config.toml``,
``resolved.json``, ``strategy.json``, ``memory_plan.txt``, the data's tokenizer in ``tokenizer/``), then start the
workers through torchrun (in-process when alone).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import signal
import sys
import time
from pathlib import Path

import torch

from disttrain.build import data_tokenizer
from disttrain.config import JobConfig
from disttrain.data.tokenizer_folder import RUN_TOKENIZER, write_tokenizer_folder
from disttrain.jobs.doctor import ensure_machine
from disttrain.launch.agent_watch import AgentWatch
from disttrain.launch.debug_env import debug_env
from disttrain.launch.frozen_watch import watch_frozen
from disttrain.launch.k8s.env import from_pod
from disttrain.launch.slurm import requeue
from disttrain.launch.torchrun import STOPPED_CODES, run_torchrun, threads_per_rank, torchrun_argv
from disttrain.parallel.env import resolve_device_type
from disttrain.resolve import resolve
from disttrain.utils.malloc import keep_large_buffers_here


def make_run_dir(cfg: JobConfig) -> Path:
    name = cfg.run.name or time.strftime("%Y%m%d-%H%M%S") + f"-{cfg.parallel.strategy}"
    path = Path(cfg.run.root) / name
    if cfg.run.name is None:
        n = 1
        while path.exists():
            n += 1
            path = Path(cfg.run.root) / f"{name}-{n}"
    path.mkdir(parents=True, exist_ok=True)
    return path


def launch_job(cfg: JobConfig) -> int:
    """``disttrain run``: resolve, write the run folder, start the workers (in-process when alone)."""

    launch, nproc, _ = from_pod(cfg.launch, cfg.parallel.nproc)  # in a PyTorchJob / JobSet pod: its variables
    cfg = dataclasses.replace(cfg, launch=launch, parallel=dataclasses.replace(cfg.parallel, nproc=nproc))
    with contextlib.suppress(RuntimeError):  # a device that is not there: resolve says so
        ensure_machine(resolve_device_type(cfg.parallel.device), "fp32", 2)
    job = resolve(cfg)
    cfg = job.config
    run_dir = make_run_dir(cfg)
    job.write(run_dir)
    (run_dir / "strategy.json").write_text(
        json.dumps({"strategy": job.strategy, "reason": job.reason, "plan": job.plan_json}, indent=2) + "\n"
    )
    if job.plan_text:
        (run_dir / "memory_plan.txt").write_text(job.plan_text + "\n")
    save_tokenizer(cfg, run_dir)
    nproc, device = job.nproc, job.device
    print(
        f"disttrain: {job.strategy} on {nproc} {device} process(es) x {cfg.launch.nnodes} node(s); "
        f"run folder {run_dir}\ndisttrain: strategy {job.strategy}: {job.reason}",
        flush=True,
    )

    os.environ.update(debug_env(cfg.health.debug_presets, run_dir))  # read by the workers' c10d/NCCL at start
    if nproc == 1 and cfg.launch.nnodes == "1" and cfg.launch.max_restarts == 0:
        from disttrain.jobs import run_worker as worker  # the trainer and FSDP: only here, in-process

        torch.set_num_threads(threads_per_rank(1, device))
        if device == "cpu":
            keep_large_buffers_here()
        code = worker.main(run_dir)
    else:
        argv = torchrun_argv(nproc, cfg.launch, run_dir / "logs" / "torchrun", quiet_ranks=True)
        endpoint = cfg.launch.rdzv_endpoint
        with (
            AgentWatch(run_dir, endpoint, cfg.launch.max_restarts) if endpoint else contextlib.nullcontext(),
            watch_frozen(cfg.health, run_dir, cfg.launch.node_rank),
        ):
            code = run_torchrun([*argv, "-m", "disttrain.jobs.run_worker", str(run_dir)], nproc, device)
    if code in STOPPED_CODES:
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # the job is over: a second Ctrl-C must not cut the line
        line = interrupted(cfg, run_dir, code)
        if code == 128 + signal.SIGUSR1 and cfg.launch.node_rank == 0:
            line += "; " + requeue()
        print(f"disttrain: {line}", file=sys.stderr, flush=True)
    return code


def save_tokenizer(cfg: JobConfig, run_dir: Path) -> Path | None:
    """The data's tokenizer (a prepared folder's, or ``data.tokenizer``) into ``RUN/tokenizer/`` as Hugging Face
    files: the sample at the end decodes through it and ``ckpt export --format hf`` copies it beside the weights."""
    tok = data_tokenizer(cfg)
    if tok is None:
        return None
    source = {"data_path": str(Path(cfg.data.path).resolve())} if cfg.data.path else {}
    return write_tokenizer_folder(tok, run_dir / RUN_TOKENIZER, cfg.model.context, source)


def interrupted(cfg: JobConfig, run_dir: Path, code: int) -> str:
    """One line for a job stopped by Ctrl-C (130), SIGUSR1 (138) or SIGTERM (143): where it was, how to go on."""
    from disttrain.checkpoint.layout import list_checkpoints  # DCP: a second's import, needed only here

    steps = (
        [json.loads(x).get("step", 0) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
        if (run_dir / "metrics.jsonl").is_file()
        else []
    )
    folder = Path(cfg.checkpoint.folder)
    usable = [c for c in list_checkpoints(folder if folder.is_absolute() else run_dir / folder) if c.usable]
    newest = f"step {usable[-1].step}" if usable else "none yet"
    how = {130: "interrupted", 138: "preempted (SIGUSR1)"}.get(code, "terminated (SIGTERM)")
    return (
        f"{how} at step {max(steps, default=0)}; newest complete checkpoint: {newest}; resume with "
        f"disttrain run --run.name {run_dir.name} (and the same options)"
    )
