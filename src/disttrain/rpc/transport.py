"""``torch.distributed.rpc`` behind four calls: :func:`init`, :func:`call`, :func:`call_async`, :func:`shutdown`.

Every failure becomes an :class:`~disttrain.errors.RpcError` that names the worker, the function and the
cause (a timeout says which limit), instead of a TensorPipe traceback. The agent binds to the rendezvous
address (``MASTER_ADDR``, loopback by default): RPC executes pickled callables, so it belongs on a trusted
network only.
"""

from __future__ import annotations

import datetime
import os
from collections.abc import Callable
from typing import Any

import torch.distributed as dist
import torch.distributed.rpc as rpc
from torch.futures import Future

from disttrain.errors import RpcError

DEFAULT_TIMEOUT_S = 60.0
_GROUP: dict[str, Any] = {}


def init(
    name: str,
    rank: int,
    world_size: int,
    *,
    addr: str | None = None,
    port: int | None = None,
    timeout_s: float = DEFAULT_TIMEOUT_S,
    threads: int = 8,
) -> None:
    """Join the RPC group as ``name`` (rendezvous at ``addr:port``, default ``MASTER_ADDR:MASTER_PORT``)."""
    addr = addr or os.environ.get("MASTER_ADDR", "127.0.0.1")
    port = port or int(os.environ.get("MASTER_PORT", "29500"))
    opts = rpc.TensorPipeRpcBackendOptions(
        num_worker_threads=threads,
        rpc_timeout=timeout_s,
        init_method=f"tcp://{addr}:{port}",
        _transports=socket_only(int(os.environ.get("LOCAL_WORLD_SIZE", world_size))),
    )
    if addr in ("127.0.0.1", "localhost"):
        os.environ.setdefault("TP_SOCKET_IFNAME", "lo")  # TensorPipe listens on loopback only
    try:
        rpc.init_rpc(name, rank=rank, world_size=world_size, rpc_backend_options=opts)
        # The rendezvous store lives in rank 0 (unless torchrun's agent hosts it): :func:`shutdown` uses it
        # to let rank 0 leave last, so that no worker still finishing its shutdown loses the store.
        store = dist.TCPStore(addr, port, is_master=False, timeout=datetime.timedelta(seconds=timeout_s))
        _GROUP.update(store=store, rank=rank, world=world_size, name=name)
    except Exception as e:
        where = f"{name} (rank {rank} of {world_size})"
        raise RpcError(f"rpc: {where} could not join at {addr}:{port}: {_first(e)}") from None


def socket_only(local_procs: int) -> list[str] | None:
    """TensorPipe's transports for ``local_procs`` processes on this host: its shared-memory transport polls in
    a busy loop, one spinning thread per process; where the processes do not leave a spare core for each, those
    threads take the cores the processes compute on (4 RPC processes on 2 cores: a third of the CPU time), so
    sockets (uv, over loopback on one host) only. None: TensorPipe's own choice (shm for same-host peers)."""
    return ["uv"] if 2 * local_procs > (os.cpu_count() or 1) else None


def _first(e: BaseException) -> str:
    """One line for an exception; for one raised on the remote side, the remote exception itself
    (torch wraps it as "On WorkerInfo(...):", then its repr, then the remote traceback)."""
    text = str(e).strip().splitlines()
    if len(text) > 1 and "On WorkerInfo(" in text[0]:
        return text[1][:300]
    return f"{type(e).__name__}: {text[0][:300]}" if text else type(e).__name__


def _describe(to: str, fn: Callable[..., Any]) -> str:
    return f"{getattr(fn, '__qualname__', fn)!s} on {to}"


def call(to: str, fn: Callable[..., Any], *args: Any, timeout_s: float | None = None, **kwargs: Any) -> Any:
    """Run ``fn(*args, **kwargs)`` on worker ``to`` and return its result (blocking)."""
    return wait(call_async(to, fn, *args, timeout_s=timeout_s, **kwargs), to, fn)


def call_async(to: str, fn: Callable[..., Any], *args: Any, timeout_s: float | None = None, **kwargs: Any) -> Future:
    """Start ``fn(*args, **kwargs)`` on worker ``to``; a Future of its result (:func:`wait` it). A call to this
    worker itself runs here and now, without serialising anything (a colocated trainer and server)."""
    if to == _GROUP.get("name"):
        return _local(fn, args, kwargs)
    timeout = -1.0 if timeout_s is None else timeout_s  # -1: the group's default
    try:
        return rpc.rpc_async(to, fn, args=args, kwargs=kwargs, timeout=timeout)
    except Exception as e:
        raise RpcError(f"rpc: {_describe(to, fn)} could not start: {_first(e)}") from None


def _local(fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]) -> Future:
    try:
        out = fn(*args, **kwargs)
    except Exception as e:
        failed: Future = Future()
        failed.set_exception(e)
        return failed
    if getattr(fn, "_wrapped_async_rpc_function", None) is not None:
        return out  # an async_execution function's own Future
    done: Future = Future()
    done.set_result(out)
    return done


def wait(fut: Future, to: str, fn: Callable[..., Any]) -> Any:
    """The result of a :func:`call_async` Future; RpcError naming the worker and the call if it failed."""
    try:
        return fut.wait()
    except Exception as e:
        cause = _first(e)
        if "timeout" in cause.lower() or "timed out" in cause.lower():
            cause = f"timed out ({cause}); raise the timeout or check that {to} is alive"
        raise RpcError(f"rpc: {_describe(to, fn)} failed: {cause}") from None


def shutdown(graceful: bool = True, timeout_s: float = 30.0, peers: list[int] | None = None) -> None:
    """Leave the group: graceful waits for every worker's outstanding calls (a barrier over all of them);
    not graceful leaves without that barrier (a group that lost a worker). Rank 0 hosts the rendezvous
    store and leaves after ``peers`` (default: every rank) have left; not graceful, it waits for them before
    stopping its own agent, so that its last answers still reach them."""
    store, rank, world = _GROUP.pop("store", None), _GROUP.pop("rank", 0), _GROUP.pop("world", 1)
    if not graceful and rank == 0:
        _wait_left(store, rank, range(world) if peers is None else peers, timeout_s)
    try:
        rpc.shutdown(graceful=graceful, timeout=timeout_s)
    except Exception as e:
        raise RpcError(f"rpc: shutdown did not complete within {timeout_s:.0f}s: {_first(e)}") from None
    if graceful or rank != 0:
        _wait_left(store, rank, range(world) if peers is None else peers, timeout_s)


def _wait_left(store: Any, rank: int, peers: Any, timeout_s: float) -> None:
    """Say this rank has left; rank 0 (the store's host) waits until ``peers`` have too."""
    if store is None:
        return
    try:
        store.set(f"disttrain-rpc-left/{rank}", "1")
        if rank == 0:
            store.wait([f"disttrain-rpc-left/{r}" for r in peers if r != 0], datetime.timedelta(seconds=timeout_s))
    except Exception:  # a peer that already died: nothing left to wait for
        pass


def async_execution(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Mark a server function that returns a Future (batched updates answer many callers at once)."""
    return rpc.functions.async_execution(fn)


def store() -> Any:
    """A client of the rendezvous store (rank 0 hosts it): small shared flags beside the calls."""
    return _GROUP.get("store")


def worker_name() -> str:
    return rpc.get_worker_info().name
