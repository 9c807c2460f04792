"""Tensors in shard files as the exact bytes ``torch.save`` would write, without pickling them: a cached zip
record head and tail per tensor layout around the tensor's raw bytes (``write_tensor_record``), with the zip's
own CRC32 off while shards are written (``zip_crc32_off``)."""

from __future__ import annotations

import contextlib
import functools
import sys
from collections.abc import Iterator
from typing import IO, Any, cast

import numpy as np
import torch

from disttrain.checkpoint.reader import zip_local_headers


def bytes_of(storage: torch.UntypedStorage) -> torch.Tensor:
    """The bytes of ``storage`` as a uint8 tensor (no copy)."""
    return torch.empty(0, dtype=torch.uint8).set_(storage)  # type: ignore[call-overload]


@contextlib.contextmanager
def zip_crc32_off() -> Iterator[None]:
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
    records = [(method, at) for name, method, at in zip_local_headers(head, 0) if "/data/" in name]
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
        stream.write(bytes_of(tensor.untyped_storage()).numpy())
    stream.write(template[1])
    return True
