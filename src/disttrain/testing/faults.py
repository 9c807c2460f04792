"""Faults on purpose, for tests: ``DISTTRAIN_FAULT`` names where a process dies, hangs, slows down, reads a
NaN loss or gets an I/O error, and :func:`install` puts each on its neutral hook point
(:mod:`disttrain.utils.hooks`). A worker entry installs it only when the variable is set; nothing else reads it.

``DISTTRAIN_FAULT`` is a comma-separated list of ``<kind>:<step>:<rank>[:<when>]``:

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
ps_trainer_kill        SIGKILL parameter-server trainer r as its step k starts
ps_server_hang         the server of rank r stops answering at update k of a table
rl_actor_kill          SIGKILL the RL actor of rank r after its chunk k
rl_learner_kill        SIGKILL the RL learner (rank 0) after its update k
ps_server_freeze       SIGSTOP the server of rank r as it applies update k of a table
rl_actor_freeze        SIGSTOP the RL actor of rank r after its chunk k
rl_learner_freeze      SIGSTOP the RL learner (rank 0) after its update k
=====================  ==================================================================================

``<when>`` says on which of a job's attempts (torchrun's restarts) a fault acts:

=====================  ==================================================================================
first                  the job's first attempt only, so a job that torchrun restarts then runs through (the
                       default of every kind but the I/O errors)
every                  every attempt that reaches it (the default of the I/O errors: a failing disk; for
                       ``nan``, a batch that is bad each time a resume replays it)
once                   once per job, on whichever attempt first reaches it (a fault after a restart, as a
                       long job meets them); needs ``DISTTRAIN_FAULT_STATE=DIR``, a folder shared by the
                       job's processes where a fault that fires leaves its mark (``<kind>-<step>-<rank>``,
                       JSON: time, attempt, pid) just before it acts
=====================  ==================================================================================
"""

from __future__ import annotations

import errno
import json
import logging
import os
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
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
    "ps_trainer_kill": "ps_step",
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
EVERY_ATTEMPT = frozenset(IO_ERRORS)  # their default <when> is "every"; the others' is "first"
WHENS = ("first", "every", "once")
STATE_ENV = "DISTTRAIN_FAULT_STATE"
FROM_STEP_ON = frozenset({"slow", "ps_slow"})  # the others act at their step only


@dataclass(frozen=True)
class Fault:
    """One ``<kind>:<step>:<rank>[:<when>]`` of ``DISTTRAIN_FAULT`` (``when`` "": the kind's default)."""

    kind: str
    step: int
    rank: int
    when: str = ""

    @property
    def policy(self) -> str:
        """On which attempts it acts: first, every or once (see the module's table)."""
        return self.when or ("every" if self.kind in EVERY_ATTEMPT else "first")

    @property
    def mark(self) -> str:
        """The name of the file a ``once`` fault leaves in ``DISTTRAIN_FAULT_STATE`` when it fires."""
        return f"{self.kind}-{self.step}-{self.rank}"

    def __str__(self) -> str:
        return f"{self.kind}:{self.step}:{self.rank}" + (f":{self.when}" if self.when else "")


def parse(spec: str) -> list[Fault]:
    """The faults of a ``DISTTRAIN_FAULT`` value; ConfigError naming the bad entry and the kinds there are."""
    faults = []
    for entry in filter(None, (e.strip() for e in spec.split(","))):
        kind, *rest = entry.split(":")
        numbers, when = rest[:2], rest[2] if len(rest) == 3 else ""
        numbers_ok = len(rest) in (2, 3) and all(n.isdigit() for n in numbers)
        if kind not in KINDS or not numbers_ok or (len(rest) == 3 and when not in WHENS):
            raise ConfigError(
                f"DISTTRAIN_FAULT entry {entry!r} is not <kind>:<step>:<rank>[:<when>] with a known kind and "
                f"<when> {', '.join(WHENS)}; kinds: {', '.join(KINDS)} (e.g. step:11:1, nan:40:0:every)"
            )
        faults.append(Fault(kind, int(numbers[0]), int(numbers[1]), when))
    return faults


def state_folder(faults: list[Fault]) -> Path | None:
    """``DISTTRAIN_FAULT_STATE`` (created), which ``once`` faults need; ConfigError naming them when unset."""
    folder = os.environ.get(STATE_ENV)
    if not folder:
        once = [str(f) for f in faults if f.policy == "once"]
        if once:
            raise ConfigError(
                f"DISTTRAIN_FAULT entries {', '.join(once)} act once per job: set {STATE_ENV} to a folder every "
                "process of the job can write (where a fault that fired leaves its mark)"
            )
        return None
    Path(folder).mkdir(parents=True, exist_ok=True)
    return Path(folder)


def claim(folder: Path, fault: Fault) -> bool:
    """Leave ``fault``'s mark in ``folder`` unless one is there already: True when this process is the first
    (then it acts), False when the fault fired before, in this job."""
    try:
        fd = os.open(folder / fault.mark, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
    except FileExistsError:
        return False
    with os.fdopen(fd, "w") as f:
        json.dump({"fault": str(fault), "time": time.time(), "attempt": attempt(), "pid": os.getpid()}, f)
    return True


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
        self.faults = [f for f in faults if first_attempt or f.policy != "first"]
        self.state = state_folder(self.faults)
        self.claimed: set[Fault] = set()  # the once-per-job faults this process fired
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
        """Is a fault of ``kind`` named at (step, rank)? (``slow`` and ``ps_slow``: from their step on.)"""
        return self._match(kind, step, rank) is not None

    def _match(self, kind: str, step: int, rank: int) -> Fault | None:
        for f in self.faults:
            if f.kind == kind and f.rank == rank and (step >= f.step if kind in FROM_STEP_ON else step == f.step):
                return f
        return None

    def take(self, kind: str, step: int, rank: int) -> Fault | None:
        """The fault of ``kind`` that acts at (step, rank) now: named, and, if it acts once per job, not fired
        yet by another process or attempt (this call claims it)."""
        f = self._match(kind, step, rank)
        if f is None or f.policy != "once" or f in self.claimed:
            return f
        assert self.state is not None  # state_folder() insisted
        if not claim(self.state, f):
            return None
        self.claimed.add(f)
        return f

    def _event_hook(self, point: str) -> Callable[[int, int], None]:
        kinds = [k for k, p in EVENTS.items() if p == point]

        def hook(step: int, rank: int) -> None:
            for kind in kinds:
                if self.take(kind, step, rank):
                    act(kind, step, rank)

        return hook

    def on_loss(self, loss: Any, step: int, rank: int) -> Any:
        """``hang``, ``freeze``, then ``slow``, then ``nan``, in the first micro-step of step ``step``."""
        if self.take("hang", step, rank):
            log.warning("fault injection: rank %d hangs in step %d", rank, step)
            sleep_forever()
        if self.take("freeze", step, rank):
            log.warning("fault injection: rank %d freezes (SIGSTOP) in step %d", rank, step)
            os.kill(os.getpid(), signal.SIGSTOP)
        slow = self._match("slow", step, rank)
        self.slow(step, rank if slow is None or self.take("slow", step, rank) else -1)
        nan = self._match("nan", step, rank)
        if nan is not None and nan not in self.fired and self.take("nan", step, rank):
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
