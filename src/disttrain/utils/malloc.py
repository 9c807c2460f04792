"""glibc's heap for CPU processes: what CPU workers are started with (large buffers kept in the heap instead of
mapped afresh every step), the same switched on in a running process, and giving free pages back to the OS.

Below the launcher (worker environments, in-process jobs) and ``estimate --measure`` (RSS and step timing).
"""

from __future__ import annotations

import ctypes
import os
from collections.abc import Mapping


def _libc() -> ctypes.CDLL:
    """This process's C library (glibc on Linux; OSError / AttributeError from its functions elsewhere)."""
    return ctypes.CDLL(None)


def allocator_is_ours(env: Mapping[str, str]) -> bool:
    """Whether to tune glibc's allocator: not where the user set ``DISTTRAIN_CPU_MALLOC=glibc`` or any
    ``MALLOC_*`` variable of their own (setting any of those also turns off glibc's own adaptive threshold)."""
    return env.get("DISTTRAIN_CPU_MALLOC", "keep") != "glibc" and not any(k.startswith("MALLOC_") for k in env)


CPU_MALLOC_ENV = {"MALLOC_MMAP_MAX_": "0", "MALLOC_TRIM_THRESHOLD_": str(2**40)}
"""glibc's allocator for CPU workers, unless the user said ``DISTTRAIN_CPU_MALLOC=glibc`` or set any ``MALLOC_*``
variable (:func:`disttrain.launch.torchrun.worker_env_defaults`). By default glibc maps every allocation of 32
MiB or more afresh and unmaps it when freed, and torch's CPU allocator keeps nothing, so each step's large
transient buffers (an FSDP unit's gradients and reduce-scatter input, a large vocabulary's logits) come as new
zeroed pages: 0.35 ms per MiB here, 5x the cost of a copy into a kept buffer. From the heap, kept once freed,
they cost nothing after the first few steps: 7-10% faster steps on 2 ranks here, the same peak RSS
(benchmarks/bench_malloc.py). A worker's memory stays at its peak instead of falling back between steps."""


def keep_large_buffers_here() -> bool:
    """:data:`CPU_MALLOC_ENV` for this process, which is already running (an in-process single-rank job); False
    where the user opted out (see :func:`allocator_is_ours`) or this is not glibc."""
    return allocator_is_ours(os.environ) and keep_large_buffers()


def keep_large_buffers() -> bool:
    """:data:`CPU_MALLOC_ENV`'s behaviour from now on in this process, through glibc's ``mallopt`` (its trim
    threshold is a C int there: 2 GiB), whatever the environment says; False where this is not glibc."""
    try:
        libc = _libc()
        m_trim_threshold, m_mmap_max = -1, -4  # <malloc.h>
        return bool(libc.mallopt(m_mmap_max, 0) == 1 and libc.mallopt(m_trim_threshold, 2**31 - 1) == 1)
    except (OSError, AttributeError):
        return False


def trim_heap() -> None:
    """Give the heap's free pages back to the OS (glibc ``malloc_trim``), so that what the next strategy
    allocates shows in the RSS instead of reusing what the previous one freed (a tiny model's tensors are all
    below the mmap threshold: without this its RSS peak could read 0)."""
    try:
        _libc().malloc_trim(0)
    except (AttributeError, OSError):  # not glibc
        pass
