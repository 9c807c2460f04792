"""Writing a checkpoint's shard files: DCP's file writer with each file CRC32'd as it is written
(``ChecksummingWriter`` over ``ChecksummingFileSystem``), shard files on ``O_DIRECT`` descriptors
(:mod:`~disttrain.checkpoint.direct_io`), and tensors written as the exact bytes ``torch.save`` would write
without pickling them (:mod:`~disttrain.checkpoint.records`)."""

from __future__ import annotations

import contextlib
import json
import os
import queue
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

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

from disttrain.checkpoint.direct_io import (
    SYNC_FILE_RANGE,
    SYNC_FILE_RANGE_WRITE,
    WRITEBACK_CHUNK,
    DirectFile,
    lower_this_thread,
    open_direct,
)
from disttrain.checkpoint.layout import CHECKSUMS
from disttrain.checkpoint.records import write_tensor_record, zip_crc32_off
from disttrain.utils import hooks

_TORCH_SAVE = SerializationFormat.TORCH_SAVE


class _CrcStream:
    """A write stream that CRC32s (and counts) every byte on its way to the file: no second read later.

    Every ``WRITEBACK_CHUNK`` bytes it also asks the kernel to start writing what it has so far to the disk
    (``sync_file_range(SYNC_FILE_RANGE_WRITE)``, which does not wait): the disk then works while the rest
    is serialized, instead of all of it waiting for the final fsync."""

    def __init__(self, raw: Any, kick: bool = True) -> None:
        self.raw = raw
        self.crc = 0
        self.size = 0
        self._kick = kick and SYNC_FILE_RANGE is not None
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
                SYNC_FILE_RANGE(fd, self._kicked, self.size - self._kicked, SYNC_FILE_RANGE_WRITE)
                self._kicked = self.size
        return n

    def writelines(self, lines: Any) -> None:
        for b in lines:
            self.write(b)

    def writable(self) -> bool:
        return True

    def __getattr__(self, name: str) -> Any:  # tell, flush, fileno, close, ...: the file's own
        return getattr(self.raw, name)


class ChecksummingFileSystem(FileSystem):
    """DCP's local file system; files opened for writing are checksummed as they are written."""

    def __init__(self, direct_io: bool = True) -> None:
        super().__init__()
        self.sums: dict[str, tuple[int, int]] = {}  # file name -> (size, crc32), once closed without error
        self.direct_io = direct_io

    @contextlib.contextmanager
    def create_stream(self, path: str | os.PathLike[str], mode: str) -> Iterator[Any]:
        fd = open_direct(path) if self.direct_io and "w" in mode and str(path).endswith(".distcp") else None
        if fd is not None:  # shard files: straight to the disk
            raw = DirectFile(fd)
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
        self.summing_fs = ChecksummingFileSystem(direct_io)
        self.fs = self.summing_fs
        self.sidecar_rank = rank
        self.step = step
        self.extra = extra
        self.plugins = hooks.plugins()  # this process's hook plugins, for DCP's save process (hooks.load_plugins)

    def set_up_storage_writer(self, is_coordinator: bool, *args: Any, **kwargs: Any) -> None:
        """An async save's upload thread (which also commits) gets ``nice`` here. (What a crashed attempt
        left is removed when the next one starts, by :class:`~disttrain.checkpoint.manager.CheckpointManager`:
        removing it here raced with other nodes already creating the folder on shared storage.)"""
        lower_this_thread(self.nice)
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
        hooks.load_plugins(self.plugins)  # in DCP's save process (process-mode saves) the first time
        hooks.fire("shards_write", self.step, self.sidecar_rank)
        with zip_crc32_off():
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
        if SYNC_FILE_RANGE is None:
            os.fsync(f.fileno())
        else:
            SYNC_FILE_RANGE(f.fileno(), 0, len(data), 7)  # WAIT_BEFORE | WRITE | WAIT_AFTER
    return len(data), zlib.crc32(data)
