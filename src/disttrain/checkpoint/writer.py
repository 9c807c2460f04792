"""Writing a checkpoint's shard files: DCP's file writer with each file CRC32'd as it is written
(``ChecksummingWriter``), shard files on ``O_DIRECT`` descriptors (``_DirectFile``), and tensors written as the
exact bytes ``torch.save`` would write without pickling them (``write_tensor_record``)."""

from __future__ import annotations

import contextlib
import errno
import functools
import json
import os
import queue
import shutil
import sys
import threading
import zlib
from collections.abc import Iterator
from concurrent.futures import Future
from pathlib import Path
from typing import IO, Any, cast

import numpy as np
import torch
from torch.distributed.checkpoint.filesystem import (
    FileSystem,
    FileSystemWriter,
    SerializationFormat,
    _StorageInfo,
    _write_item,
)
from torch.distributed.checkpoint.planner import WriteItemType
from torch.distributed.checkpoint.storage import WriteResult

from disttrain.checkpoint.reader import _zip_local_headers
from disttrain.utils.faults import fault_error

CHECKSUMS = ".checksums"  # per-rank CRC32 sidecars inside a .tmp-step-N folder, merged into the manifest
_TORCH_SAVE = SerializationFormat.TORCH_SAVE


def _bytes_of(storage: torch.UntypedStorage) -> torch.Tensor:
    return torch.empty(0, dtype=torch.uint8).set_(storage)  # type: ignore[call-overload]


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


_RecordKey = tuple[Any, ...]
_record_templates: dict[_RecordKey, tuple[bytes, bytes] | None] = {}  # tensor layout -> (head, tail) or None
_MAX_TEMPLATES = 4096  # ~2 KB each


def _record_key(tensor: torch.Tensor) -> _RecordKey | None:
    """What the bytes ``torch.save(tensor)`` writes depend on, except the data: None for any tensor that
    is not one plain CPU tensor whose storage holds exactly its own bytes."""
    if (
        type(tensor) is not torch.Tensor
        or tensor.device.type != "cpu"
        or tensor.layout != torch.strided
        or tensor.requires_grad
        or tensor.is_quantized
        or tensor.is_conj()
        or tensor.is_neg()
        or tensor.untyped_storage().nbytes() != tensor.nbytes
        or torch.serialization.get_crc32_options()
    ):
        return None
    return (
        tensor.dtype,
        tuple(tensor.shape),
        tuple(tensor.stride()),
        tensor.storage_offset(),
        torch.serialization._get_storage_alignment(),
    )


class _Capture:
    """A write-only stream that keeps the bytes of every write except the tensor's data (recognised by its
    address: ``torch.save`` hands the storage itself to the stream), of which it keeps only the position.
    A template so costs no copy of the tensor."""

    def __init__(self, tensor: torch.Tensor) -> None:
        self.head: list[bytes] = []
        self.tail: list[bytes] = []
        self.data = (tensor.data_ptr(), tensor.nbytes)
        self.size = 0
        self.data_at = -1

    def write(self, b: Any) -> int:
        view = memoryview(b)
        n = view.nbytes
        if self.data_at < 0 and n and (np.frombuffer(view, np.uint8).ctypes.data, n) == self.data:
            self.data_at = self.size
        else:
            (self.head if self.data_at < 0 else self.tail).append(bytes(view))
        self.size += n
        return n

    def tell(self) -> int:
        return self.size

    def flush(self) -> None:
        pass


def _record_template(tensor: torch.Tensor) -> tuple[bytes, bytes] | None:
    """``torch.save(tensor)`` split into the bytes before and after its data record, if that is one plain
    (stored) zip record holding exactly the tensor's bytes; else None."""
    capture = _Capture(tensor)
    torch.save(tensor, cast(IO[bytes], capture))
    head = b"".join(capture.head)
    records = [(method, at) for name, method, at in _zip_local_headers(head, 0) if "/data/" in name]
    if capture.data_at != len(head) or records != [(0, len(head))]:
        return None
    return head, b"".join(capture.tail)


@functools.cache
def _records_are_data_independent() -> bool:
    """Check once per process that two tensors of one layout but different data give the same bytes
    around their data record (true for ``torch.save`` with the zip CRC off: no record, offset or
    serialization id depends on the data), so that a template made from one tensor is right for all."""
    probe = torch.arange(24, dtype=torch.float32).reshape(4, 6)
    first = _record_template(probe)
    return first is not None and first == _record_template(-probe - 1)


def write_tensor_record(stream: Any, tensor: torch.Tensor) -> bool:
    """Write exactly the bytes ``torch.save(tensor, stream)`` would, from a cached head and tail per tensor
    layout around the tensor's raw bytes: no pickling, 3 writes instead of ~40. False (nothing written)
    where that does not apply; the caller then uses ``torch.save``."""
    key = _record_key(tensor)
    if key is None or sys.byteorder != "little" or not _records_are_data_independent():
        return False
    if key not in _record_templates:
        if len(_record_templates) >= _MAX_TEMPLATES:  # a process saving many different models: start over
            _record_templates.clear()
        _record_templates[key] = _record_template(tensor)
    template = _record_templates[key]
    if template is None:
        return False
    stream.write(template[0])
    if tensor.nbytes:
        stream.write(_bytes_of(tensor.untyped_storage()).numpy())
    stream.write(template[1])
    return True


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

    def _write_data(self, planner: Any, file_queue: Any) -> Any:
        """DCP's file loop for one writer thread and no stream transforms, with tensors written by
        :func:`write_tensor_record` (the bytes ``torch.save`` would write, without pickling); anything else
        goes DCP's own way."""
        if self.thread_count != 1 or self.transforms.extensions or self.serialization_format != _TORCH_SAVE:
            return super()._write_data(planner, file_queue)
        results: list[Any] = []
        while True:
            try:
                path, storage_key, items = file_queue.get_nowait()
            except queue.Empty:
                break
            results += self._write_file(planner, path, storage_key, items)
        fut: torch.futures.Future[list[Any]] = torch.futures.Future()
        fut.set_result(results)
        return fut

    def _write_file(self, planner: Any, path: Any, storage_key: str, items: list[Any]) -> list[Any]:
        results = []
        blobs = [wi for wi in items if wi.type == WriteItemType.BYTE_IO]
        tensors = [wi for wi in items if wi.type != WriteItemType.BYTE_IO]
        with self.fs.create_stream(path, "wb") as stream:
            for wi in blobs:
                data = planner.resolve_data(wi)
                results.append(_write_item(self.transforms, stream, data, wi, storage_key, _TORCH_SAVE))
            for wi in tensors:
                tensor = planner.resolve_data(wi).detach().cpu()
                if tensor.untyped_storage().size() != tensor.nbytes:  # as DCP: only the tensor's own bytes
                    tensor = tensor.clone()
                offset = stream.tell()
                if not write_tensor_record(stream, tensor):
                    results.append(_write_item(self.transforms, stream, tensor, wi, storage_key, _TORCH_SAVE))
                    continue
                length = stream.tell() - offset
                results.append(WriteResult(wi.index, length, _StorageInfo(storage_key, offset, length)))
            if self.sync_files:
                os.fsync(stream.fileno())
            stream.close()
        return results

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
