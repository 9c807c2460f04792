"""The soak's hands and eyes (:mod:`benchmarks.soak`): what it reads of a running job (metrics.jsonl,
health/events.jsonl, heartbeat files, committed checkpoints, the console) and the faults it deals from outside
(SIGKILL or SIGSTOP of a rank's process, a full checkpoint disk, a truncated newest checkpoint), each followed
to the moment the job trains again.

A fault the job gets through ``DISTTRAIN_FAULT`` (``step``, ``freeze``: once per job; ``nan``: every attempt)
fires on its own; the driver only waits for it (the mark of a ``:once`` fault in ``DISTTRAIN_FAULT_STATE``,
the NaN record) and then measures the same way.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from disttrain.checkpoint.layout import MARKER, STEP_RE

RESTARTING = frozenset({"kill", "stop", "truncate"})  # the kinds that end an attempt; nan and disk_full do not
SAVE_FAILED = re.compile(r"checkpoint at step (\d+) failed and was not committed")


class SoakError(RuntimeError):
    """The job did not get through a fault (or ended before the soak was done): the message says where."""


@dataclass(frozen=True)
class Planned:
    """One fault of the draw: its kind, the step from which it acts, the rank it hits, and whether the job
    injects it itself (``DISTTRAIN_FAULT``) or the driver deals it from outside."""

    kind: str
    step: int
    rank: int
    injected: bool
    slack_kib: int = 4  # disk_full: what is left free on the checkpoint disk (a save fails at some file)
    delay_ms: int = 0  # kill, stop from outside: how long after the step's record (any phase, a save too)

    def spec(self) -> str | None:
        """Its ``DISTTRAIN_FAULT`` entry, for the faults the job injects itself."""
        if self.kind == "nan":
            return f"nan:{self.step}:{self.rank}:every"  # a bad batch stays bad when a resume replays it
        if self.injected:
            return f"{'step' if self.kind == 'kill' else 'freeze'}:{self.step}:{self.rank}:once"
        return None

    @property
    def how(self) -> str:
        return "injected" if self.injected else "outside"


@dataclass
class Outcome:
    """What became of one fault."""

    planned: Planned
    fault_time: float = 0.0
    attempt: int = 0  # the attempt it hit
    survived: bool = False
    seconds: float | None = None  # from the fault to the next logged step (after the restart, if one)
    restarts: int = 0
    resumed_from: int | None = None
    detected_s: float | None = None  # a frozen rank: from the stop to the hang verdict
    named: bool | None = None  # the restart's cause (or the hang verdict) names the rank hit
    note: str = ""
    extra: dict[str, Any] = field(default_factory=dict)


class JsonLines:
    """The records of a JSON-lines file that another process appends to, read as they come."""

    def __init__(self, path: Path) -> None:
        self.path, self.offset, self.torn = path, 0, 0  # torn: lines that are no JSON (cut short)
        self.records: list[dict[str, Any]] = []

    def poll(self) -> list[dict[str, Any]]:
        try:
            with open(self.path, "rb") as f:
                f.seek(self.offset)
                data = f.read()
        except FileNotFoundError:
            return self.records
        end = data.rfind(b"\n") + 1  # a line being written is read next time
        self.offset += end
        for line in data[:end].splitlines():
            try:
                self.records.append(json.loads(line))
            except ValueError:
                self.torn += 1
        return self.records


class Console:
    """The job's console (stdout and stderr), kept in memory and in a file, read on a thread."""

    def __init__(self, proc: subprocess.Popen[str], log: Path) -> None:
        self.lines: list[tuple[float, str]] = []
        self._thread = threading.Thread(target=self._read, args=(proc, log), daemon=True)
        self._thread.start()

    def _read(self, proc: subprocess.Popen[str], log: Path) -> None:
        assert proc.stdout is not None
        with open(log, "w") as out:
            for line in proc.stdout:
                self.lines.append((time.time(), line))
                out.write(line)
                out.flush()

    def join(self) -> None:
        self._thread.join(timeout=10)


def process_state(pid: int) -> str:
    """The kernel's one-letter state of ``pid`` ('' when it is gone)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return ""
    return stat[stat.rindex(")") + 2 :].split()[0]


class Driver:
    """Watches one running ``disttrain run`` job and deals it the planned faults, one at a time."""

    def __init__(
        self, proc: subprocess.Popen[str], console: Console, run: Path, ckpt: Path, state: Path, disk: Path
    ) -> None:
        self.proc, self.console, self.run, self.ckpt, self.state, self.disk = proc, console, run, ckpt, state, disk
        self.metrics = JsonLines(run / "metrics.jsonl")
        self.events = JsonLines(run / "health" / "events.jsonl")
        self.stopped: list[int] = []  # pids this driver stopped: killed at the end if anything is left of them
        self.timeout_s = 240.0

    # -- looking -------------------------------------------------------------------------------------
    def wait(self, what: str, found: Callable[[], Any], timeout_s: float | None = None) -> Any:
        """Poll ``found`` until it returns something truthy; SoakError when the job ends or time runs out."""
        deadline = time.time() + (timeout_s or self.timeout_s)
        while time.time() < deadline:
            if value := found():
                return value
            if self.proc.poll() is not None:
                if value := found():
                    return value
                raise SoakError(f"the job ended (exit {self.proc.returncode}) while waiting for {what}")
            time.sleep(0.02)
        raise SoakError(f"timed out after {timeout_s or self.timeout_s:.0f}s waiting for {what}")

    def last_step(self) -> int:
        records = self.metrics.poll()
        return int(records[-1]["step"]) if records else 0

    def committed_steps(self) -> list[int]:
        """The steps of the committed checkpoints (COMMITTED written), oldest first."""
        steps = [int(m.group(1)) for p in self.ckpt.glob("step-*") if (m := STEP_RE.match(p.name))]
        return sorted(s for s in steps if (self.ckpt / f"step-{s:08d}" / MARKER).is_file())

    def committed(self) -> int:
        """The newest committed checkpoint's step (0: none)."""
        return max(self.committed_steps(), default=0)

    def worker(self, rank: int) -> tuple[int, int] | None:
        """(pid, attempt) of rank ``rank``'s process of the newest attempt, from its heartbeat file."""
        beats = []
        for p in (self.run / "health").glob(f"attempt*-rank{rank}.json"):
            try:
                beat = json.loads(p.read_text())
                beats.append((int(beat["attempt"]), int(beat["pid"])))
            except (OSError, ValueError, KeyError):
                continue
        if not beats:
            return None
        k, pid = max(beats)
        return (pid, k) if process_state(pid) not in ("", "Z", "X") else None

    def attempt(self) -> int:
        """The newest attempt that has a heartbeat file."""
        names = (p.name for p in (self.run / "health").glob("attempt*-rank*.json"))
        return max((int(m.group(1)) for n in names if (m := re.match(r"attempt(\d+)-", n))), default=0)

    def mark(self, p: Planned) -> dict[str, Any] | None:
        """The mark a ``:once`` fault left when it fired."""
        path = self.state / f"{'step' if p.kind == 'kill' else 'freeze'}-{p.step}-{p.rank}"
        try:
            return dict(json.loads(path.read_text()))
        except (OSError, ValueError):
            return None

    # -- dealing faults ------------------------------------------------------------------------------
    def deal(self, p: Planned) -> Outcome:
        """Deal (or wait for) fault ``p`` and follow it until the job trains again."""
        out = Outcome(p)
        {"kill": self.kill, "stop": self.stop, "nan": self.nan, "disk_full": self.disk_full}.get(p.kind, self.truncate)(
            p, out
        )
        self.follow(out)
        out.survived = True
        return out

    def signal_rank(self, p: Planned, out: Outcome, sig: signal.Signals) -> None:
        self.wait(f"step {p.step}", lambda: self.last_step() >= p.step)
        time.sleep(p.delay_ms / 1000)
        pid, out.attempt = self.wait(f"rank {p.rank}'s process", lambda: self.worker(p.rank))
        out.fault_time, out.extra["committed"] = time.time(), self.committed_steps()
        os.kill(pid, sig)
        if sig == signal.SIGSTOP:
            self.stopped.append(pid)

    def injected(self, p: Planned, out: Outcome) -> None:
        mark = self.wait(f"{p.spec()} to fire", lambda: self.mark(p))
        out.fault_time, out.attempt = float(mark["time"]), int(mark["attempt"])
        out.extra["committed"] = self.committed_steps()  # read a moment after: a commit may have come since

    def kill(self, p: Planned, out: Outcome) -> None:
        if p.injected:
            self.injected(p, out)
        else:
            self.signal_rank(p, out, signal.SIGKILL)

    def stop(self, p: Planned, out: Outcome) -> None:
        if p.injected:
            self.injected(p, out)
        else:
            self.signal_rank(p, out, signal.SIGSTOP)

    def nan(self, p: Planned, out: Outcome) -> None:
        def record() -> dict[str, Any] | None:
            return next((r for r in self.metrics.poll() if r["step"] == p.step and r.get("nonfinite")), None)

        rec = self.wait(f"the NaN of step {p.step}", record)
        out.attempt = self.attempt()
        out.fault_time, out.note = float(rec["time"]), f"step {p.step} skipped (nonfinite)"

    def disk_full(self, p: Planned, out: Outcome) -> None:
        """Fill the checkpoint disk right after a commit, and keep it full (the purge of an old checkpoint frees
        space), so that the next save meets ENOSPC; free it once the job reports that save failed."""
        self.wait(f"step {p.step}", lambda: self.last_step() >= p.step)
        before = self.committed()
        self.wait(f"a checkpoint after step {before}", lambda: self.committed() > before)
        filler, seen = self.disk / "filler", len(self.console.lines)
        fill(filler, p.slack_kib * 1024)
        out.fault_time, out.attempt = time.time(), self.attempt()

        def failed() -> tuple[float, int] | None:
            fill(filler, p.slack_kib * 1024)  # tops it up
            for t, line in self.console.lines[seen:]:
                if m := SAVE_FAILED.search(line):
                    return t, int(m.group(1))
            return None

        try:
            t_failed, step = self.wait("a save to fail on the full disk", failed)
        finally:
            filler.unlink()
        out.extra.update(failed_save=step, failed_after_s=t_failed - out.fault_time)
        out.note = f"save of step {step} failed ({p.slack_kib} KiB free)"
        after = self.wait(f"a checkpoint after step {step}", lambda: (c := self.committed()) > step and c)
        out.note += f", step {after} committed"

    def truncate(self, p: Planned, out: Outcome) -> None:
        """Right after a commit, cut the newest checkpoint's biggest file in half and SIGKILL a rank: the
        restart must see it, skip it and resume from the one before."""
        self.wait(f"step {p.step}", lambda: self.last_step() >= p.step)
        before = self.committed()
        newest = self.wait(f"a checkpoint after step {before}", lambda: (c := self.committed()) > before and c)
        folder = self.ckpt / f"step-{newest:08d}"
        victim = max((f for f in folder.rglob("*.distcp")), key=lambda f: f.stat().st_size)
        with open(victim, "r+b") as f:
            f.truncate(victim.stat().st_size // 2)
        self.signal_rank(Planned("kill", 0, p.rank, False), out, signal.SIGKILL)
        out.extra.update(truncated=f"{folder.name}/{victim.name}", truncated_step=newest)

    # -- following -------------------------------------------------------------------------------------
    def follow(self, out: Outcome) -> None:
        """Wait for the first step logged after the fault (and, for a fault that ends the attempt, after the
        restart); fill in the figures."""
        restarting = out.planned.kind in RESTARTING

        def again() -> dict[str, Any] | None:
            restarts = self.restarts_after(out)
            if restarting and not restarts:
                return None
            since = restarts[-1]["time"] if restarting else out.fault_time
            return next((r for r in self.metrics.poll() if r["time"] > since), None)

        rec = self.wait(f"training again after {out.planned.kind}", again)
        restarts = [e for e in self.restarts_after(out) if e["time"] < rec["time"]]  # not the next fault's
        out.seconds, out.restarts = rec["time"] - out.fault_time, len(restarts)
        if restarts:
            out.resumed_from = restarts[-1].get("resumed_from")
            self.check_resume(out)
            cause, r = restarts[0].get("cause", ""), out.planned.rank
            out.named = cause.startswith((f"rank {r} at", f"hang: rank {r} "))
            out.extra["cause"] = restarts[0].get("cause", "")[:200]
        if out.planned.kind == "stop":
            self.hang_verdict(out)
        if out.planned.kind == "truncate":
            fell_back = (out.resumed_from or 0) < out.extra["truncated_step"]
            out.note = f"{out.extra['truncated']} cut; resumed from {out.resumed_from}" + ("" if fell_back else " (!)")
            out.extra["fell_back"] = fell_back

    @staticmethod
    def check_resume(out: Outcome) -> None:
        """Did the restart resume from the newest intact checkpoint there was at the fault? (A truncated one is
        not intact: the one before it.) ``lost_checkpoint``: True when it resumed from an older one."""
        truncated = out.extra.get("truncated_step")
        intact = [s for s in out.extra.get("committed", []) if truncated is None or s < truncated]
        out.extra["expected_resume"] = expected = max(intact, default=None)
        out.extra["lost_checkpoint"] = expected is not None and (out.resumed_from or 0) < expected

    def restarts_after(self, out: Outcome) -> list[dict[str, Any]]:
        events = self.events.poll()
        return [
            e for e in events if e["event"] == "restart" and e["attempt"] > out.attempt and e["time"] > out.fault_time
        ]

    def hang_verdict(self, out: Outcome) -> None:
        hangs = [e for e in self.events.poll() if e["event"] == "hang" and e["attempt"] == out.attempt]
        if hangs:
            out.detected_s = hangs[0]["time"] - out.fault_time
            out.named = [s["rank"] for s in hangs[0]["stuck"]] == [out.planned.rank]
            out.note = f"named by the {'launcher' if hangs[0].get('by') == 'launcher' else 'watchdog'}"

    def cleanup(self) -> None:
        """End what is left of the processes this driver stopped (a stopped process dies of SIGKILL)."""
        for pid in self.stopped:
            if process_state(pid) in ("T", "t"):
                os.kill(pid, signal.SIGKILL)


def fill(path: Path, slack: int) -> None:
    """Fill the file system of ``path`` (appending to it) until ``slack`` bytes are left."""
    st = os.statvfs(path.parent)
    free = st.f_bavail * st.f_frsize - slack
    with open(path, "ab") as f:
        chunk = b"\0" * (1 << 20)
        while free > 0:
            try:
                free -= f.write(chunk[: min(free, len(chunk))])
            except OSError:
                break
