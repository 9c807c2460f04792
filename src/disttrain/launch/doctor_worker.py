"""One rank of ``disttrain doctor``'s multi-process test, started through torchrun: all-reduce and all-gather
bandwidth per backend, across nodes the clocks and inter- vs intra-node bandwidth, and an RPC ping; rank 0
writes the figures to ``<out_dir>/result.json``."""

from __future__ import annotations

import datetime
import json
import os
import socket
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

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


def worker(out_dir: str) -> None:
    """One rank of the test: bandwidths per backend, then an RPC ping from rank 0 to the last rank."""
    import warnings

    from disttrain.dist.env import backend_for

    warnings.filterwarnings("ignore", message=".*as a ProcessGroup.*")  # gloo + rpc (pytorch#149393)
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    cuda = torch.cuda.is_available()
    if cuda:
        torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
    dist.init_process_group(backend_for("cuda" if cuda else "cpu"), timeout=datetime.timedelta(seconds=60))
    res: dict[str, Any] = {"world": world}
    devices = [("gloo", torch.device("cpu"))] + ([("nccl", torch.device("cuda"))] if cuda else [])
    for backend, dev in devices:
        size = 64 * 2**20 if backend == "nccl" else 16 * 2**20
        res[f"{backend}_all_reduce"] = _bandwidth("all_reduce", size, dev)
        res[f"{backend}_all_gather"] = _bandwidth("all_gather", size // world, dev)
    res.update(_across_nodes(devices[-1][1]))
    res["rpc_ms"] = _rpc_ping(rank, world)
    if rank == 0:
        Path(out_dir, "result.json").write_text(json.dumps(res))
    dist.barrier()
    dist.destroy_process_group()


def _across_nodes(device: torch.device, nbytes: int = 8 * 2**20) -> dict[str, Any]:
    """Several nodes: the clock offsets between them (each rank's wall clock read just after a barrier, the
    median of 5 rounds) and all-reduce bandwidth within a node vs across nodes (local rank 0 of each)."""
    nodes, local = int(os.environ.get("GROUP_WORLD_SIZE", "1")), int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
    if nodes < 2 or dist.get_world_size() != nodes * local:
        return {}
    me, world = dist.get_rank(), dist.get_world_size()
    rounds = []
    for _ in range(5):
        stamp = [0.0] * world
        dist.barrier()
        dist.all_gather_object(stamp, time.time())
        rounds.append(max(stamp) - min(stamp))
    out: dict[str, Any] = {"nodes": nodes, "clock_skew_s": statistics.median(rounds)}
    ranks_of = [list(range(n * local, (n + 1) * local)) for n in range(nodes)]
    intra = [dist.new_group(r) for r in ranks_of]  # every rank makes every group, in the same order
    inter = dist.new_group([r[0] for r in ranks_of])
    node = me // local
    if local > 1:
        out["intra_all_reduce"] = _group_bandwidth(intra[node], ranks_of[node], nbytes, device)
    if me % local == 0:
        out["inter_all_reduce"] = _group_bandwidth(inter, [r[0] for r in ranks_of], nbytes, device)
    dist.barrier()
    return out


def _group_bandwidth(group: Any, ranks: list[int], nbytes: int, device: torch.device, iters: int = 5) -> float:
    """Payload GB/s per rank of an all-reduce of ``nbytes`` within ``group``."""
    x = torch.ones(nbytes // 4, dtype=torch.float32, device=device)
    times = []
    for i in range(iters + 1):
        dist.barrier(group=group)
        if device.type == "cuda":
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        dist.all_reduce(x, group=group)
        if device.type == "cuda":
            torch.cuda.synchronize()
        if i:
            times.append(time.perf_counter() - t0)
    return nbytes / statistics.median(times) / 1e9


def _rpc_ping(rank: int, world: int) -> float | None:
    from torch.distributed import rpc

    port = [0]
    if rank == 0:
        with socket.socket() as s:
            s.bind(("", 0))
            port[0] = s.getsockname()[1]
    dist.broadcast_object_list(port, src=0)
    opts = rpc.TensorPipeRpcBackendOptions(init_method=f"tcp://{os.environ['MASTER_ADDR']}:{port[0]}", rpc_timeout=30)
    rpc.init_rpc(f"w{rank}", rank=rank, world_size=world, rpc_backend_options=opts)
    ms = None
    if rank == 0:
        peer = f"w{world - 1}"
        rpc.rpc_sync(peer, min, args=(1, 2))
        times = []
        for _ in range(20):
            t0 = time.perf_counter()
            rpc.rpc_sync(peer, min, args=(1, 2))
            times.append(time.perf_counter() - t0)
        ms = statistics.median(times) * 1e3
    rpc.shutdown()
    return ms


if __name__ == "__main__":
    run_and_exit(lambda: worker(sys.argv[1]))  # skips interpreter teardown (rpc/gloo destructors)
