"""Peak matmul FLOP/s of one device: a table of known GPUs (dense bf16), or a square matmul measured here;
the rate of a transformer's element-wise work measured here; whether this CPU computes bf16 matmuls natively;
and :func:`one_thread`, under which every per-core figure is measured.

Below the trainer (MFU) and the planner (predicted compute time), which both ask it.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import torch


@contextmanager
def one_thread() -> Iterator[None]:
    """torch's intra-op threads set to 1 (as each rank runs), then back to what they were."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def cpu_has_fast_bf16() -> bool:
    """AMX or AVX512-BF16: where bf16 matmuls on the CPU are fast (elsewhere torch emulates them, about 50-100x
    slower than fp32)."""
    probes = ("_is_amx_tile_supported", "_is_avx512_bf16_supported")
    return any(bool(getattr(torch.cpu, p, lambda: False)()) for p in probes)


# Dense (no sparsity) peak TFLOP/s for bf16/fp16 tensor-core matmuls.
GPU_PEAK_TFLOPS = {
    "H200": 989.0,
    "H100": 989.0,
    "H800": 989.0,
    "A100": 312.0,
    "A800": 312.0,
    "L40S": 362.0,
    "A10G": 125.0,
    "L4": 121.0,
    "V100": 125.0,
    "B200": 2250.0,
}


def gpu_peak_tflops(name: str) -> float | None:
    for key, val in GPU_PEAK_TFLOPS.items():
        if key in name.upper():
            return val
    return None


def measure_matmul_tflops(device: torch.device, dtype: torch.dtype, seconds: float = 0.3, n: int = 1024) -> float:
    """Sustained square-matmul TFLOP/s of this process on ``device`` (with its current thread count).

    On a CPU a 256 x 256 probe comes first: where the dtype is emulated (bf16 without AMX / AVX512-BF16, ~1
    GFLOP/s) one n = 1024 matmul would take seconds, so the probe's size is measured instead (as slow per FLOP)."""
    if device.type == "cpu" and n > 256:
        probe = _rate(device, dtype, 256, seconds=0.0)
        if 2 * n**3 / (probe * 1e12) > seconds / 4:
            n = 256
    return _rate(device, dtype, n, seconds)


def _rate(device: torch.device, dtype: torch.dtype, n: int, seconds: float) -> float:
    """TFLOP/s of n x n matmuls, after a warm-up, for at least ``seconds`` (at least 4 matmuls)."""
    a = torch.randn(n, n, device=device).to(dtype)
    b = torch.randn(n, n, device=device).to(dtype)

    def four() -> None:
        for _ in range(4):
            a @ b

    return 4 * 2 * n**3 * _calls_per_second(four, device, seconds) / 1e12


def _calls_per_second(fn: Callable[[], None], device: torch.device, seconds: float) -> float:
    """How often ``fn`` runs per second on ``device``: one warm-up call, then calls for at least ``seconds``
    (at least one), the GPU synchronized around each. On a CPU the clock is the process's CPU time over its
    thread count: what the cores can do, not how much of them a busy machine left this process (on a machine
    with other work the wall clock read 1000x slow and every plan then tied)."""
    fn()
    if device.type == "cuda":
        torch.cuda.synchronize()
    clock = time.perf_counter if device.type != "cpu" else _cpu_clock(torch.get_num_threads())
    iters, t0, wall0 = 0, clock(), time.perf_counter()
    while iters == 0 or (clock() - t0 < seconds and time.perf_counter() - wall0 < 10 * seconds + 0.5):
        fn()
        iters += 1
        if device.type == "cuda":
            torch.cuda.synchronize()
    return iters / max(clock() - t0, 1e-9)


def _cpu_clock(threads: int) -> Callable[[], float]:
    """Seconds of this process's CPU time per compute thread."""
    return lambda: time.process_time() / threads


def peak_tflops(device: torch.device, dtype: torch.dtype, override: float | None = None) -> tuple[float, str]:
    """(peak TFLOP/s of one device, where the figure comes from)."""
    if override:
        return override, "config"
    if device.type == "cuda":
        name = torch.cuda.get_device_name(device)
        known = gpu_peak_tflops(name)
        if known is not None:
            return (known if dtype != torch.float32 else known / 2), f"table:{name}"
        return measure_matmul_tflops(device, dtype, n=8192), f"measured:{name}"
    return measure_matmul_tflops(device, dtype), "measured:cpu-matmul"


def measure_elementwise_rate(device: torch.device, dtype: torch.dtype, seconds: float = 0.1) -> float:
    """Elements per second that a transformer block's element-wise and reduction operators write on ``device``
    (this process's threads): a layer norm, GELU, a residual add, a scale, a softmax and a cast to fp32, each
    over a 4096 x 256 activation (a GPU's: 65536 x 1024, big enough that its memory, not the launches, sets the
    time), timed together for at least ``seconds``."""
    rows, width = (65536, 1024) if device.type == "cuda" else (4096, 256)
    x = torch.randn(rows, width, device=device).to(dtype)
    w, b = torch.ones(width, device=device, dtype=dtype), torch.zeros(width, device=device, dtype=dtype)

    def block() -> None:
        h = torch.nn.functional.layer_norm(x, (width,), w, b)
        h = torch.nn.functional.gelu(h) + x
        torch.softmax(h * 0.5, dim=-1).float()

    return 6 * x.numel() * _calls_per_second(block, device, seconds)
