"""Named hook points: where an engine lets something outside it act, without knowing what acts there.

An engine fires a point at a neutral event (a step starts, a save's shards are written, a server applied an
update), with the step and the rank; the hooks registered on that point run, in the order they were registered.
A normal run registers none, so a point costs one dictionary lookup. One point, ``loss``, passes a value
through its hooks, each of which may return another (a test poisons a loss that way).

Hooks belong to one process. A plugin that registers hooks names itself (:func:`plugin_installed`), so that
work carried to another process can install it there too: DCP's process-mode saves write in a process of
their own, and the checkpoint writer installs there the plugins of the process that made it
(:func:`plugins`, :func:`load_plugins`).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Iterable
from typing import Any, Literal, TypeVar

EventPoint = Literal[
    "step_start",  # Trainer: step k begins, before its data is fetched
    "save_start",  # CheckpointManager: the save of step k begins writing
    "save_written",  # CheckpointManager: every rank's shards of step k are written, before the commit
    "save_commit",  # CheckpointManager (rank 0): step k's folder is in place, before its COMMITTED marker
    "process_save_start",  # CheckpointManager: a process-mode save of step k is about to use DCP's save process
    "shards_write",  # ChecksummingWriter: this rank starts writing its shards of step k (where DCP writes them)
    "load_start",  # CheckpointManager: loading the checkpoint of step k begins
    "ps_step",  # parameter-server trainer: step k begins, after waiting its turn
    "ps_update",  # parameter server: update k of a table applied, its callers not answered yet
    "actor_chunk",  # RL actor: chunk k played, before it is sent
    "learner_update",  # RL learner: update k done
]
ValuePoint = Literal["loss"]  # Trainer: step k's first micro-batch loss, after its forward, before its backward

EventHook = Callable[[int, int], None]
"""``hook(step, rank)``."""
ValueHook = Callable[[Any, int, int], Any]
"""``hook(value, step, rank)``: the value to go on with (the one given, or another)."""

T = TypeVar("T")

_EVENTS: dict[str, list[EventHook]] = {}
_VALUES: dict[str, list[ValueHook]] = {}
_PLUGINS: list[str] = []


def on(point: EventPoint, hook: EventHook) -> Callable[[], None]:
    """Run ``hook(step, rank)`` whenever ``point`` fires; returns the function that removes it."""
    _EVENTS.setdefault(point, []).append(hook)
    return lambda: _remove(_EVENTS, point, hook)


def on_value(point: ValuePoint, hook: ValueHook) -> Callable[[], None]:
    """Pass ``point``'s value through ``hook(value, step, rank)``; returns the function that removes it."""
    _VALUES.setdefault(point, []).append(hook)
    return lambda: _remove(_VALUES, point, hook)


def fire(point: EventPoint, step: int, rank: int) -> None:
    """``point`` happened at ``step`` on ``rank``: run its hooks (a hook may raise, or never return)."""
    for hook in _EVENTS.get(point, ()):
        hook(step, rank)


def apply(point: ValuePoint, value: T, step: int, rank: int) -> T:
    """``value`` as ``point``'s hooks leave it (unchanged when there are none)."""
    for hook in _VALUES.get(point, ()):
        value = hook(value, step, rank)
    return value


def _remove(table: dict[str, list[Any]], point: str, hook: Any) -> None:
    hooks = table.get(point, [])
    if hook in hooks:
        hooks.remove(hook)
    if not hooks:
        table.pop(point, None)


def plugin_installed(name: str, installed: bool = True) -> None:
    """Record that the plugin ``"module:function"`` (its installer) has registered hooks in this process, or,
    with ``installed=False``, that it removed them."""
    if installed and name not in _PLUGINS:
        _PLUGINS.append(name)
    elif not installed and name in _PLUGINS:
        _PLUGINS.remove(name)


def plugins() -> tuple[str, ...]:
    """The plugins installed in this process, as ``"module:function"`` names for :func:`load_plugins`."""
    return tuple(_PLUGINS)


def load_plugins(names: Iterable[str]) -> None:
    """Install each plugin of ``names`` not installed in this process yet, by calling its installer."""
    for name in names:
        if name not in _PLUGINS:
            module, _, function = name.partition(":")
            getattr(importlib.import_module(module), function)()
            plugin_installed(name)
