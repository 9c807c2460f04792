"""Process group up/down, the device of this rank, per-rank threads and seeding.

Reads torchrun's environment (RANK, WORLD_SIZE, LOCAL_RANK, ...). Without it, the process is a
single rank and no process group is created, so the same code runs under ``python script.py``.
"""

from __future__ import annotations

import atexit
import contextlib
import dataclasses
import datetime
import os
import random
import time
from dataclasses import dataclass

import torch
import torch.distributed as dist

from disttrain.config import PrecisionConfig
from disttrain.utils.peak import cpu_has_fast_bf16


@dataclass(frozen=True)
class DistEnv:
    """Who this process is in the job."""

    rank: int
    world_size: int
    local_rank: int
    local_world_size: int
    device: torch.device

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def distributed(self) -> bool:
        return self.world_size > 1 or dist.is_initialized()


def resolve_device_type(pref: str = "auto") -> str:
    if pref == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if pref == "cuda" and not torch.cuda.is_available():
        raise RuntimeError("parallel.device is 'cuda' but no CUDA device is visible; use --parallel.device cpu")
    return pref


def fast_bf16(device_type: str) -> bool:
    """Whether bf16 matmuls run faster than fp32 here: GPUs with bf16, CPUs with AMX or AVX512-BF16
    (elsewhere torch emulates bf16 on the CPU, about 50-100x slower than fp32)."""
    if device_type == "cuda":
        if not torch.cuda.is_available():  # planning for GPUs from a machine without one (`estimate`)
            return True  # the GPUs jobs are planned for (Ampere and later: A100, H100, H200) compute bf16
        return torch.cuda.is_bf16_supported()
    return cpu_has_fast_bf16()


def resolve_precision(precision: PrecisionConfig, device_type: str) -> PrecisionConfig:
    """``dtype = "auto"`` -> bf16 where :func:`fast_bf16`, else fp32; other choices are kept."""
    if precision.dtype != "auto":
        return precision
    return dataclasses.replace(precision, dtype="bf16" if fast_bf16(device_type) else "fp32")


def backend_for(device_type: str) -> str:
    """NCCL for CUDA tensors plus gloo for CPU ones (async checkpoint staging needs a CPU backend)."""
    return "cpu:gloo,cuda:nccl" if device_type == "cuda" else "gloo"


def init_distributed(device: str = "auto", timeout_s: float = 600.0, threads: int | None = None) -> DistEnv:
    """Join the job started by torchrun (or be a lone rank) and pick this rank's device."""
    rank = int(os.environ.get("RANK", 0))
    world = int(os.environ.get("WORLD_SIZE", 1))
    local_rank = int(os.environ.get("LOCAL_RANK", 0))
    local_world = int(os.environ.get("LOCAL_WORLD_SIZE", 1))
    dtype = resolve_device_type(device)
    if dtype == "cuda":
        torch.cuda.set_device(local_rank)
        dev = torch.device("cuda", local_rank)
    else:
        dev = torch.device("cpu")
        torch.set_num_threads(threads or int(os.environ.get("OMP_NUM_THREADS", 0)) or torch.get_num_threads())
    if "RANK" in os.environ and not dist.is_initialized():
        dist.init_process_group(
            backend=backend_for(dtype),
            timeout=datetime.timedelta(seconds=timeout_s),
            device_id=dev if dtype == "cuda" else None,
        )
        atexit.register(destroy_distributed)  # scripts that never call it still exit cleanly
    return DistEnv(rank, world, local_rank, local_world, dev)


def init_single_process_group(device_type: str) -> None:
    """A process group of one rank, for FSDP / HSDP on one device (a 1-rank mesh): an in-memory store,
    no port, no torchrun. A no-op when a group exists."""
    if dist.is_initialized():
        return
    dist.init_process_group(backend_for(device_type), store=dist.HashStore(), rank=0, world_size=1)
    atexit.register(destroy_distributed)


def destroy_distributed() -> None:
    """Leave the group cleanly.

    The barrier (whose wait releases the GIL) lets gloo's worker threads finish freeing the last
    collective's Python tensors first: otherwise a DDP Reducer freed later, with the GIL held, joins a
    gloo thread that is waiting for the GIL, and the process never exits (seen with torch 2.13).
    """
    if dist.is_initialized():
        with contextlib.suppress(Exception):  # a peer that already died must not turn exit into a hang
            dist.barrier()
        time.sleep(0.05)
        dist.destroy_process_group()


def seed_everything(seed: int) -> None:
    """Same seed on every rank: identical initialisation and data order (dropout included)."""
    random.seed(seed)
    torch.manual_seed(seed)
