"""Health of a running job: heartbeats, the hang watchdog with stack dumps, straggler detection, bad-step
guards (NaN/Inf and loss spikes), collective timeouts, debug presets and the run folder's event log.

The training thread only marks where it is (``health.phase("forward")``, ``health.step_done(step, dt)``):
attribute writes, no I/O, except one tiny all-gather of the straggler window's figures every
``health.straggler_interval`` steps (:mod:`disttrain.health.stragglers`: every rank judges the same figures,
whatever the threads' scheduling). A background thread per rank publishes (step, phase, seconds in that
phase) every ``health.heartbeat_s`` to the c10d store the process group already uses (its own client
connection), and mirrors it to ``<run>/health/attempt<k>-rank<r>.json``, which the launcher's watch reads
(:mod:`disttrain.launch.frozen_watch`: it names a rank whose whole process stopped, rank 0 included, and
leaves its verdict in ``<run>/health/verdict-attempt<k>.json``).
Rank 0's thread is also the watchdog: a rank whose (step, phase) has not moved for the hang timeout is
named with its phase, a verdict goes into the store, every rank dumps the Python stacks of all its threads
(faulthandler) into ``<run>/health/stacks/``, and the job exits non-zero (``HANG_EXIT_CODE``) so that
torchrun restarts it from the last checkpoint. A per-rank ``faulthandler.dump_traceback_later`` is the
backstop when a process is too wedged for its Python thread to run.

Events (hangs, stragglers, bad steps, rollbacks, restarts) are appended to ``<run>/health/events.jsonl``.
"""

from __future__ import annotations

import collections
import contextlib
import datetime
import faulthandler
import json
import logging
import os
import statistics
import sys
import threading
import time
from pathlib import Path
from typing import IO, Any

import torch.distributed as dist

from disttrain.config import HealthConfig
from disttrain.health.events import attempt, health_dir, log_event, record_exit, write_elastic_error, write_state
from disttrain.health.heartbeat import STALE_BEATS, Heartbeat, launcher_verdict, silent_ranks
from disttrain.health.stragglers import CollectiveExchange, Exchange, StoreExchange, StragglerCheck, open_store

log = logging.getLogger("disttrain")


HANG_EXIT_CODE = 124
# In order of progress: "log" .. "rollback" follow step k (the step counter already says k), "data" ..
# "optimizer" are the work of step k + 1.
PHASES = ("init", "log", "eval", "checkpoint", "rollback", "data", "forward", "backward", "optimizer", "done")
IN_STEP = frozenset({"data", "forward", "backward", "optimizer"})
# Phases that are not a training step: judged against the start-up limit, not the step-based timeout.
SLOW_PHASES = frozenset({"init", "eval", "checkpoint", "rollback"})


# -- collective timeouts and debug presets -----------------------------------------------------------------
def set_collective_timeout(seconds: float) -> None:
    """Set the timeout of every process group of this process (torchtitan: long at start-up, then shorter)."""
    if not dist.is_initialized():
        return
    from torch.distributed.distributed_c10d import _set_pg_timeout, _world

    for pg in list(_world.pg_map):
        try:
            _set_pg_timeout(datetime.timedelta(seconds=seconds), pg)
        except Exception as e:  # a backend without the setter keeps its start-up value
            log.debug("collective timeout not set on %s: %s", pg, e)


# -- heartbeats and the watchdog ----------------------------------------------------------------------------
def _exchange(lockstep: bool, rank: int, world: int, gone: set[int]) -> Exchange | None:
    """How this job's ranks bring a straggler window together (None: one rank, nothing to compare)."""
    if world < 2:
        return None
    return CollectiveExchange() if lockstep else StoreExchange(rank, world, gone)


class HealthMonitor:
    """Per-rank heartbeats and the straggler check (:mod:`disttrain.health.stragglers`); on rank 0 also the
    hang watchdog. ``lockstep``: the ranks step together (the trainer), so a window's figures are all-gathered at its
    last step; else (the parameter server's trainers) they meet in the store."""

    def __init__(
        self,
        cfg: HealthConfig,
        rank: int,
        world_size: int,
        run_dir: Path | None,
        step_timeout_s: float,
        lockstep: bool = True,
    ) -> None:
        self.cfg = cfg
        self.rank = rank
        self.world = world_size
        self.run_dir = run_dir
        self.step_timeout_s = step_timeout_s
        now = time.perf_counter()
        self._state: tuple[int, str, float] = (0, "init", now)  # (step, phase, since): one atomic write
        self._data_s = 0.0
        self._cpu0 = time.thread_time()
        self.step_times: collections.deque[float] = collections.deque(maxlen=50)
        self.left: set[int] = set()  # ranks gone for good while the others go on (an asp trainer)
        self.straggler = StragglerCheck(
            cfg.straggler_interval if cfg.enabled and world_size > 1 else 0,
            cfg.straggler_factor,
            _exchange(lockstep, rank, world_size, self.left),
            rank,
            run_dir,
        )
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()
        self._store: Any = None
        self._backstop: IO[str] | None = None
        self._armed_at = 0.0
        self._seen: dict[int, tuple[Any, float]] = {}  # rank -> (last heartbeat, when rank 0 received it)
        self.verdict: dict[str, Any] | None = None
        self._verdict_once = threading.Lock()
        self._file_beat: Heartbeat | None = None
        self._deferred_since: float | None = None

    @property
    def stragglers(self) -> list[int]:
        """The ranks named stragglers in the last window judged (every rank holds it after an all-gather)."""
        return self.straggler.stragglers

    @property
    def rank_figures(self) -> dict[str, list[float]]:
        """That window's figures by phase, one per rank (compute_s, data_s)."""
        return self.straggler.rank_figures

    # ---- training-thread hooks (cheap) ----
    def phase(self, name: str) -> None:
        step, old, since = self._state
        now = time.perf_counter()
        if old == "data":
            self._data_s += now - since
        self._state = (step, name, now)

    def step_done(self, step: int, seconds: float) -> None:
        """A step finished: progress for the watchdog, figures for the straggler check (at a window's last
        step, its exchange: every rank calls this at the same steps)."""
        now, cpu = time.perf_counter(), time.thread_time()
        self.step_times.append(seconds)
        compute_s, data_s = cpu - self._cpu0, self._data_s
        self._cpu0, self._data_s = cpu, 0.0
        self._state = (step, "log", now)
        self.straggler.add(step, compute_s, data_s)
        if self._backstop is not None and now - self._armed_at > self.timeout() / 2:
            self._arm_backstop()

    def timeout(self, phase: str = "data") -> float:
        """Seconds without progress that make a hang (auto: a multiple of the median step, with a floor)."""
        if phase in SLOW_PHASES or not self.step_times:
            return max(self.cfg.startup_timeout_s, self._step_timeout())
        return self._step_timeout()

    def _step_timeout(self) -> float:
        if self.cfg.hang_timeout_s is not None:
            return self.cfg.hang_timeout_s
        med = statistics.median(self.step_times) if self.step_times else 0.0
        return max(self.cfg.hang_floor_s, self.cfg.hang_factor * med)

    # ---- lifecycle ----
    def start(self) -> None:
        if not self.cfg.enabled or self._thread is not None:
            return
        self._store = open_store()
        if self.run_dir is not None:
            stacks = health_dir(self.run_dir) / "stacks"
            stacks.mkdir(exist_ok=True)
            self._backstop = open(stacks / f"attempt{attempt()}-rank{self.rank}-backstop.txt", "w")  # noqa: SIM115
            self._arm_backstop()
        self._beat()  # a first record at once: a rank killed before its first period still leaves one
        self._thread = threading.Thread(target=self._loop, name="disttrain-health", daemon=True)
        self._thread.start()
        if self.run_dir is not None:  # the file, on a thread that never waits on the store (its host may freeze)
            self._file_beat = Heartbeat(self.run_dir, self.rank, self._record, self.cfg.heartbeat_s, self._on_verdict)
            self._file_beat.start()

    def _arm_backstop(self) -> None:
        """faulthandler's own C thread dumps every stack and exits if nothing moves for twice the timeout
        (plus a margin): the watchdog of last resort when this process cannot run Python any more."""
        assert self._backstop is not None
        limit = 2 * self.timeout(self._state[1]) + 5 * self.cfg.heartbeat_s + 10
        faulthandler.dump_traceback_later(limit, exit=True, file=self._backstop)
        self._armed_at = time.perf_counter()

    def close(self, finished: bool = True) -> None:
        """Stop the thread; ``finished``: the loop ran to its end (else the last phase is kept for the log)."""
        if finished:
            self.phase("done")
        if self._file_beat is not None:
            self._file_beat.stop()
        if self._thread is not None:
            self._stop.set()
            # after a failure the store may be out of reach (a cut link, a lost node): never wait on it then
            self._thread.join(timeout=5 * self.cfg.heartbeat_s + 5 if finished else 1.0)
            self._thread = None
            self._beat(final=True, publish=finished)
        self._drop_backstop()

    def _drop_backstop(self) -> None:
        if self._backstop is not None:
            faulthandler.cancel_dump_traceback_later()
            name = Path(self._backstop.name)
            self._backstop.close()
            if name.stat().st_size == 0:
                name.unlink()
                with contextlib.suppress(OSError):  # another rank's file is there: a folder of stacks after all
                    name.parent.rmdir()
            self._backstop = None

    # ---- the background threads ----
    def _loop(self) -> None:
        failures = 0
        while not self._stop.wait(self.cfg.heartbeat_s):
            try:
                self._beat(to_file=self.run_dir is None)
                if self._store.check(["verdict"]):
                    self._on_verdict(json.loads(self._store.get("verdict")))
                if self.rank == 0:
                    self._watch()
                failures = 0
            except Exception as e:  # the store went away (rank 0 died): torchrun is tearing the job down
                failures += 1
                if failures == 3:
                    log.warning("health: heartbeat store unreachable (%s: %s)", type(e).__name__, e)

    def _record(self) -> dict[str, Any]:
        """This rank's heartbeat as published and mirrored."""
        step, phase, since = self._state
        return {
            "rank": self.rank,
            "attempt": attempt(),
            "step": step,
            "phase": phase,
            "in_phase_s": time.perf_counter() - since,
            "time": time.time(),
            # for the launcher's watch (disttrain.launch.frozen_watch): which process, on which node, and how
            # long it may go without progress in this phase
            "pid": os.getpid(),
            "node": int(os.environ.get("GROUP_RANK", "0")),
            "timeout_s": self.timeout(phase if step else "init"),
        }

    def _beat(self, final: bool = False, publish: bool = True, to_file: bool = True) -> None:
        beat = self._record()
        try:
            if publish:
                self._store.set(f"hb/{self.rank}", json.dumps(beat))
        except Exception:
            if not final:
                raise
        if final and publish:
            beat["exit"] = "finished"
        if to_file or final:
            write_state(self.run_dir, self.rank, beat)  # keeps an exit reason (a hang verdict's) recorded first

    def leave_out(self, rank: int) -> None:
        """Rank ``rank`` is gone for good and the job goes on without it: the watchdog stops waiting for it."""
        self.left.add(rank)

    def _watch(self) -> None:
        ranks = [r for r in range(self.world) if r not in self.left]
        keys = [f"hb/{r}" for r in ranks]
        if not self._store.check(keys):
            return
        now = time.perf_counter()
        beats: dict[int, dict[str, Any]] = {}
        idle: dict[int, float] = {}
        for r, raw in zip(ranks, self._store.multi_get(keys), strict=True):
            hb = json.loads(raw)
            prev = self._seen.get(r)
            if prev is None or prev[0] != raw:
                self._seen[r] = (raw, now)
            beats[r] = hb
            # seconds since this rank last moved, by its own clock, plus how stale its heartbeat is by ours
            idle[r] = hb["in_phase_s"] + (now - self._seen[r][1])
        # The culprit is the rank furthest behind: the others wait for it in a collective, and their idle
        # time (estimated to within a heartbeat) can pass the timeout a moment before its own does.
        live = [r for r, hb in beats.items() if hb["phase"] != "done"]
        if not live:
            return
        order = {r: (beats[r]["step"], PHASES.index(beats[r]["phase"])) for r in live}
        behind = min(order.values())
        stuck = [
            r
            for r in sorted(live)
            if order[r] == behind and idle[r] > self.timeout(beats[r]["phase"] if beats[r]["step"] else "init")
        ]
        if not stuck or self._leave_to_launcher():
            return
        verdict = {
            "stuck": [
                {
                    "rank": r,
                    "step": beats[r]["step"] + (beats[r]["phase"] in IN_STEP),
                    "phase": beats[r]["phase"],
                    "idle_s": round(idle[r], 2),
                }
                for r in stuck
            ],
            "waiting": sorted(set(beats) - set(stuck)),
            "timeout_s": self.timeout(beats[stuck[0]]["phase"]),
        }
        self._store.set("verdict", json.dumps(verdict))
        self._on_verdict(verdict)

    def _leave_to_launcher(self) -> bool:
        """A rank's process stopped (its heartbeat file is silent): the ranks this watchdog finds stuck only wait
        for it, and the launcher's watch names it within a few heartbeats; leave the verdict to it, for a grace
        period (a job started without disttrain's launcher has no such watch: then this one speaks)."""
        if self.run_dir is not None and launcher_verdict(self.run_dir) is not None:
            return True  # the launcher has spoken: this rank's heartbeat thread acts on its verdict
        if self.run_dir is None or not silent_ranks(self.run_dir, self.cfg.heartbeat_s):
            self._deferred_since = None
            return False
        now = time.perf_counter()
        self._deferred_since = self._deferred_since or now
        return now - self._deferred_since < (STALE_BEATS + 4) * self.cfg.heartbeat_s + 20

    def _on_verdict(self, verdict: dict[str, Any]) -> None:
        """Every rank: dump all threads' stacks, note why in torchrun's error file, wait for the others
        (bounded), exit non-zero so the launcher restarts the job from the last checkpoint. Once: the store's
        verdict and the launcher's may both arrive."""
        if not self._verdict_once.acquire(blocking=False):
            return  # the other thread is on its way out already
        self.verdict = verdict
        who = "; ".join(
            f"rank {s['rank']} made no progress for {s['idle_s']:.1f}s in phase {s['phase']!r} of step {s['step']}"
            + (" (its process stopped)" if s.get("frozen") else "")
            for s in verdict["stuck"]
        )
        msg = f"hang: {who} (timeout {verdict['timeout_s']:.1f}s)"
        stack_file = None
        if self.run_dir is not None:
            stack_file = health_dir(self.run_dir) / "stacks" / f"attempt{attempt()}-rank{self.rank}.txt"
            stack_file.parent.mkdir(exist_ok=True)
            with open(stack_file, "w") as f:
                f.write(f"# {msg}\n# rank {self.rank}, attempt {attempt()}: Python stacks of all threads\n")
                f.flush()
                faulthandler.dump_traceback(file=f, all_threads=True)
            record_exit(self.run_dir, self.rank, msg)
        if self.rank == 0 and verdict.get("by") != "launcher":  # the launcher's watch has said it already
            where = f"; stacks in {stack_file.parent}" if stack_file else ""
            log_event(self.run_dir, "hang", **verdict)
            log.error("%s%s", msg, where)
            print(
                f"disttrain: {msg}{where}; exiting so that the launcher restarts from the last checkpoint",
                file=sys.stderr,
                flush=True,
            )
        write_elastic_error(msg)
        self._drop_backstop()
        if verdict.get("by") != "launcher":  # (after the launcher's, the store may be out of reach: rank 0 froze)
            self._wait_for_dumps()
        logging.shutdown()
        os._exit(HANG_EXIT_CODE)

    def _wait_for_dumps(self) -> None:
        """Say this rank dumped its stacks, and give the others a moment to do the same (bounded). A rank the
        launcher's watch named frozen never will: its stacks were read from outside and its process ended, so
        nobody waits for it (a stopped rank 1 named by this watchdog first once held rank 0 here 7 s)."""
        self._store.set(f"dumped/{self.rank}", "1")
        deadline = time.perf_counter() + 3 * self.cfg.heartbeat_s + 5
        while time.perf_counter() < deadline:
            pending = {r for r in range(self.world) if not self._store.check([f"dumped/{r}"])}
            if not pending or pending <= self._named_frozen():
                break
            time.sleep(0.05)
        if self.rank == 0:
            time.sleep(0.5)  # rank 0 hosts the store: leave last

    def _named_frozen(self) -> set[int]:
        """The ranks of this attempt that the launcher's watch named frozen (and ended)."""
        verdict = launcher_verdict(self.run_dir) if self.run_dir is not None else None
        return {int(s["rank"]) for s in verdict["stuck"]} if verdict else set()
