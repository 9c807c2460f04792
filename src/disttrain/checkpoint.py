"""CheckpointManager: sharded (DCP) save/load, asynchronous, atomic commit, keep-k, resume, reshard.

On disk, under the checkpoint folder::

    step-00000100/            a complete checkpoint: DCP files + rng/ + manifest.json + COMMITTED (last)
    .tmp-step-00000200/       a save in progress (or one that crashed): never resumed from

A save writes into ``.tmp-step-N`` on every rank; each rank checksums its own files as it writes them and
leaves the CRC32s in ``.checksums/rank<r>.json``. Once every rank's shard is written (DCP's final
collective), rank 0 merges those into ``manifest.json`` (sizes and CRC32 of every file), renames the folder
to ``step-N`` and writes ``COMMITTED`` last, with fsyncs in between. A crash at any moment therefore leaves
the previous checkpoint as the newest complete one. Resume checks the marker, the manifest and every file
size, and reads ``.metadata`` with a restricted unpickler before DCP does (DCP itself uses plain pickle).
"""

from __future__ import annotations

import contextlib
import errno
import io
import json
import logging
import math
import os
import pickle
import re
import shutil
import signal
import struct
import sys
import threading
import time
import uuid
import warnings
import zlib
from collections.abc import Iterator
from concurrent.futures import Future
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch import nn
from torch.distributed.checkpoint._state_dict_stager import StateDictStager
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.default_planner import DefaultLoadPlanner, DefaultSavePlanner
from torch.distributed.checkpoint.filesystem import FileSystem, FileSystemWriter
from torch.distributed.checkpoint.staging import DefaultStager, StagingOptions
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_state_dict,
    set_state_dict,
)
from torch.distributed.checkpoint.stateful import Stateful

from disttrain.config import DTYPES, CheckpointConfig
from disttrain.train.gc_control import paused_gc

log = logging.getLogger("disttrain")
STEP_RE = re.compile(r"^step-(\d{8})$")
MARKER = "COMMITTED"
MANIFEST = "manifest.json"
_RNG_FILE = "rng/rank{}.pt"
CHECKSUMS = ".checksums"  # per-rank CRC32 sidecars inside a .tmp-step-N folder, merged into the manifest
FORMAT_VERSION = 1


class CheckpointError(RuntimeError):
    """A checkpoint that cannot be used; the message names the folder and what is wrong with it."""


# -- what is saved ----------------------------------------------------------------------------------
class ModelOptimState(Stateful):
    """Model + optimizer as DCP state dicts (sharded under FSDP; FQNs without DDP's ``module.``)."""

    def __init__(self, model: nn.Module, optimizer: torch.optim.Optimizer | None) -> None:
        self.model = model
        self.optimizer = optimizer

    def state_dict(self) -> dict[str, Any]:
        if self.optimizer is None:
            from torch.distributed.checkpoint.state_dict import get_model_state_dict

            return {"model": get_model_state_dict(self.model)}
        msd, osd = get_state_dict(self.model, self.optimizer)
        return {"model": msd, "optim": osd}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        if self.optimizer is None or "optim" not in state_dict:
            from torch.distributed.checkpoint.state_dict import set_model_state_dict

            set_model_state_dict(self.model, state_dict["model"])
            return
        set_state_dict(
            self.model,
            self.optimizer,
            model_state_dict=state_dict["model"],
            optim_state_dict=state_dict["optim"],
            options=StateDictOptions(strict=True),
        )


# -- files ------------------------------------------------------------------------------------------
def crc32_file(path: Path, chunk: int = 1 << 22) -> int:
    crc = 0
    with open(path, "rb") as f:
        while block := f.read(chunk):
            crc = zlib.crc32(block, crc)
    return crc


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _write_synced(path: Path, data: bytes) -> None:
    with open(path, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())


def _libc_sync_file_range() -> Any:
    """Linux ``sync_file_range(2)`` through ctypes, or None where there is none."""
    try:
        import ctypes

        fn = ctypes.CDLL(None, use_errno=True).sync_file_range
        fn.argtypes = (ctypes.c_int, ctypes.c_int64, ctypes.c_int64, ctypes.c_uint)
        return fn
    except (AttributeError, OSError):
        return None


_SYNC_FILE_RANGE = _libc_sync_file_range()
_SYNC_FILE_RANGE_WRITE = 2
WRITEBACK_CHUNK = 16 << 20


DIRECT_ALIGN = 4096  # O_DIRECT wants offsets, lengths and buffer addresses aligned to the logical block
DIRECT_CHUNK = 8 << 20
_direct_buffers: list[Any] = []  # free aligned buffers (anonymous mmaps), reused by every save
_direct_lock = threading.Lock()


def _open_direct(path: str | os.PathLike[str]) -> int | None:
    """A new file opened for writing with ``O_DIRECT``, or None where the OS / file system has none (tmpfs)."""
    flag = getattr(os, "O_DIRECT", 0)
    if not flag:
        return None
    try:
        return os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | flag, 0o644)
    except OSError as e:
        if e.errno in (errno.EINVAL, errno.EOPNOTSUPP):
            return None
        raise


class _DirectFile:
    """Write-only file on an ``O_DIRECT`` descriptor. Bytes are gathered in aligned buffers (anonymous mmaps
    from a pool every save reuses); each full buffer is written by a helper thread with ``pwrite`` while the
    caller fills the other one, so serialization and the disk overlap as they do with the page cache. The
    unaligned tail is written padded at :meth:`close`, then the file is cut to its real size and fsynced.

    Why: a buffered write first fills page-cache pages, and on this VM pages the guest has not touched lately
    cost ~3x more than the disk write itself (108 MB to a new file: 340 ms buffered, 70 ms direct)."""

    def __init__(self, fd: int) -> None:
        self.fd = fd
        self.bufs = [_take_buffer(), _take_buffer()]
        self.views = [memoryview(b) for b in self.bufs]
        self.pending: list[Future[None] | None] = [None, None]
        self.cur = 0  # the buffer being filled
        self.fill = 0
        self.size = 0  # bytes written by the caller
        self.offset = 0  # file offset of the buffer being filled

    def write(self, b: Any) -> int:
        src = memoryview(b).cast("B")
        n, pos = src.nbytes, 0
        while pos < n:
            take = min(n - pos, DIRECT_CHUNK - self.fill)
            self.views[self.cur][self.fill : self.fill + take] = src[pos : pos + take]
            self.fill += take
            pos += take
            if self.fill == DIRECT_CHUNK:
                self._hand_off()
        self.size += n
        return n

    def _hand_off(self) -> None:
        """Write the full current buffer in the background; wait until the other one is free to fill."""
        self.pending[self.cur] = _direct_writer().submit(_pwrite_all, self.fd, self.views[self.cur], self.offset)
        self.offset += DIRECT_CHUNK
        self.cur, self.fill = 1 - self.cur, 0
        self._wait(self.cur)

    def _wait(self, i: int) -> None:
        fut, self.pending[i] = self.pending[i], None
        if fut is not None:
            fut.result()  # raises the write's OSError here

    def tell(self) -> int:
        return self.size

    def flush(self) -> None:
        """Nothing: a partial block cannot be written directly; :meth:`close` writes it."""

    def fileno(self) -> int:
        return self.fd

    def writable(self) -> bool:
        return True

    def close(self) -> None:
        """Wait for the background writes, write the tail, cut the padding, fsync, close."""
        if self.fd < 0:
            return
        try:
            self._wait(1 - self.cur)
            if self.fill:
                padded = -(-self.fill // DIRECT_ALIGN) * DIRECT_ALIGN
                self.views[self.cur][self.fill : padded] = bytes(padded - self.fill)
                _pwrite_all(self.fd, self.views[self.cur][:padded], self.offset)
                os.ftruncate(self.fd, self.size)
            os.fsync(self.fd)
        finally:
            self.abort()

    def abort(self) -> None:
        if self.fd < 0:
            return
        for fut in self.pending:  # never close the descriptor under a write in flight
            if fut is not None:
                with contextlib.suppress(Exception):
                    fut.result()
        os.close(self.fd)
        self.fd = -1
        for v in self.views:
            v.release()
        with _direct_lock:
            _direct_buffers.extend(self.bufs)


def _lower_this_thread(nice: int) -> None:
    """Give the calling background thread niceness ``nice`` (Linux sets it per thread), so that it runs
    when the training threads leave the core; never the main thread (a sync save writes from it)."""
    if nice <= 0 or threading.current_thread() is threading.main_thread() or not hasattr(os, "setpriority"):
        return
    with contextlib.suppress(OSError):
        tid = threading.get_native_id()
        os.setpriority(os.PRIO_PROCESS, tid, max(os.getpriority(os.PRIO_PROCESS, tid), nice))


def _take_buffer() -> Any:
    import mmap

    with _direct_lock:
        return _direct_buffers.pop() if _direct_buffers else mmap.mmap(-1, DIRECT_CHUNK)


def _pwrite_all(fd: int, view: memoryview, offset: int) -> None:
    done = 0
    while done < view.nbytes:
        try:
            done += os.pwrite(fd, view[done:], offset + done)
        except OSError as e:  # a file system that opened O_DIRECT but wants another alignment: go buffered
            import fcntl

            flags = fcntl.fcntl(fd, fcntl.F_GETFL)
            if e.errno != errno.EINVAL or not flags & os.O_DIRECT:
                raise
            fcntl.fcntl(fd, fcntl.F_SETFL, flags & ~os.O_DIRECT)


_direct_executor: Any = None  # the one helper thread that issues direct writes, per process


def _forget_direct_io_state() -> None:  # a forked child has neither the helper thread nor a lock holder
    global _direct_lock, _direct_executor
    _direct_lock = threading.Lock()
    _direct_executor = None


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_direct_io_state)


def _direct_writer() -> Any:
    """The helper thread that issues the direct writes (created on first use, in each process)."""
    global _direct_executor
    from concurrent.futures import ThreadPoolExecutor

    with _direct_lock:
        if _direct_executor is None:
            _direct_executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="disttrain-direct-io")
        return _direct_executor


class _CrcStream:
    """A write stream that CRC32s (and counts) every byte on its way to the file: no second read later.

    Every ``WRITEBACK_CHUNK`` bytes it also asks the kernel to start writing what it has so far to the disk
    (``sync_file_range(SYNC_FILE_RANGE_WRITE)``, which does not wait): the disk then works while the rest
    is serialized, instead of all of it waiting for the final fsync."""

    def __init__(self, raw: Any, kick: bool = True) -> None:
        self.raw = raw
        self.crc = 0
        self.size = 0
        self._kick = kick and _SYNC_FILE_RANGE is not None
        self._kicked = 0  # bytes handed to writeback so far

    def write(self, b: Any) -> int:
        view = memoryview(b)
        self.crc = zlib.crc32(view, self.crc)
        self.size += view.nbytes
        n = int(self.raw.write(view))
        if self._kick and self.size - self._kicked >= WRITEBACK_CHUNK:
            with contextlib.suppress(AttributeError, OSError, ValueError):  # not a plain file: no hint
                self.raw.flush()
                fd = self.raw.fileno()
                _SYNC_FILE_RANGE(fd, self._kicked, self.size - self._kicked, _SYNC_FILE_RANGE_WRITE)
                self._kicked = self.size
        return n

    def writelines(self, lines: Any) -> None:
        for b in lines:
            self.write(b)

    def writable(self) -> bool:
        return True

    def __getattr__(self, name: str) -> Any:  # tell, flush, fileno, close, ...: the file's own
        return getattr(self.raw, name)


class _ChecksummingFileSystem(FileSystem):
    """DCP's local file system; files opened for writing are checksummed as they are written."""

    def __init__(self, direct_io: bool = True) -> None:
        super().__init__()
        self.sums: dict[str, tuple[int, int]] = {}  # file name -> (size, crc32), once closed without error
        self.direct_io = direct_io

    @contextlib.contextmanager
    def create_stream(self, path: str | os.PathLike[str], mode: str) -> Iterator[Any]:
        fd = _open_direct(path) if self.direct_io and "w" in mode and str(path).endswith(".distcp") else None
        if fd is not None:  # shard files: straight to the disk
            raw = _DirectFile(fd)
            try:
                summed = _CrcStream(raw, kick=False)
                yield summed
                raw.close()
            finally:
                raw.abort()
            self.sums[Path(path).name] = (summed.size, summed.crc)
            return
        with super().create_stream(path, mode) as stream:
            if "w" not in mode:
                yield stream
                return
            summed = _CrcStream(stream)
            yield summed
        self.sums[Path(path).name] = (summed.size, summed.crc)


def _new_plan_key() -> str:
    """A fresh key for DCP's class-level save-plan cache (one per manager, renewed after a failed save)."""
    return f"disttrain-{uuid.uuid4().hex}"


@contextlib.contextmanager
def _zip_crc32_off() -> Iterator[None]:
    """Skip the CRC32 that ``torch.save`` computes for its zip records while DCP writes the shards.

    Our own stream already CRC32s every byte (zlib, ~2.3 GB/s here) and ``verify`` checks that; the zip's
    second CRC (miniz, ~1.6 GB/s) cost 65 ms of a 300 ms save of 108 MB per rank. ``torch.load`` reads such
    records normally. The option is process-wide; a ``torch.save`` on another thread meanwhile only loses its
    zip CRC, never data."""
    before = torch.serialization.get_crc32_options()
    torch.serialization.set_crc32_options(False)
    try:
        yield
    finally:
        torch.serialization.set_crc32_options(before)


class ChecksummingWriter(FileSystemWriter):
    """DCP's file writer that also leaves ``.checksums/rank<r>.json``: size and CRC32 of every shard file this
    rank wrote (plus the ``extra`` small files, name -> bytes, that it writes first: the rank's RNG state, so
    that an async save writes it in the background too), computed while writing. Rank 0 merges the sidecars
    into the manifest at commit instead of reading every rank's files back."""

    def __init__(
        self, path: Path, rank: int, step: int, extra: dict[str, bytes], direct_io: bool = True, nice: int = 0
    ) -> None:
        super().__init__(path)
        self.nice = nice
        self.summing_fs = _ChecksummingFileSystem(direct_io)
        self.fs = self.summing_fs
        self.sidecar_rank = rank
        self.step = step
        self.extra = extra

    def set_up_storage_writer(self, is_coordinator: bool, *args: Any, **kwargs: Any) -> None:
        """The coordinator removes what a crashed attempt at this step left in the folder. Safe without a
        barrier: every rank creates the folder next (``prepare_local_plan``, the coordinator after this), and
        no rank writes a file before the planning collective that the coordinator joins after both. An async
        save's upload thread (which also commits) gets ``nice`` here."""
        _lower_this_thread(self.nice)
        if is_coordinator and Path(self.path).exists():
            shutil.rmtree(self.path)
        super().set_up_storage_writer(is_coordinator, *args, **kwargs)

    def write_data(self, plan: Any, planner: Any) -> Any:
        fault_error("write_error", self.step, self.sidecar_rank)
        with _zip_crc32_off():
            fut = super().write_data(plan, planner)
        fut.wait()  # the file writer writes synchronously: raises here if it failed
        sums = {name: _write_small(Path(self.path) / name, data) for name, data in self.extra.items()}
        sums.update({n: s for n, s in self.summing_fs.sums.items() if n.endswith(".distcp")})
        folder = Path(self.path) / CHECKSUMS
        folder.mkdir(exist_ok=True)
        body = {name: {"size": size, "crc32": crc} for name, (size, crc) in sums.items()}
        (folder / f"rank{self.sidecar_rank}.json").write_text(json.dumps(body))
        return fut


def _write_small(path: Path, data: bytes) -> tuple[int, int]:
    """Write a small file of a save in progress (a rank's RNG state); returns its (size, crc32)."""
    path.parent.mkdir(exist_ok=True)
    with open(path, "wb") as f:
        f.write(data)
        f.flush()
        # Its data pages now; its size reaches the journal with the commit's fsyncs. A plain fsync here
        # costs ~0.3 s on ext4: it forces a journal commit that waits for the other ranks' writes.
        if _SYNC_FILE_RANGE is None:
            os.fsync(f.fileno())
        else:
            _SYNC_FILE_RANGE(f.fileno(), 0, len(data), 7)  # WAIT_BEFORE | WRITE | WAIT_AFTER
    return len(data), zlib.crc32(data)


def _collect_checksums(tmp: Path) -> dict[str, tuple[int, int]]:
    """Merge (and remove) the ranks' checksum sidecars of a save in progress: relative path -> (size, crc32)."""
    merged: dict[str, tuple[int, int]] = {}
    folder = tmp / CHECKSUMS
    if not folder.is_dir():
        return merged
    for f in sorted(folder.glob("rank*.json")):
        for name, meta in json.loads(f.read_text()).items():
            merged[name] = (int(meta["size"]), int(meta["crc32"]))
    shutil.rmtree(folder)
    return merged


class _RestrictedUnpickler(pickle.Unpickler):
    """Only what DCP metadata legitimately holds: its own dataclasses, torch sizes/dtypes, builtins."""

    ALLOWED_PREFIXES = ("torch.distributed.checkpoint.",)
    ALLOWED = frozenset(
        {
            ("torch", "Size"),
            ("torch", "device"),
            ("torch.serialization", "_get_layout"),  # looks a layout up by name
            ("pathlib", "PosixPath"),
            ("pathlib", "WindowsPath"),
            ("collections", "OrderedDict"),
            ("builtins", "set"),
            ("builtins", "frozenset"),
            ("builtins", "slice"),
        }
    )

    def find_class(self, module: str, name: str) -> Any:
        attr = getattr(torch, name, None) if module == "torch" else None
        torch_constant = isinstance(attr, (torch.dtype, torch.layout, torch.memory_format))
        if module.startswith(self.ALLOWED_PREFIXES) or (module, name) in self.ALLOWED or torch_constant:
            return super().find_class(module, name)
        raise pickle.UnpicklingError(f"global '{module}.{name}' is not allowed in checkpoint metadata")


def read_metadata_safely(ckpt: Path) -> Any:
    """DCP ``Metadata`` of a checkpoint folder, refusing pickles that would import arbitrary code."""
    path = ckpt / ".metadata"
    if not path.is_file():
        raise CheckpointError(f"{ckpt}: .metadata is missing")
    try:
        return _RestrictedUnpickler(io.BytesIO(path.read_bytes())).load()
    except Exception as e:
        raise CheckpointError(f"{ckpt}: .metadata is unreadable or untrusted ({e})") from None


_STORAGE_DTYPES = {
    "FloatStorage": torch.float32,
    "DoubleStorage": torch.float64,
    "HalfStorage": torch.float16,
    "BFloat16Storage": torch.bfloat16,
    "LongStorage": torch.int64,
    "IntStorage": torch.int32,
    "ShortStorage": torch.int16,
    "CharStorage": torch.int8,
    "ByteStorage": torch.uint8,
    "BoolStorage": torch.bool,
}


def _tensor_args(storage: Any, offset: int, size: Any, stride: Any, *_: Any) -> tuple[Any, ...]:
    return storage, offset, tuple(size), tuple(stride)


class _TensorHeaderUnpickler(pickle.Unpickler):
    """Reads the ``data.pkl`` of one ``torch.save``'d plain tensor as (storage, offset, size, stride) without
    building anything: the only callable it resolves is :func:`_tensor_args`; anything else is refused."""

    def find_class(self, module: str, name: str) -> Any:
        if (module, name) == ("torch._utils", "_rebuild_tensor_v2"):
            return _tensor_args
        if (module, name) == ("collections", "OrderedDict"):
            return dict
        if module == "torch" and name in _STORAGE_DTYPES:
            return name
        raise pickle.UnpicklingError(f"{module}.{name}")

    def persistent_load(self, pid: Any) -> Any:
        return pid  # ('storage', storage type name, key, location, numel)


class _ItemView:
    """Read-only file view of one item ``[start, start + length)`` of an open file. Its first 4 KiB are read
    up front (a ``torch.save`` zip keeps the tensor's header and the start of its data record there) and its
    last 4 KiB (the zip's central directory) only if a reader asks for them."""

    EDGE = 4096

    def __init__(self, fd: int, start: int, length: int) -> None:
        self.fd, self.start, self.length, self.pos = fd, start, length, 0
        self.head = os.pread(fd, min(length, self.EDGE), start)
        self.tail_at = max(length - self.EDGE, 0)
        self._tail: bytes | None = None

    @property
    def tail(self) -> bytes:
        if self._tail is None:
            self._tail = os.pread(self.fd, self.length - self.tail_at, self.start + self.tail_at)
        return self._tail

    def seek(self, offset: int, whence: int = 0) -> int:
        self.pos = offset + (0 if whence == 0 else self.pos if whence == 1 else self.length)
        return self.pos

    def tell(self) -> int:
        return self.pos

    def read(self, n: int = -1) -> bytes:
        end = self.length if n < 0 else min(self.pos + n, self.length)
        if end <= len(self.head):
            data = self.head[self.pos : end]
        elif self.pos >= self.tail_at:
            data = self.tail[self.pos - self.tail_at : end - self.tail_at]
        else:
            data = os.pread(self.fd, end - self.pos, self.start + self.pos)
        self.pos += len(data)
        return data

    def readinto(self, b: Any) -> int:
        view = memoryview(b).cast("B")
        data = self.read(view.nbytes)
        view[: len(data)] = data
        return len(data)

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True


def _plain_tensor_key(header: Any, dtype: torch.dtype, sizes: tuple[int, ...]) -> str | None:
    """The storage key of a ``torch.save``'d tensor's unpickled header if it is one plain, dense, row-major
    tensor of ``dtype`` and ``sizes`` starting at its storage's first element; else None."""
    storage, offset, size, stride = header
    _, type_name, key, _, numel = storage
    if _STORAGE_DTYPES.get(type_name) != dtype or size != sizes or offset != 0 or numel != math.prod(size):
        return None
    if not torch.empty_strided(size, stride, device="meta").is_contiguous():
        return None
    return str(key)


_ZIP_LOCAL = b"PK\x03\x04"
_ZIP_LOCAL_FIXED = struct.Struct("<4sHHHHHIIIHH")  # signature ... name length, extra length: 30 bytes


def _zip_local_headers(buf: bytes, pos: int) -> Iterator[tuple[str, int, int]]:
    """(name, method, data offset) of each zip local file header found in ``buf`` from ``pos`` on."""
    while (pos := buf.find(_ZIP_LOCAL, pos)) >= 0 and pos + _ZIP_LOCAL_FIXED.size <= len(buf):
        _, _, _, method, _, _, _, _, _, nlen, elen = _ZIP_LOCAL_FIXED.unpack_from(buf, pos)
        name_at = pos + _ZIP_LOCAL_FIXED.size
        yield buf[name_at : name_at + nlen].decode("utf-8", "replace"), method, name_at + nlen + elen
        pos = name_at


def _raw_tensor_data_from_head(head: bytes, length: int, dtype: torch.dtype, sizes: tuple[int, ...]) -> Any:
    """Fast path of :func:`_raw_tensor_data`: walk the local headers in the item's first bytes (``torch.save``
    writes ``data.pkl``, a few small records, then ``data/<key>``, uncompressed) without the central
    directory at the end, so one read of the head finds the data. None when anything is not as expected."""
    headers = _zip_local_headers(head, 0)
    first = next(headers, None)
    if first is None or not first[0].endswith("/data.pkl") or first[1] != 0:
        return None
    prefix = first[0][: -len("data.pkl")]
    stream = io.BytesIO(head[first[2] :])
    key = _plain_tensor_key(_TensorHeaderUnpickler(stream).load(), dtype, sizes)
    if key is None:
        return None
    nbytes = math.prod(sizes) * dtype.itemsize
    for name, method, data_at in _zip_local_headers(head, first[2] + stream.tell()):
        if name == f"{prefix}byteorder" and not head[data_at:].startswith(b"little"):
            return None
        if name == f"{prefix}data/{key}":
            return (data_at, nbytes) if method == 0 and data_at + nbytes <= length else None
    return None


def _raw_tensor_data(item: _ItemView, dtype: torch.dtype, sizes: tuple[int, ...]) -> tuple[int, int] | None:
    """(offset, nbytes) of the raw bytes of a ``torch.save``'d tensor (the file view ``item``) if it is one
    plain, dense, row-major tensor of ``dtype`` and ``sizes`` on a little-endian machine; else None."""
    if sys.byteorder != "little":
        return None
    try:
        fast = _raw_tensor_data_from_head(item.head, item.length, dtype, sizes)
        if fast is not None:
            return fast
        zf: Any = torch._C.PyTorchFileReader(item)  # type: ignore[call-overload]  # the zip's own index, from its central directory
        records = zf.get_all_records()
        data = [r for r in records if r.startswith("data/")]
        if len(data) != 1 or ("byteorder" in records and zf.get_record("byteorder") != b"little"):
            return None
        key = _plain_tensor_key(_TensorHeaderUnpickler(io.BytesIO(zf.get_record("data.pkl"))).load(), dtype, sizes)
        if key is None or f"data/{key}" != data[0]:
            return None
        return int(zf.get_record_offset(data[0])), math.prod(sizes) * dtype.itemsize
    except Exception:  # anything unexpected: DCP's own (slower) path decides
        return None


class SafeFileSystemReader(dcp.FileSystemReader):
    """DCP's file reader, but ``.metadata`` goes through the restricted unpickler, and tensors are read
    straight from the file into the tensors being loaded.

    DCP's reader ``torch.load``s every tensor (its Python ``weights_only`` unpickler, a new tensor, then a
    copy into the target): CPU-bound, 3-10x slower than the disk here. A tensor DCP wrote with ``torch.save``
    is a small zip whose one record is the raw bytes; when the header says it is a plain dense tensor of the
    expected dtype and shape, we ``readinto`` the target's memory (or a buffer, for a slice of it) directly.
    Anything else goes through DCP's path."""

    def __init__(self, path: str | os.PathLike[str], rank: int = 0) -> None:
        super().__init__(path)
        self._rank = rank  # which file to read first (see read_data)

    def set_up_storage_reader(self, metadata: Any, is_coordinator: bool, *args: Any, **kwargs: Any) -> None:
        from torch.distributed.checkpoint.metadata import TensorStorageMetadata

        super().set_up_storage_reader(metadata, is_coordinator, *args, **kwargs)
        self._chunks: dict[tuple[str, tuple[int, ...]], tuple[torch.dtype, tuple[int, ...]]] = {}
        for fqn, md in metadata.state_dict_metadata.items():
            if isinstance(md, TensorStorageMetadata):
                for ch in md.chunks:
                    self._chunks[(fqn, tuple(ch.offsets))] = (md.properties.dtype, tuple(ch.sizes))

    def read_data(self, plan: Any, planner: Any) -> Any:
        from torch.distributed.checkpoint.planner import LoadItemType, LoadPlan
        from torch.futures import Future as TorchFuture

        per_file: dict[str, list[Any]] = {}
        for req in plan.items:
            per_file.setdefault(self.storage_data[req.storage_index].relative_path, []).append(req)
        # Every rank starts with a different file: ranks that all need every file (DDP: replicated state)
        # read different parts of the disk at once, then each other's files from the page cache, instead of
        # all waiting on the same pages (2 ranks, 216 MB cold, 12 paired loads: median 209 -> 200 ms here).
        files = sorted(per_file)
        first = self._rank % len(files) if files else 0
        rest = []
        for rel in files[first:] + files[:first]:
            reqs = per_file[rel]
            with open(Path(self.path) / rel, "rb", buffering=0) as f:
                for req in sorted(reqs, key=lambda r: self.storage_data[r.storage_index].offset):
                    if req.type == LoadItemType.BYTE_IO or not self._read_tensor(f, req, planner):
                        rest.append(req)
        if rest:  # DCP's own path for whatever the fast one did not take
            super().read_data(LoadPlan(rest, plan.storage_data, plan.planner_data), planner).wait()
        fut: TorchFuture[None] = TorchFuture()
        fut.set_result(None)
        return fut

    def _read_tensor(self, f: Any, req: Any, planner: Any) -> bool:
        md = self.storage_data[req.storage_index]
        if md.transform_descriptors:
            return False
        chunk = self._chunks.get((req.storage_index.fqn, tuple(req.storage_index.offset or ())))
        if chunk is None:
            return False
        dtype, sizes = chunk
        found = _raw_tensor_data(_ItemView(f.fileno(), md.offset, md.length), dtype, sizes)
        if found is None:
            return False
        rec_offset, nbytes = found
        target = planner.resolve_tensor(req).detach()
        whole = tuple(req.storage_offsets) == (0,) * len(sizes) and tuple(req.lengths) == sizes
        direct = whole and target.dtype == dtype and target.is_contiguous() and target.device.type == "cpu"
        buf = target if direct else torch.empty(sizes, dtype=dtype)
        f.seek(md.offset + rec_offset)
        view = memoryview(buf.reshape(-1).view(torch.uint8).numpy())  # type: ignore[arg-type]
        got = f.readinto(view) if nbytes else 0
        while got < nbytes:  # short reads: keep going
            more = f.readinto(view[got:])
            if not more:
                raise CheckpointError(f"{Path(self.path) / md.relative_path}: ends inside {req.storage_index.fqn}")
            got += more
        if not direct:
            region = buf
            for dim, (start, length) in enumerate(zip(req.storage_offsets, req.lengths, strict=True)):
                region = region.narrow(dim, start, length)
            target.copy_(region)
        planner.commit_tensor(req, target)
        return True

    def read_metadata(self, *args: Any, **kwargs: Any) -> Any:
        from torch.distributed.checkpoint.metadata import StorageMeta

        if kwargs.get("rank") is not None:  # DCP's fallback to per-rank metadata: not a format we write
            raise CheckpointError(f"{self.path}: no usable .metadata")
        md = read_metadata_safely(Path(self.path))
        if getattr(md, "storage_meta", None) is None:
            md.storage_meta = StorageMeta()
        md.storage_meta.load_id = self.load_id
        return md


class WeightsOnlyBytes:
    """Planner mixin: non-tensor items (optimizer param groups, loop state) load with ``weights_only=True``
    (DCP's default planner uses ``weights_only=False``, which can run code from a tampered shard)."""

    flatten_state_dict: bool
    original_state_dict: Any
    mappings: Any
    state_dict: Any

    def load_bytes(self, read_item: Any, value: io.BytesIO) -> None:
        from torch.distributed.checkpoint._traverse import set_element

        obj = torch.load(value, weights_only=True)
        if self.flatten_state_dict:
            set_element(self.original_state_dict, self.mappings[read_item.dest_index.fqn], obj)
        else:
            self.state_dict[read_item.dest_index.fqn] = obj


class SafeLoadPlanner(WeightsOnlyBytes, DefaultLoadPlanner):
    """DCP's default load planner, loading non-tensor items ``weights_only``."""


@dataclass(frozen=True)
class CheckpointInfo:
    path: Path
    step: int
    complete: bool
    problem: str | None
    manifest: dict[str, Any] | None

    @property
    def usable(self) -> bool:
        return self.complete and self.problem is None


def inspect_folder(path: Path, checksums: bool = False) -> CheckpointInfo:
    """Is ``path`` a complete, intact checkpoint? (sizes always; CRC32s when ``checksums``)."""
    m = STEP_RE.match(path.name)
    step = int(m.group(1)) if m else -1
    if not (path / MARKER).is_file():
        return CheckpointInfo(path, step, False, "no COMMITTED marker (the save did not finish)", None)
    try:
        manifest = json.loads((path / MANIFEST).read_text())
    except (OSError, ValueError) as e:
        return CheckpointInfo(path, step, True, f"manifest.json unreadable ({e})", None)
    for name, meta in manifest["files"].items():
        f = path / name
        if not f.is_file():
            return CheckpointInfo(path, step, True, f"{name} is missing", manifest)
        size = f.stat().st_size
        if size != meta["size"]:
            return CheckpointInfo(path, step, True, f"{name} has {size} bytes, expected {meta['size']}", manifest)
        if checksums and crc32_file(f) != meta["crc32"]:
            return CheckpointInfo(path, step, True, f"{name} fails its CRC32 check (corrupted)", manifest)
    try:
        read_metadata_safely(path)
    except CheckpointError as e:
        return CheckpointInfo(path, step, True, str(e).split(": ", 1)[-1], manifest)
    return CheckpointInfo(path, step, True, None, manifest)


def list_checkpoints(folder: Path, checksums: bool = False) -> list[CheckpointInfo]:
    """Every ``step-N`` and ``.tmp-step-N`` folder, oldest first."""
    if not folder.is_dir():
        return []
    found = []
    for p in folder.iterdir():
        if p.is_dir() and (STEP_RE.match(p.name) or p.name.startswith(".tmp-step-")):
            info = inspect_folder(p, checksums)
            if p.name.startswith(".tmp-step-"):
                step = int(p.name.rsplit("-", 1)[-1])
                info = CheckpointInfo(p, step, False, "unfinished save (temporary folder)", None)
            found.append(info)
    return sorted(found, key=lambda i: (i.step, i.path.name))


# -- the manager ------------------------------------------------------------------------------------
def _bytes_of(storage: torch.UntypedStorage) -> torch.Tensor:
    return torch.empty(0, dtype=torch.uint8).set_(storage)  # type: ignore[call-overload]


class _BatchedCopyStager(StateDictStager):
    """DCP's state-dict stager (a deep copy whose tensors land in cached CPU storages, reused every save),
    except that the copies of CPU storages are gathered during the walk and done in one
    ``torch._foreach_copy_``, which releases the GIL for the whole copy. DCP's per-storage ``copy_`` holds
    it: a background copy then stalled the training thread in 5 ms slices (the switch interval), up to
    ~45 ms per ``save()``, and slowed the next step. Other devices (pinned, non-blocking CUDA copies) go
    DCP's way."""

    def __init__(self, share_memory: bool) -> None:
        super().__init__(pin_memory=False, share_memory=share_memory)
        self._pairs: list[tuple[torch.UntypedStorage, torch.UntypedStorage]] = []

    def stage(self, state_dict: Any, non_blocking: bool = False) -> Any:
        self._pairs = []
        try:
            staged = super().stage(state_dict, non_blocking)
            if self._pairs:
                torch._foreach_copy_([_bytes_of(d) for d, _ in self._pairs], [_bytes_of(s) for _, s in self._pairs])
        finally:
            self._pairs = []
        return staged

    def _stage_untyped_storage(self, storage: Any, non_blocking: bool = False) -> Any:
        if storage.device.type != "cpu":
            return super()._stage_untyped_storage(storage, non_blocking)
        cached = self._cached_storage_mapping.get(storage)
        if cached is None or cached.size() != storage.size():
            size = storage.size()
            cached = type(storage)._new_shared(size, device="cpu") if self.share_memory else type(storage)(size)
            self._cached_storage_mapping[storage] = cached
        self._pairs.append((cached, storage))
        return cached


class _DeferredStager(DefaultStager):
    """DCP's stager (copy into reused CPU buffers on its own thread), except that the copy starts when
    :meth:`start` is called rather than inside ``async_save``. Started at once, the copy thread (a Python walk
    over hundreds of tensors) competes for the GIL with the rest of ``async_save`` on the training thread:
    ``save()`` blocked the loop 15-30 ms here instead of ~10. ``stage`` hands DCP a future that the copy
    thread completes."""

    def __init__(self, config: StagingOptions, nice: int = 0) -> None:
        super().__init__(config)
        self.nice = nice
        if not config.use_pinned_memory:
            self._state_dict_stager = _BatchedCopyStager(config.use_shared_memory)
        self._deferred: tuple[Any, dict[str, Any], Future[Any]] | None = None

    def stage(self, state_dict: Any, **kwargs: Any) -> Future[Any]:
        fut: Future[Any] = Future()
        self._deferred = (state_dict, kwargs, fut)
        return fut

    def start(self) -> None:
        """Begin the copy staged last (a no-op when there is none)."""
        if self._deferred is None:
            return
        state_dict, kwargs, fut = self._deferred
        self._deferred = None

        def copy() -> None:
            _lower_this_thread(self.nice)
            try:
                fut.set_result(self._stage(state_dict, **kwargs))
            except BaseException as e:  # the save's upload thread reports it
                fut.set_exception(e)

        assert self._staging_executor is not None  # use_async_staging is on
        self._staging_executor.submit(copy)
        self._staging_future = fut


class CheckpointManager:
    """Owns the checkpoint lifecycle of one job: ``save`` / ``load`` / ``wait`` / ``close``."""

    def __init__(
        self,
        folder: str | Path,
        cfg: CheckpointConfig,
        *,
        rank: int = 0,
        world_size: int = 1,
        strategy: str = "single",
    ) -> None:
        self.folder = Path(folder)
        self.cfg = cfg
        self.rank = rank
        self.world_size = world_size
        self.strategy = strategy
        self._pending: tuple[int, threading.Event] | None = None
        self._staging: Future[Any] | None = None  # the in-flight async save's copy of the state
        self._purger: threading.Thread | None = None
        self.last_saved_step: int | None = None
        self.blocked_s: list[float] = []  # training-thread time spent in save() per save
        self.staging_wait_s: list[float] = []  # per async save: time wait_for_staging() blocked the loop
        self.failures: list[str] = []
        self._t_save = 0.0
        self._stager: _DeferredStager | None = None
        self._plan_key = _new_plan_key()
        self._pg = None
        if dist.is_initialized() and cfg.async_mode != "off":
            # async saves run collectives from a background thread: give them their own gloo group
            self._pg = dist.new_group(backend="gloo")
        if rank == 0:
            self.folder.mkdir(parents=True, exist_ok=True)

    # ---- save ----
    def save(self, step: int, state: dict[str, Any]) -> None:
        """Checkpoint ``state`` (Stateful objects and plain dicts) as step ``step``; async if configured."""
        t0 = time.perf_counter()
        with paused_gc():  # state dicts, plans, staging: thousands of small objects, no full collection here
            self._save(step, state)
        self.blocked_s.append(time.perf_counter() - t0)

    def _save(self, step: int, state: dict[str, Any]) -> None:
        self.wait()  # one save in flight at most
        self._t_save = time.time()
        tmp = self.folder / f".tmp-step-{step:08d}"  # the writers clear and create it: no barrier here
        rng = io.BytesIO()
        torch.save(rng_state(), rng)  # taken now; the writer writes it (in the background when async)
        writer = ChecksummingWriter(
            tmp,
            self.rank,
            step,
            {_RNG_FILE.format(self.rank): rng.getvalue()},
            direct_io=self.cfg.direct_io,
            nice=self.cfg.background_nice,
        )
        fault_point("before_shards", step, self.rank)
        if self.cfg.async_mode == "off":
            try:
                dcp.save(
                    state,
                    storage_writer=writer,
                    planner=self._save_planner(),
                    process_group=self._pg,
                    no_dist=not dist.is_initialized(),
                )
            except BaseException:
                self._plan_key = _new_plan_key()  # every rank saw the failure: every rank plans afresh
                raise
            fault_point("after_shards", step, self.rank)
            self._commit(step, tmp)
        else:
            from torch.distributed.checkpoint.state_dict_saver import AsyncCheckpointerType, AsyncSaveResponse

            kind = AsyncCheckpointerType.PROCESS if self.cfg.async_mode == "process" else AsyncCheckpointerType.THREAD
            stager = self._get_stager()
            try:
                fut = dcp.async_save(
                    state,
                    storage_writer=writer,
                    planner=self._save_planner(),
                    process_group=self._pg,
                    async_checkpointer_type=kind,
                    async_stager=stager,
                    no_dist=not dist.is_initialized(),
                )
            finally:
                stager.start()  # also when async_save failed: its upload thread must not wait forever
            upload: Any = fut
            if isinstance(fut, AsyncSaveResponse):  # the copy runs in the background: wait_for_staging()
                upload, self._staging = fut.upload_completion, fut.staging_completion
            done = threading.Event()

            def on_done(f: Future[Any]) -> None:  # runs as soon as every rank's shard is written
                try:
                    self._finish(step, tmp, f)
                finally:
                    done.set()

            upload.add_done_callback(on_done)
            self._pending = (step, done)

    def _save_planner(self) -> DefaultSavePlanner:
        """DCP's planner with plan caching: after the first save, a rank whose plan did not change sends an
        empty one and the coordinator reuses the cached global plan and metadata (a 216 MB save on 2 ranks:
        median 290 -> 190 ms here, mostly less waiting in the planning collectives). Structure changes (the
        optimizer's state appearing after step 0) are detected by DCP, which plans those ranks again. The
        cache is keyed per manager, and dropped after a failed save."""
        planner = DefaultSavePlanner(enable_plan_caching=True)
        planner._cached_plans_key = self._plan_key
        return planner

    def _get_stager(self) -> _DeferredStager:
        """One stager for the job: its CPU buffers are reused by every save (0.20 -> 0.12 of a sync save's time,
        benchmarks/bench_checkpoint.py). Safe because a save starts only after the previous one is written.
        The copy itself runs on the stager's own thread, started as ``save()`` returns (:class:`_DeferredStager`),
        and the loop waits for the copy only before it next changes the state (:meth:`wait_for_staging`).
        Pinned memory and a non-blocking copy where CUDA is."""
        if self._stager is None:
            cuda = torch.cuda.is_available()
            options = StagingOptions(cuda, self.cfg.async_mode == "process", True, cuda)
            self._stager = _DeferredStager(options, self.cfg.background_nice)
        return self._stager

    def wait_for_staging(self) -> None:
        """Block until the in-flight async save has copied the state it saves. Call it before anything changes
        that state in place (the optimizer step); the time it blocks is kept in ``staging_wait_s``."""
        if self._staging is None:
            return
        t0 = time.perf_counter()
        with contextlib.suppress(Exception, CheckpointException):  # a failed copy fails the save: see _finish
            self._staging.result()
        self._staging = None
        self.staging_wait_s.append(time.perf_counter() - t0)

    def wait(self) -> None:
        """Block until the in-flight save (if any) is written and committed."""
        self.wait_for_staging()
        if self._pending is not None:
            self._pending[1].wait()
            self._pending = None

    def _finish(self, step: int, tmp: Path, fut: Future[Any]) -> None:
        """Commit a finished background save; a failed one is reported, never committed, and training goes on."""
        try:
            fut.result()
            fault_point("after_shards", step, self.rank)
            self._commit(step, tmp)
        except (Exception, CheckpointException) as e:  # DCP's CheckpointException is a BaseException
            self._plan_key = _new_plan_key()  # DCP raised on every rank: every rank plans afresh next time
            msg = f"checkpoint at step {step} failed and was not committed: {_describe_failure(e)}"
            self.failures.append(msg)
            log.error(msg)
            if self.rank == 0:
                print(f"disttrain: warning: {msg}", flush=True)

    def _commit(self, step: int, tmp: Path) -> None:
        if self.rank == 0:
            sums = _collect_checksums(tmp)
            files = {}
            for p in sorted(tmp.rglob("*")):
                if not p.is_file():
                    continue
                name, size = str(p.relative_to(tmp)), p.stat().st_size
                known = sums.get(name)
                if known is not None and known[0] != size:
                    raise CheckpointError(
                        f"{p}: {size} bytes on disk, but its writer wrote {known[0]}: the file changed or was "
                        "cut short after it was written; not committing this checkpoint (check the disk)"
                    )
                # the ranks checksummed their shards while writing; the rest (.metadata) is small
                files[name] = {"size": size, "crc32": known[1] if known is not None else crc32_file(p)}
            manifest = {
                "format": FORMAT_VERSION,
                "step": step,
                "world_size": self.world_size,
                "strategy": self.strategy,
                "torch": torch.__version__,
                "time": time.time(),
                "files": files,
            }
            _write_synced(tmp / MANIFEST, json.dumps(manifest, indent=1).encode())
            final = self.folder / f"step-{step:08d}"
            if final.exists():
                shutil.rmtree(final)
            os.rename(tmp, final)
            _fsync_dir(self.folder)
            fault_point("before_marker", step, self.rank)
            _write_synced(final / MARKER, b"ok\n")
            _fsync_dir(final)
            log.info(
                "checkpoint step %d committed: %s (%.2fs after the save began)", step, final, time.time() - self._t_save
            )
            self._purge_in_background()
        self.last_saved_step = step

    def _purge_in_background(self) -> None:
        if self._purger is not None:
            self._purger.join()

        def purge() -> None:
            _lower_this_thread(self.cfg.background_nice)
            self.purge()

        self._purger = threading.Thread(target=purge, name="disttrain-ckpt-purge", daemon=True)
        self._purger.start()

    def purge(self) -> list[Path]:
        """Delete complete checkpoints beyond the newest ``keep_latest``, and unfinished ones older than the
        newest complete one. Never deletes the newest complete checkpoint."""
        infos = list_checkpoints(self.folder)
        complete = [i for i in infos if i.usable]
        if not complete:
            return []
        keep = {i.path for i in complete[-self.cfg.keep_latest :]}
        newest = complete[-1].step
        doomed = [i.path for i in infos if i.path not in keep and (i.usable or i.step < newest)]
        for p in doomed:
            shutil.rmtree(p, ignore_errors=True)
        return doomed

    # ---- load ----
    def latest(self) -> CheckpointInfo | None:
        """The newest complete, intact checkpoint; broken ones are skipped with a warning naming them."""
        for info in reversed(list_checkpoints(self.folder)):
            if info.usable:
                return info
            if self.rank == 0 and info.complete:
                msg = f"skipping checkpoint {info.path}: {info.problem}"
                log.warning(msg)
                print(f"disttrain: warning: {msg}", flush=True)
        return None

    def resolve(self, spec: str) -> CheckpointInfo | None:
        """What ``checkpoint.resume`` points at: auto (newest usable), never, a step number, or a path."""
        if spec == "never":
            return None
        if spec == "auto":
            return self.latest()
        path = self.folder / f"step-{int(spec):08d}" if spec.isdigit() else Path(spec)
        info = inspect_folder(path)
        if not info.usable:
            raise CheckpointError(f"checkpoint.resume={spec!r}: {path} cannot be used: {info.problem}")
        return info

    def load(self, state: dict[str, Any], info: CheckpointInfo) -> int:
        """Load ``state`` in place from ``info`` (resharding to this world size); returns its step.

        Every rank plans and reads on its own (``no_dist``): DCP's default load planning involves no global
        coordination (its global step returns the local plans unchanged), so its two collectives only
        pickled ~80 KB plans to rank 0 and back (10-20 ms of a 100 ms warm load here). One small all-gather
        afterwards keeps a failure collective: every rank raises, naming the rank(s) that failed."""
        self.wait()
        error: str | None = None
        try:
            fault_error("read_error", info.step, self.rank)
            # paused GC: DCP's plans are thousands of small objects, no full collection in the middle
            with paused_gc(), warnings.catch_warnings():
                warnings.filterwarnings("ignore", "torch.distributed is disabled", UserWarning)  # no_dist: meant
                dcp.load(
                    state,
                    no_dist=True,
                    storage_reader=SafeFileSystemReader(info.path, rank=self.rank),
                    planner=SafeLoadPlanner(),
                )
            rng_file = info.path / _RNG_FILE.format(self.rank)
            same_world = (info.manifest or {}).get("world_size") == self.world_size
            if same_world and rng_file.is_file():
                set_rng_state(torch.load(rng_file, weights_only=True))
        except (Exception, CheckpointException) as e:  # DCP's CheckpointException is a BaseException
            error = "; ".join(f"{type(x).__name__}: {x}" for _, x in _failures(e))
        errors = [error]
        if dist.is_initialized():
            errors = [None] * dist.get_world_size(self._pg)
            dist.all_gather_object(errors, error, group=self._pg)
        failed = [f"rank {r}: {err}" for r, err in enumerate(errors) if err]
        if failed:
            raise CheckpointError(f"{info.path}: loading failed ({'; '.join(failed)})")
        return info.step

    # ---- shutdown ----
    def close(self) -> None:
        self.wait()
        if self._purger is not None:
            self._purger.join()
        if self._stager is not None:
            self._stager.close()
            self._stager = None
        if self.cfg.async_mode == "process":
            _stop_checkpoint_process()
        self._barrier()

    def _barrier(self) -> None:
        if dist.is_initialized():
            dist.barrier(group=self._pg)


def _failures(e: BaseException) -> list[tuple[int | None, BaseException]]:
    """(rank, exception) per failed rank of DCP's CheckpointException (which wraps every rank's); else
    ``[(None, e)]``."""
    failures = getattr(e, "failures", None)
    if isinstance(e, CheckpointException) and isinstance(failures, dict) and failures:
        return [(r, w[0] if isinstance(w, tuple) else w) for r, w in sorted(failures.items())]
    return [(None, e)]


def _describe_failure(e: BaseException) -> str:
    """One line per failed rank for DCP's CheckpointException (whose text is every rank's traceback)."""
    return "; ".join(f"{'' if r is None else f'rank {r}: '}{type(x).__name__}: {x}" for r, x in _failures(e))


def _stop_checkpoint_process() -> None:
    """Ask DCP's background save process to exit (it otherwise dies noisily when the trainer exits)."""
    from torch.distributed.checkpoint import _async_process_executor as ape

    proc = getattr(ape, "_CHECKPOINT_PROCESS", None)
    if proc is not None:
        with contextlib.suppress(Exception):
            proc.__del__()
        ape._CHECKPOINT_PROCESS = None


def rng_state() -> dict[str, torch.Tensor]:
    state = {"torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state()
    return state


def set_rng_state(state: dict[str, torch.Tensor]) -> None:
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state(state["cuda"])


_FIRED: set[str] = set()


def fault_matches(name: str, step: int, rank: int, once: bool = False) -> bool:
    """Does DISTTRAIN_FAULT (comma-separated '<point>:<step>:<rank>' specs) name this point? First attempt
    only (a job restarted by torchrun then runs through); with ``once``, each spec fires once per process.
    Points: checkpoint/step points SIGKILL (:func:`fault_point`); hang, slow, nan: see disttrain.health."""
    if os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") != "0":
        return False
    spec = f"{name}:{step}:{rank}"
    if spec not in os.environ.get("DISTTRAIN_FAULT", "").split(",") or (once and spec in _FIRED):
        return False
    _FIRED.add(spec)
    return True


def fault_point(name: str, step: int, rank: int) -> None:
    """Fault injection for tests: DISTTRAIN_FAULT='<point>:<step>:<rank>' SIGKILLs this process there."""
    if fault_matches(name, step, rank):
        os.kill(os.getpid(), signal.SIGKILL)


def fault_error(name: str, step: int, rank: int) -> None:
    """Fault injection for tests: with '<point>:<step>:<rank>' among DISTTRAIN_FAULT's comma-separated specs,
    raise an I/O error there (a failing disk) instead of killing the process."""
    if f"{name}:{step}:{rank}" in os.environ.get("DISTTRAIN_FAULT", "").split(","):
        raise OSError(errno.EIO, f"injected I/O error (DISTTRAIN_FAULT={name}:{step}:{rank})")


# -- export -----------------------------------------------------------------------------------------


def write_weights(state: dict[str, torch.Tensor], path: Path, dtype: str = "fp32") -> Path:
    """One file of plain model weights: ``.safetensors`` by suffix, else ``torch.save`` (weights_only-loadable)."""
    cast = {k: v.detach().to("cpu", DTYPES[dtype]).contiguous() for k, v in state.items()}
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    if path.suffix == ".safetensors":
        from safetensors.torch import save_file

        save_file(cast, str(tmp))
    else:
        torch.save(cast, tmp)
    os.replace(tmp, path)
    return path


def export_live_model(model: nn.Module, path: Path, dtype: str = "fp32") -> Path | None:
    """Gather the full model to rank 0 and write it there (collective: every rank calls it)."""
    from torch.distributed.checkpoint.state_dict import get_model_state_dict

    sd = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    if dist.is_initialized() and dist.get_rank() != 0:
        return None
    return write_weights(sd, path, dtype)  # type: ignore[arg-type]
