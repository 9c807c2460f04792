"""Python's garbage collector during training: frozen after set-up, then run on a schedule, on every rank
at the same step.

A full (generation-2) collection walks every object the process holds. After ``import torch`` that is about
250k objects, 40-110 ms on this machine's cores, and Python starts one by itself whenever enough new objects
have survived: at a random moment, on one rank, while the others wait for it in the next collective. A
checkpoint load triggers one reliably (DCP's load plans are thousands of small objects; measured: one rank's
plan unpickling took 108 ms instead of 2 ms, every rank waiting for it). torchtitan's ``gc_freq`` is the
model: disable automatic collection, collect on a fixed step interval. We also ``gc.freeze()`` what set-up
created (modules, the model, the data), so a scheduled collection walks only what training made since.
"""

from __future__ import annotations

import contextlib
import gc
from collections.abc import Iterator
from types import TracebackType


@contextlib.contextmanager
def paused_gc() -> Iterator[None]:
    """No automatic collection inside (allocation-heavy bookkeeping such as DCP planning); the collector's
    previous state is restored on the way out, also on an exception."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


class GarbageCollection:
    """Context for the training loop: on entry collect once, freeze the survivors and turn automatic
    collection off; :meth:`step` collects every ``interval`` steps; on exit unfreeze and restore the
    collector as it was. ``interval = 0`` leaves Python's automatic collection alone."""

    def __init__(self, interval: int) -> None:
        self.interval = interval
        self.collections = 0
        self._was_enabled = True

    def __enter__(self) -> GarbageCollection:
        if self.interval:
            self._was_enabled = gc.isenabled()
            gc.disable()
            gc.collect()
            gc.freeze()
        return self

    def step(self, step: int) -> None:
        """Call after each optimizer step; collects (everything not frozen) when ``step`` is a multiple of
        the interval, so every rank pauses at the same step."""
        if self.interval and step % self.interval == 0:
            gc.collect()
            self.collections += 1

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if self.interval:
            gc.unfreeze()
            if self._was_enabled:
                gc.enable()
