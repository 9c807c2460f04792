"""Writing files straight to the disk: ``O_DIRECT`` files written from aligned buffers by a helper thread
(``DirectFile``), the kernel's writeback started early (``sync_file_range``), and background threads that yield
the core to training (``lower_this_thread``)."""

from __future__ import annotations

import contextlib
import errno
import os
import threading
from concurrent.futures import Future
from typing import Any


def _libc_sync_file_range() -> Any:
    """Linux ``sync_file_range(2)`` through ctypes, or None where there is none."""
    try:
        import ctypes

        fn = ctypes.CDLL(None, use_errno=True).sync_file_range
        fn.argtypes = (ctypes.c_int, ctypes.c_int64, ctypes.c_int64, ctypes.c_uint)
        return fn
    except (AttributeError, OSError):
        return None


SYNC_FILE_RANGE = _libc_sync_file_range()
SYNC_FILE_RANGE_WRITE = 2
WRITEBACK_CHUNK = 16 << 20


DIRECT_ALIGN = 4096  # O_DIRECT wants offsets, lengths and buffer addresses aligned to the logical block
DIRECT_CHUNK = 8 << 20
_direct_buffers: list[Any] = []  # free aligned buffers (anonymous mmaps), reused by every save
_direct_lock = threading.Lock()


def open_direct(path: str | os.PathLike[str]) -> int | None:
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


class DirectFile:
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


def lower_this_thread(nice: int) -> None:
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
