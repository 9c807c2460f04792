"""One rank of ``disttrain doctor``'s multi-process test, started through torchrun: all-reduce and all-gather
bandwidth per backend, the latency/bandwidth curves of all-gather, reduce-scatter and all-reduce over the local
ranks (and, across nodes, over one rank per node), one thread's matmul TFLOP/s and element-wise rate, on a CPU
the framework time per operator and FSDP2's fixed cost per unit (:mod:`disttrain.jobs.framework_probe`), across
nodes the clocks and inter- vs intra-node bandwidth, and the RPC link (a small call's round trip, and the rate of
calls that carry a tensor). Rank 0 writes the figures to
``<out_dir>/result.json``; local rank 0 of every node writes its node's curves and compute rates to
``<out_dir>/machine.json`` (the launcher fits and caches them: disttrain.plan.machine)."""

from __future__ import annotations

import datetime
import functools
import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from disttrain.plan.machine import boot_id
from disttrain.utils.host import reserved_port
from disttrain.utils.process import run_and_exit


def _bandwidth(op: str, nbytes: int, device: torch.device, iters: int = 5) -> float:
    """Payload GB/s per rank of an all-reduce (nbytes per rank) or all-gather (nbytes from each rank)."""
    world = dist.get_world_size()
    x = torch.ones(nbytes // 4, dtype=torch.float32, device=device)
    outs = [torch.empty_like(x) for _ in range(world)]
    times = []
    for i in range(iters + 1):
        dist.barrier()
        if device.type == "cuda":
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        if op == "all_reduce":
            dist.all_reduce(x)
        else:
            dist.all_gather(outs, x)
        if device.type == "cuda":
            torch.cuda.synchronize()
        if i:  # the first one sets up connections
            times.append(time.perf_counter() - t0)
    moved = nbytes if op == "all_reduce" else nbytes * world
    return moved / statistics.median(times) / 1e9


def worker(out_dir: str, machine_only: bool = False, rpc: bool = False) -> None:
    """One rank of the test: bandwidths per backend, then the RPC link from rank 0 to the last rank;
    ``machine_only``: only the figures the plan caches (curves, compute rates, framework costs; ``rpc``: and the
    RPC link, for ``ps --plan``)."""
    import warnings

    from disttrain.parallel.env import backend_for

    warnings.filterwarnings("ignore", message=".*as a ProcessGroup.*")  # gloo + rpc (pytorch#149393)
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    cuda = torch.cuda.is_available()
    if cuda:
        torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
    dist.init_process_group(backend_for("cuda" if cuda else "cpu"), timeout=datetime.timedelta(seconds=60))
    res: dict[str, Any] = {"world": world}
    devices = [("gloo", torch.device("cpu"))] + ([("nccl", torch.device("cuda"))] if cuda else [])
    cap = _affordable_bytes(devices[-1][1])
    for backend, dev in [] if machine_only else devices:
        size = min(64 * 2**20 if backend == "nccl" else 16 * 2**20, cap)
        res[f"{backend}_all_reduce"] = _bandwidth("all_reduce", size, dev)
        res[f"{backend}_all_gather"] = _bandwidth("all_gather", size // world, dev)
    main = devices[-1][1]
    across, curves = _across_nodes(main, cap)
    res.update(across)
    if "nodes" not in across and world > 1:  # one node: the local ranks are the world (one rank: no link)
        curves["intra"] = _curves(CURVE_BYTES, main)
    machine: dict[str, Any] = {"device": main.type, "curves": curves}
    if "nodes" not in across and world > 1 and main.type == "cpu":  # on CUDA the kernel queue hides FSDP's hooks
        from disttrain.jobs.framework_probe import fsdp_probe

        machine["fsdp_probe"] = fsdp_probe()
    if int(os.environ.get("LOCAL_RANK", "0")) == 0:
        machine.update(_compute_rates(main))  # the other ranks wait at the barrier below
    dist.barrier()
    wants_rpc = world > 1 and (rpc or not machine_only)
    if wants_rpc and (figures := _rpc_figures(rank, world)) is not None:  # every rank joins; rank 0 measures
        res["rpc_ms"] = figures[0]["ping_s"] * 1e3
        machine["rpc"] = figures  # rank 0 is its node's local rank 0
    if int(os.environ.get("LOCAL_RANK", "0")) == 0:
        Path(out_dir, "machine.json").write_text(json.dumps(machine))
    if rank == 0:
        Path(out_dir, "result.json").write_text(json.dumps(res))
    dist.barrier()
    dist.destroy_process_group()


def _across_nodes(device: torch.device, cap: int, nbytes: int = 8 * 2**20) -> tuple[dict[str, Any], dict[str, Any]]:
    """Several nodes: the clock offsets between them (each rank's wall clock read just after a barrier, the
    median of 5 rounds), all-reduce bandwidth within a node vs across nodes (local rank 0 of each), and the
    collective curves within this node ("intra") and over one rank per node ("inter", 3 sizes); across nodes,
    no transfer above ``cap`` bytes (:func:`_affordable_bytes`)."""
    nodes, local = int(os.environ.get("GROUP_WORLD_SIZE", "1")), int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
    if nodes < 2 or dist.get_world_size() != nodes * local:
        return {}, {}
    me, world = dist.get_rank(), dist.get_world_size()
    rounds = []
    for _ in range(5):
        stamp = [0.0] * world
        dist.barrier()
        dist.all_gather_object(stamp, time.time())
        rounds.append(max(stamp) - min(stamp))
    out: dict[str, Any] = {"nodes": nodes, "clock_skew_s": statistics.median(rounds)}
    curves: dict[str, Any] = {}
    ranks_of = [list(range(n * local, (n + 1) * local)) for n in range(nodes)]
    intra = [dist.new_group(r) for r in ranks_of]  # every rank makes every group, in the same order
    inter = dist.new_group([r[0] for r in ranks_of])
    node = me // local
    if local > 1:
        out["intra_all_reduce"] = _group_bandwidth(intra[node], ranks_of[node], nbytes, device)
        curves["intra"] = _curves(CURVE_BYTES, device, intra[node])
    if me % local == 0:
        out["inter_all_reduce"] = _group_bandwidth(inter, [r[0] for r in ranks_of], min(nbytes, cap), device)
        curves["inter"] = _curves(capped(INTER_CURVE_BYTES, cap), device, inter)
    dist.barrier()
    return out, curves


CURVE_BYTES = (4 * 2**10, 64 * 2**10, 2**20, 4 * 2**20, 16 * 2**20)
"""Total (unsharded) sizes of the collective curves: from latency-bound to bandwidth-bound."""
INTER_CURVE_BYTES = (64 * 2**10, 2**20, 16 * 2**20)


def _affordable_bytes(device: torch.device, seconds: float = 0.2) -> int:
    """The largest all-reduce over every rank that takes about ``seconds`` on the slowest link, from one of
    64 KiB (the slowest rank's time): the test's sizes stay within it, so a slow link (20 Mbit/s, say) takes
    seconds to measure, not minutes. The same on every rank."""
    probe = 64 * 2**10
    x = torch.ones(probe // 4, dtype=torch.float32, device=device)
    took = torch.tensor([max(_timed(lambda: dist.all_reduce(x), None, device, 1))], device=device)
    dist.all_reduce(took, op=dist.ReduceOp.MAX)
    return max(probe, int(probe * seconds / max(float(took), 1e-9)))


def capped(sizes: tuple[int, ...], cap: int) -> tuple[int, ...]:
    """``sizes`` up to ``cap``, and ``cap`` itself when that leaves fewer than two (a line needs two points)."""
    kept = tuple(s for s in sizes if s <= cap)
    return kept if len(kept) >= 2 else (*kept, cap) if cap not in kept else (cap // 4, cap)


def _curves(sizes: tuple[int, ...], device: torch.device, group: Any = None, iters: int = 5) -> dict[str, Any]:
    """The link over ``group``: ``{"nranks", "points": all-gather, "kinds": {"reduce_scatter", "all_reduce"}}``,
    each a list of (total bytes: the unsharded buffer, median seconds) of the fp32 collective FSDP or DDP runs,
    at each total size: a warm-up, then ``iters`` timed calls, each after a barrier."""
    gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor  # the newer names
    scatter = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor
    n = dist.get_world_size(group)
    ops = {
        "all_gather": lambda full, shard: functools.partial(gather, full, shard, group=group),
        "reduce_scatter": lambda full, shard: functools.partial(scatter, shard, full, group=group),
        "all_reduce": lambda full, shard: functools.partial(dist.all_reduce, full, group=group),
    }
    points: dict[str, list[tuple[int, float]]] = {k: [] for k in ops}
    for total in sizes:
        shard = torch.ones(max(1, total // 4 // n), dtype=torch.float32, device=device)
        full = torch.ones(shard.numel() * n, dtype=torch.float32, device=device)
        for kind, op in ops.items():
            points[kind].append((full.numel() * 4, statistics.median(_timed(op(full, shard), group, device, iters))))
    return {"nranks": n, "points": points.pop("all_gather"), "kinds": points}


def _timed(op: Any, group: Any, device: torch.device, iters: int) -> list[float]:
    """Seconds of ``iters`` calls of the collective ``op`` after one untimed call (it sets up buffers and
    connections), every rank of ``group`` starting together (a barrier before each)."""
    times = []
    for i in range(iters + 1):
        dist.barrier(group=group)
        if device.type == "cuda":
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        op()
        if device.type == "cuda":
            torch.cuda.synchronize()
        if i:
            times.append(time.perf_counter() - t0)
    return times


def _compute_rates(device: torch.device) -> dict[str, Any]:
    """One thread's (CPU) or the GPU's rates in fp32 and bf16 (on a GPU where it has bf16; on every CPU, where an
    emulated bf16 is measured on small matmuls in about a second: a bf16 plan must know it is slow, and a figure
    missing from the cache had every bf16 plan measure the whole machine again), each the best of 3 short
    windows (a busy machine's other processes take some of them): ``matmul_tflops``, the square-matmul TFLOP/s,
    and ``elementwise_rate``, the elements per second of a block's element-wise work; on a CPU also
    ``op_overhead_s``, the framework time per operator (:mod:`disttrain.jobs.framework_probe`)."""
    from disttrain.parallel.env import fast_bf16
    from disttrain.utils.peak import measure_elementwise_rate, measure_matmul_tflops, one_thread

    n = 8192 if device.type == "cuda" else 1024  # a GPU needs big matmuls to reach its peak
    bf16 = device.type == "cpu" or fast_bf16(device.type)
    dtypes = {"fp32": torch.float32, **({"bf16": torch.bfloat16} if bf16 else {})}
    probes = {
        "matmul_tflops": lambda dt: measure_matmul_tflops(device, dt, seconds=0.07, n=n),
        "elementwise_rate": lambda dt: measure_elementwise_rate(device, dt, seconds=0.05),
    }
    with one_thread():
        rates: dict[str, Any] = {
            name: {k: float(f"{max(probe(dt) for _ in range(3)):.4g}") for k, dt in dtypes.items()}
            for name, probe in probes.items()
        }
        if device.type == "cpu":  # on CUDA the launches run ahead of the kernels: the plan keeps its figure
            from disttrain.jobs.framework_probe import op_seconds

            rates["op_overhead_s"] = float(f"{op_seconds():.4g}")
        return rates


def _group_bandwidth(group: Any, ranks: list[int], nbytes: int, device: torch.device, iters: int = 5) -> float:
    """Payload GB/s per rank of an all-reduce of ``nbytes`` within ``group``."""
    x = torch.ones(nbytes // 4, dtype=torch.float32, device=device)
    times = _timed(lambda: dist.all_reduce(x, group=group), group, device, iters)
    return nbytes / statistics.median(times) / 1e9


RPC_BYTES = (64 * 2**10, 256 * 2**10, 2**20)
"""Payloads of the RPC test (after a small call's round trip): a link slower than ~10 Mbit/s stops at the first,
which already takes 50 ms there, one slower than ~40 Mbit/s at the second. A megabyte sent at once over a slow
link overflows a shaping queue (tc's, a switch's) and the losses halve its rate at random, which a parameter
server's messages of tens of kilobytes never see: at 20 Mbit/s the rate read from it varied 1.9-2.4 MB/s."""


def _rpc_figures(rank: int, world: int) -> list[dict[str, Any]] | None:
    """Rank 0's RPC links: to the last rank (on another node when there are several) and, when several nodes
    have several ranks each, to rank 1 (on its own node): per link, the round trip of a small call, and
    (bytes, seconds) of calls that carry a tensor of each size one way (:func:`_rpc_link`), as a parameter
    server's messages travel. None on the other ranks."""
    from torch.distributed import rpc

    from disttrain.rpc.transport import socket_only

    port = [reserved_port() if rank == 0 else 0]
    dist.broadcast_object_list(port, src=0)
    local = int(os.environ.get("LOCAL_WORLD_SIZE", world))
    opts = rpc.TensorPipeRpcBackendOptions(
        init_method=f"tcp://{os.environ['MASTER_ADDR']}:{port[0]}",
        rpc_timeout=60,
        _transports=socket_only(local),  # the transports disttrain ps uses
    )
    rpc.init_rpc(f"w{rank}", rank=rank, world_size=world, rpc_backend_options=opts)
    out = None
    if rank == 0:
        nodes = int(os.environ.get("GROUP_WORLD_SIZE", "1"))
        peers = [(world - 1, nodes > 1)] + ([(1, False)] if nodes > 1 and local > 1 else [])
        out = [{**_rpc_link(rpc, f"w{peer}"), "across_nodes": across} for peer, across in peers]
        if nodes > 1:  # nodes on one machine (namespaces, containers) share its cores: ps --plan counts them once
            same = boot_id() != "" and rpc.rpc_sync(f"w{world - 1}", boot_id) == boot_id()
            out[0]["nodes_sharing_cores"] = nodes if same else 1
    rpc.shutdown()
    return out


def _rpc_link(rpc: Any, peer: str) -> dict[str, Any]:
    """The link to ``peer``: a small call's round trip (median of 20), and per payload size the fastest of 5
    calls back to back (a link's rate is what it reaches once TCP's window is open, as a job's steady stream
    of messages keeps it)."""

    def timed(args: tuple[Any, ...], n: int, pick: Any) -> float:
        rpc.rpc_sync(peer, len, args=args)
        times = []
        for _ in range(n):
            t0 = time.perf_counter()
            rpc.rpc_sync(peer, len, args=args)
            times.append(time.perf_counter() - t0)
        return float(pick(times))

    ping = timed(("ab",), 20, statistics.median)
    points = []
    for nbytes in RPC_BYTES:
        took = timed((torch.ones(nbytes // 4),), 5, min)
        points.append((nbytes, took))
        if took > 0.05:  # a slow link: this point alone fixes its rate
            break
    return {"ping_s": ping, "points": points}


def entry(argv: list[str]) -> int:
    """``python -m disttrain.jobs.doctor_worker TMP [--machine-only] [--rpc]``: one rank's checks, its exit code."""
    worker(argv[0], machine_only="--machine-only" in argv, rpc="--rpc" in argv)
    return 0


if __name__ == "__main__":
    run_and_exit(lambda: entry(sys.argv[1:]))  # skips interpreter teardown (rpc/gloo destructors)
