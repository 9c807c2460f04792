"""Garbage-collector control: frozen and off during training, collected on the step interval, restored after."""

from __future__ import annotations

import gc
import weakref
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from disttrain.config import from_dict
from disttrain.errors import ConfigError
from disttrain.train.trainer import Trainer
from disttrain.utils.gc import GarbageCollection, paused_gc

pytestmark = pytest.mark.timeout(120)


class _Cycle:
    def __init__(self) -> None:
        self.me = self


@pytest.fixture
def full_collections() -> Iterator[list[Any]]:
    """Appends the collector's info dict for every generation-2 collection while the test runs."""
    seen: list[Any] = []

    def cb(phase: str, info: dict[str, Any]) -> None:
        if phase == "start" and info["generation"] == 2:
            seen.append(info)

    gc.callbacks.append(cb)
    yield seen
    gc.callbacks.remove(cb)
    assert gc.isenabled() and gc.get_freeze_count() == 0, "a test left the collector changed"


def test_collects_on_the_interval_and_restores(full_collections: list[Any]) -> None:
    with GarbageCollection(3) as collector:
        assert not gc.isenabled() and gc.get_freeze_count() > 0
        full_collections.clear()  # the one on entry
        at = []
        for step in range(1, 8):
            garbage = weakref.ref(_Cycle())  # a reference cycle: only the collector frees it
            n = len(full_collections)
            collector.step(step)
            if len(full_collections) > n:
                at.append(step)
                assert garbage() is None, "a scheduled collection must free the cycles made since the last one"
            else:
                assert garbage() is not None, f"step {step}: something collected outside the schedule"
    assert at == [3, 6] and collector.collections == 2
    assert gc.isenabled() and gc.get_freeze_count() == 0


def test_only_the_outermost_context_owns_the_collector(full_collections: list[Any]) -> None:
    with GarbageCollection(5):
        frozen = gc.get_freeze_count()
        full_collections.clear()
        for _ in range(2):  # e.g. fit() called block by block inside one job-wide context
            with GarbageCollection(5) as inner:
                inner.step(5)
            assert not gc.isenabled() and gc.get_freeze_count() >= frozen
        assert len(full_collections) == 2  # the scheduled ones, no entry collection per block
    assert gc.isenabled() and gc.get_freeze_count() == 0


def test_interval_zero_leaves_python_in_charge() -> None:
    with GarbageCollection(0) as collector:
        assert gc.isenabled() and gc.get_freeze_count() == 0
        for step in range(1, 5):
            collector.step(step)
    assert collector.collections == 0 and gc.isenabled()


def test_a_disabled_collector_stays_disabled() -> None:
    gc.disable()
    try:
        with GarbageCollection(2):
            pass
        with paused_gc():
            pass
        assert not gc.isenabled()
    finally:
        gc.enable()


def test_paused_gc_restores_after_an_error() -> None:
    with pytest.raises(KeyError), paused_gc():
        assert not gc.isenabled()
        raise KeyError("x")
    assert gc.isenabled()


def test_fit_collects_only_on_the_interval(tiny_trainer: Callable[..., Trainer], full_collections: list[Any]) -> None:
    trainer = tiny_trainer(train={"steps": 5, "global_batch": 4, "micro_batch": 4, "gc_interval": 2})
    steps: list[int] = []
    gc.callbacks.append(lambda phase, info: steps.append(trainer.step) if phase == "start" else None)
    try:
        trainer.fit()
    finally:
        gc.callbacks.pop()
    assert steps == [0, 2, 4], f"collections at steps {steps}: expected one on entry, then every 2 steps"


def test_negative_interval_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match=r"train.gc_interval must be >= 0.*got -1"):
        from_dict({"train": {"gc_interval": -1}})
