"""The watch outside the workers: a thread of the launcher (the process that runs torchrun's agent, one per
node, which a worker's fault cannot stop) that names a local rank whose whole process stopped.

Rank 0's in-process watchdog (:mod:`disttrain.health.monitor`) names a rank that is alive but makes no
progress; it cannot name rank 0 itself when rank 0 is frozen (SIGSTOP, a stuck driver call, a D-state I/O
wait, a debugger), nor can a stopped process's own ``faulthandler`` backstop run. Every rank's heartbeat thread
writes ``<run>/health/attempt<k>-rank<r>.json`` every ``health.heartbeat_s`` with its pid, node, step, phase and
the hang timeout of that phase; a rank whose heartbeat is older than that timeout is frozen: its process runs
no thread at all. Then this watch:

1. names it on the console and in ``health/events.jsonl`` (rank, step, phase, seconds, process state);
2. dumps what it can get of its stacks into ``health/stacks/``: ``py-spy dump`` when installed, the kernel's
   ``/proc/<pid>/stack`` and each thread's ``wchan`` otherwise (the live ranks dump their own Python stacks);
3. records the cause as the rank's exit reason (the restart event then names it, not "killed by a signal"),
   leaves the verdict in ``health/verdict-attempt<k>.json`` for the live ranks (which dump their stacks and
   exit) and SIGKILLs the frozen process, so that torchrun restarts the group from the last checkpoint.

torch's ``elastic.timer.FileTimerServer`` does the kill part from the agent too, but ends the agent itself
with the worker, names nobody and would have the training thread open a FIFO at every phase; the heartbeat
files are already there.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

from disttrain.config import HealthConfig
from disttrain.health.events import health_dir, log_event, record_exit
from disttrain.health.heartbeat import STALE_BEATS, read_beats

STATES = {"T": "stopped", "t": "stopped by a debugger", "D": "in uninterruptible I/O wait", "Z": "exited"}
IN_STEP = ("data", "forward", "backward", "optimizer")


def process_state(pid: int) -> str:
    """The kernel's word for ``pid``'s state ('stopped', 'sleeping' ...), '' when it is gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return ""
    code = stat[stat.rindex(")") + 2 :].split()[0]
    return STATES.get(code, {"R": "running", "S": "sleeping"}.get(code, code))


def stacks_of(pid: int, timeout_s: float = 10.0) -> str:
    """What can be read of a stopped process's stacks from outside: py-spy's Python stacks when it is on PATH,
    the kernel stack and every thread's wait channel from /proc."""
    parts = []
    if (spy := shutil.which("py-spy")) is not None:
        try:
            out = subprocess.run(
                [spy, "dump", "--nonblocking", "--pid", str(pid)],  # nonblocking: no ptrace stop, it is stopped
                capture_output=True,
                text=True,
                timeout=timeout_s,
                check=False,
            )
            parts.append(f"## py-spy dump --nonblocking --pid {pid}\n{out.stdout}{out.stderr}")
        except (OSError, subprocess.TimeoutExpired) as e:
            parts.append(f"## py-spy dump failed: {e}")
    else:
        parts.append("## py-spy is not installed (pip install py-spy): no Python stacks from outside the process")
    for name in ("stack", "wchan"):
        try:
            parts.append(f"## /proc/{pid}/{name}\n{Path(f'/proc/{pid}/{name}').read_text()}")
        except OSError as e:
            parts.append(f"## /proc/{pid}/{name}: {e.strerror}")
    threads = []
    for task in sorted(Path(f"/proc/{pid}/task").glob("*")):
        try:
            comm, wchan = (task / "comm").read_text().strip(), (task / "wchan").read_text().strip()
        except OSError:
            continue
        threads.append(f"thread {task.name} ({comm}): waiting in {wchan or '-'}")
    return "\n".join([*parts, "## threads", *threads]) + "\n"


def message(s: dict[str, Any], timeout_s: float) -> str:
    """'hang: rank 0 frozen (stopped, pid 123): no heartbeat for 4.1s in step 8 (phase 'forward') ...'."""
    who = f"rank {s['rank']}" + (f" ({s['role']})" if "role" in s else "")
    where = f" in step {s['step']}" + (
        f" (phase {s['phase']!r})" if s["phase"] not in ("unknown", s.get("role")) else ""
    )
    return (
        f"hang: {who} frozen ({s['process']}, pid {s['pid']}): no heartbeat for {s['silent_s']:.1f}s{where} "
        f"(timeout {timeout_s:.1f}s)"
    )


class FrozenWatch:
    """A daemon thread over this node's ranks' heartbeat files (see the module doc); a context manager."""

    def __init__(self, run_dir: Path, node: int, heartbeat_s: float) -> None:
        self.run_dir, self.node, self.heartbeat_s = run_dir, node, heartbeat_s
        self.started = time.time()
        self.judged: set[int] = set()  # attempts with a verdict: one per attempt
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="disttrain-frozen-watch", daemon=True)

    def __enter__(self) -> FrozenWatch:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()

    def _loop(self) -> None:
        while not self._stop.wait(self.heartbeat_s / 2):
            try:
                self.check()
            except Exception as e:  # the watch must never take the launcher down
                print(f"disttrain: warning: the frozen-rank watch failed ({type(e).__name__}: {e})", file=sys.stderr)

    def frozen(self, beats: dict[int, dict[str, Any]], now: float) -> list[int]:
        """Ranks whose heartbeat stopped for longer than the job's hang timeout (and a few periods), still
        running by their last word (not finished, no exit recorded), in a process that still exists. The
        timeout is the shortest any running rank reports: a rank frozen before its first beat of a step still
        says 'init' (the start-up limit), while its peers, stepping, say the step's."""
        running = {r: b for r, b in beats.items() if not b.get("exit") and b.get("phase") != "done" and "pid" in b}
        if not running:
            return []
        timeout = min(float(b.get("timeout_s", float("inf"))) for b in running.values())
        out = []
        for r, beat in sorted(running.items()):
            stale = now - float(beat["time"])
            alive = process_state(int(beat["pid"])) not in ("", "exited")
            if beat["time"] >= self.started and stale > timeout + STALE_BEATS * self.heartbeat_s and alive:
                out.append(r)
        return out

    def check(self, now: float | None = None) -> dict[str, Any] | None:
        """One look at the heartbeats: the verdict when a rank is frozen (after acting on it), else None."""
        k, beats = read_beats(self.run_dir, self.node)
        if k < 0 or k in self.judged:
            return None
        now = time.time() if now is None else now
        frozen = self.frozen(beats, now)
        if not frozen:
            return None
        self.judged.add(k)
        return self.act(k, beats, frozen, now)

    def act(self, k: int, beats: dict[int, dict[str, Any]], frozen: list[int], now: float) -> dict[str, Any]:
        """Name, dump, record, hand the verdict to the live ranks, and end the frozen processes."""
        stuck = [self._where(r, beats, frozen, now) for r in frozen]
        waiting = sorted(set(beats) - set(frozen))
        timeout = min(float(b.get("timeout_s", float("inf"))) for b in beats.values() if "pid" in b)
        verdict = {"by": "launcher", "node": self.node, "stuck": stuck, "waiting": waiting, "timeout_s": timeout}
        stack_dir = health_dir(self.run_dir) / "stacks"
        stack_dir.mkdir(exist_ok=True)
        for s in stuck:  # named and recorded first: reading stacks from outside can take seconds on a busy machine
            msg = message(s, timeout)
            record_exit(self.run_dir, s["rank"], msg, k)
            print(f"disttrain: {msg}; stacks in {stack_dir}; ending it", file=sys.stderr, flush=True)
        log_event(self.run_dir, "hang", **{**verdict, "attempt": k})
        path = health_dir(self.run_dir) / f"verdict-attempt{k}.json"
        tmp = path.with_name(f".{path.name}.tmp")
        tmp.write_text(json.dumps(verdict))
        os.replace(tmp, path)
        for s in stuck:  # still stopped: its stacks stay where they froze
            dump = stacks_of(s["pid"])
            (stack_dir / f"attempt{k}-rank{s['rank']}-frozen.txt").write_text(f"# {message(s, timeout)}\n{dump}")
        self._let_the_others_dump([int(beats[r]["pid"]) for r in waiting if "pid" in beats[r]])
        for s in stuck:
            try:
                os.kill(s["pid"], signal.SIGKILL)  # a stopped process dies of SIGKILL too
            except ProcessLookupError:
                pass
        return verdict

    @staticmethod
    def _where(r: int, beats: dict[int, dict[str, Any]], frozen: list[int], now: float) -> dict[str, Any]:
        """Where frozen rank ``r`` stopped: its last heartbeat's step and phase, or, when the ranks waiting
        for it are in a later step (it froze between two of its heartbeats), their step: a synchronous job's
        ranks wait in the step that the frozen one never finished."""
        b = beats[r]

        def step_of(beat: dict[str, Any]) -> int:
            return int(beat["step"]) + (beat["phase"] in IN_STEP)

        waiting = [step_of(beats[q]) for q in beats if q not in frozen and "pid" in beats[q]]
        step, phase = step_of(b), b["phase"]
        if waiting and min(waiting) > step:
            step, phase = min(waiting), "unknown"
        return {
            "rank": r,
            **({"role": b["role"]} if "role" in b else {}),
            "step": step,
            "phase": phase,
            "last_heard": {"step": int(b["step"]), "phase": b["phase"]},
            "idle_s": round(float(b["in_phase_s"]) + now - float(b["time"]), 2),
            "silent_s": round(now - float(b["time"]), 2),
            "pid": int(b["pid"]),
            "process": process_state(int(b["pid"])),
            "frozen": True,
        }

    def _let_the_others_dump(self, pids: list[int]) -> None:
        """Wait (bounded) until the live ranks, which read the verdict at their next heartbeat, have dumped their
        stacks and left: once the frozen rank is killed, torchrun ends them at once."""
        deadline = time.monotonic() + 4 * self.heartbeat_s + 3
        while time.monotonic() < deadline and any(process_state(p) not in ("", "exited") for p in pids):
            time.sleep(0.05)


def watch_frozen(cfg: HealthConfig, run_dir: Path, node: int) -> contextlib.AbstractContextManager[Any]:
    """The watch over this node's ranks while torchrun runs them (nothing when health monitoring is off)."""
    return FrozenWatch(run_dir, node, cfg.heartbeat_s) if cfg.enabled else contextlib.nullcontext()
