"""Faults on purpose, for tests: ``DISTTRAIN_FAULT`` names where a process dies, hangs, slows down, reads a
NaN loss or gets an I/O error, and :func:`install` puts each on its neutral hook point
(:mod:`disttrain.utils.hooks`). A worker entry installs it only when the variable is set; nothing else reads it.

``DISTTRAIN_FAULT`` is a comma-separated list of ``<kind>:<step>:<rank>``:

=====================  ==================================================================================
step                   SIGKILL rank r as step k starts
before_shards          SIGKILL rank r as the save of step k begins writing
after_shards           SIGKILL rank r once every shard of step k is written, before the commit
before_marker          SIGKILL rank 0 before the COMMITTED marker of step k
kill_save_process      SIGKILL rank r's DCP save process before the process-mode save of step k
write_error            an I/O error as rank r writes its shards of step k (a failing disk)
read_error             an I/O error as rank r starts loading step k
hang                   rank r sleeps for good in the forward of step k (the watchdog's case)
freeze                 rank r stops (SIGSTOP: every thread, as a stuck driver call or a debugger leaves it)
                       in the forward of step k; only a watcher outside the process can name it
slow                   from step k on, rank r takes 3x its CPU time per step (a straggler)
nan                    the loss of step k on rank r is NaN (once per process)
ps_slow                parameter-server trainer r sleeps 50 ms per step from step k on
ps_server_kill         SIGKILL the server of rank r as it applies update k of a table
ps_server_hang         the server of rank r stops answering at update k of a table
rl_actor_kill          SIGKILL the RL actor of rank r after its chunk k
rl_learner_kill        SIGKILL the RL learner (rank 0) after its update k
ps_server_freeze       SIGSTOP the server of rank r as it applies update k of a table
rl_actor_freeze        SIGSTOP the RL actor of rank r after its chunk k
rl_learner_freeze      SIGSTOP the RL learner (rank 0) after its update k
=====================  ==================================================================================

All but the I/O errors act on a job's first attempt only, so a job that torchrun restarts then runs through.
"""

from __future__ import annotations

import errno
import logging
import os
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from disttrain.errors import ConfigError
from disttrain.health.events import attempt
from disttrain.utils import hooks

log = logging.getLogger("disttrain")

PLUGIN = f"{__name__}:install"

KILLS: dict[str, hooks.EventPoint] = {
    "step": "step_start",
    "before_shards": "save_start",
    "after_shards": "save_written",
    "before_marker": "save_commit",
    "ps_server_kill": "ps_update",
    "rl_actor_kill": "actor_chunk",
    "rl_learner_kill": "learner_update",
}
STOPS: dict[str, hooks.EventPoint] = {
    "ps_server_freeze": "ps_update",
    "rl_actor_freeze": "actor_chunk",
    "rl_learner_freeze": "learner_update",
}
IO_ERRORS: dict[str, hooks.EventPoint] = {"write_error": "shards_write", "read_error": "load_start"}
EVENTS: dict[str, hooks.EventPoint] = {
    **KILLS,
    **STOPS,
    **IO_ERRORS,
    "kill_save_process": "process_save_start",
    "ps_server_hang": "ps_update",
    "ps_slow": "ps_step",
}
ON_LOSS = ("hang", "freeze", "slow", "nan")  # on the "loss" value point
KINDS = (*EVENTS, *ON_LOSS)
EVERY_ATTEMPT = frozenset(IO_ERRORS)
FROM_STEP_ON = frozenset({"slow", "ps_slow"})  # the others act at their step only


@dataclass(frozen=True)
class Fault:
    """One ``<kind>:<step>:<rank>`` of ``DISTTRAIN_FAULT``."""

    kind: str
    step: int
    rank: int

    def __str__(self) -> str:
        return f"{self.kind}:{self.step}:{self.rank}"


def parse(spec: str) -> list[Fault]:
    """The faults of a ``DISTTRAIN_FAULT`` value; ConfigError naming the bad entry and the kinds there are."""
    faults = []
    for entry in filter(None, (e.strip() for e in spec.split(","))):
        kind, *numbers = entry.split(":")
        if kind not in KINDS or len(numbers) != 2 or not all(n.isdigit() for n in numbers):
            raise ConfigError(
                f"DISTTRAIN_FAULT entry {entry!r} is not <kind>:<step>:<rank> with a known kind; "
                f"kinds: {', '.join(KINDS)} (e.g. step:11:1)"
            )
        faults.append(Fault(kind, int(numbers[0]), int(numbers[1])))
    return faults


def sleep_forever() -> None:
    """A wedged process: it never returns (the hang watchdog, or the test, ends it)."""
    while True:
        time.sleep(3600)


def kill_save_process() -> None:
    """SIGKILL DCP's background save process of this rank, if there is one."""
    from torch.distributed.checkpoint import _async_process_executor as ape

    proc = getattr(ape, "_CHECKPOINT_PROCESS", None)
    if proc is not None:
        os.kill(proc._save_process.pid, signal.SIGKILL)
        proc._save_process.join()


class SlowDown:
    """``slow``: from its step on, each step burns twice the CPU time (of this thread) that the step before took
    without the burn, so the rank's compute figure is 3x its own and the burn never feeds on itself."""

    def __init__(self, first_step: dict[int, int]) -> None:
        self.first_step = first_step  # rank -> the step it turns slow
        self.mark: float | None = None  # this thread's CPU time when the hook last returned
        self.burned = 0.0

    def __call__(self, step: int, rank: int) -> None:
        clean = 0.0 if self.mark is None else time.thread_time() - self.mark
        if rank in self.first_step and step >= self.first_step[rank]:
            t0 = time.thread_time()
            while time.thread_time() - t0 < 2 * clean:
                sum(range(1000))
            self.burned += time.thread_time() - t0
        self.mark = time.thread_time()


class Injector:
    """The faults of one ``DISTTRAIN_FAULT``, on their hook points; :meth:`remove` takes them off."""

    def __init__(self, faults: list[Fault], first_attempt: bool = True) -> None:
        self.faults = [f for f in faults if first_attempt or f.kind in EVERY_ATTEMPT]
        self.fired: set[Fault] = set()
        self.slow = SlowDown({f.rank: f.step for f in self.faults if f.kind == "slow"})
        self._removers: list[Callable[[], None]] = []
        points = {EVENTS[f.kind] for f in self.faults if f.kind in EVENTS}
        for point in sorted(points):
            self._removers.append(hooks.on(point, self._event_hook(point)))
        if any(f.kind in ON_LOSS for f in self.faults):
            self._removers.append(hooks.on_value("loss", self.on_loss))

    def remove(self) -> None:
        for remove in self._removers:
            remove()
        self._removers = []

    def named(self, kind: str, step: int, rank: int) -> bool:
        """Does a fault of ``kind`` act at (step, rank)? (``slow`` and ``ps_slow``: from their step on.)"""
        if kind in FROM_STEP_ON:
            return any(f.kind == kind and f.rank == rank and step >= f.step for f in self.faults)
        return Fault(kind, step, rank) in self.faults

    def _event_hook(self, point: str) -> Callable[[int, int], None]:
        kinds = [k for k, p in EVENTS.items() if p == point]

        def hook(step: int, rank: int) -> None:
            for kind in kinds:
                if self.named(kind, step, rank):
                    act(kind, step, rank)

        return hook

    def on_loss(self, loss: Any, step: int, rank: int) -> Any:
        """``hang``, ``freeze``, then ``slow``, then ``nan``, in the first micro-step of step ``step``."""
        if self.named("hang", step, rank):
            log.warning("fault injection: rank %d hangs in step %d", rank, step)
            sleep_forever()
        if self.named("freeze", step, rank):
            log.warning("fault injection: rank %d freezes (SIGSTOP) in step %d", rank, step)
            os.kill(os.getpid(), signal.SIGSTOP)
        self.slow(step, rank)
        nan = Fault("nan", step, rank)
        if nan in self.faults and nan not in self.fired:
            self.fired.add(nan)
            return loss * float("nan")
        return loss


def act(kind: str, step: int, rank: int) -> None:
    """What an event fault does where it is named."""
    if kind in KILLS:
        os.kill(os.getpid(), signal.SIGKILL)
    elif kind in STOPS:
        log.warning("fault injection: rank %d freezes (SIGSTOP) at %s %d", rank, kind, step)
        os.kill(os.getpid(), signal.SIGSTOP)
    elif kind in IO_ERRORS:
        raise OSError(errno.EIO, f"injected I/O error (DISTTRAIN_FAULT={kind}:{step}:{rank})")
    elif kind == "kill_save_process":
        kill_save_process()
    elif kind == "ps_server_hang":
        sleep_forever()
    elif kind == "ps_slow":
        time.sleep(0.05)


_INSTALLED: list[Injector] = []


def install(spec: str | None = None) -> Injector:
    """Put the faults of ``spec`` (default: ``DISTTRAIN_FAULT``) on their hook points in this process, in
    place of any installed before; ConfigError for an entry that names no known fault."""
    uninstall()
    injector = Injector(parse(os.environ.get("DISTTRAIN_FAULT", "") if spec is None else spec), attempt() == 0)
    _INSTALLED.append(injector)
    hooks.plugin_installed(PLUGIN)
    return injector


def install_if_requested() -> None:
    """What every worker entry calls first: the faults ``DISTTRAIN_FAULT`` names, and nothing (not even this
    module's hooks) when it is unset."""
    if os.environ.get("DISTTRAIN_FAULT"):
        install()


def uninstall() -> None:
    """Take every installed fault off its hook point."""
    while _INSTALLED:
        _INSTALLED.pop().remove()
    hooks.plugin_installed(PLUGIN, installed=False)
