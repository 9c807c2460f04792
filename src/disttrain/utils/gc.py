"""Python's garbage collector during training: frozen after set-up, then run on a schedule, on every rank
at the same step.

A full (generation-2) collection walks every object the process holds: after ``import torch`` and set-up
about 290k objects, 85-105 ms on this machine's cores (benchmarks/bench_gc.py). Python starts one by itself
when enough new objects have survived. The training step itself makes almost none (~3 per step: no
collection in 800 measured steps), but bursts do: a checkpoint load's plans (one rank's plan unpickling took
108 ms instead of 2 ms, every other rank waiting for it), a save's state dicts and plans, an evaluation, a
Python-heavy data pipeline. Such a pause lands on one rank at a random moment while the others wait in the
next collective. torchtitan's ``gc_freq`` is the model: automatic collection off, a collection on a fixed
step interval. We also ``gc.freeze()`` what set-up created (modules, the model, the data), so a scheduled
collection walks only what training made since: ~50 us here. The price: one full collection on entry.
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


_depth = 0  # GarbageCollection contexts entered and not yet left (in this process)


class GarbageCollection:
    """Context for the training loop: on entry collect once, freeze the survivors and turn automatic
    collection off; :meth:`step` collects every ``interval`` steps; on exit unfreeze and restore the
    collector as it was. ``interval = 0`` leaves Python's automatic collection alone. Inside another one
    (a caller running ``fit()`` block by block) only :meth:`step` acts: the outermost owns the collector."""

    def __init__(self, interval: int) -> None:
        self.interval = interval
        self.collections = 0
        self._was_enabled = True
        self._owner = False

    def __enter__(self) -> GarbageCollection:
        global _depth
        if self.interval:
            self._owner = _depth == 0
            _depth += 1
            if self._owner:
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
        global _depth
        if self.interval:
            _depth -= 1
            if self._owner:
                gc.unfreeze()
                if self._was_enabled:
                    gc.enable()
