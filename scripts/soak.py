"""The soak: one long ``disttrain run`` job meets random faults of every kind the project claims to survive,
drawn from a seed, and must end exactly where an uninterrupted run (with the same NaNs) ends.

The job: the tiny GPT, 2 ranks, FSDP, fp32, a checkpoint every ``--interval`` steps onto a small tmpfs of its own
(mounted here: root), heartbeats every 0.5 s, a hang timeout of 5 s. The faults (:data:`KINDS`; what each tests:
docs/fault-tolerance.md), one at a time, every kind once when there are five or more, any rank, from outside or
injected. The checks: losses bitwise equal but the skipped NaN steps, every kept checkpoint verifies and equals the
uninterrupted run's, nothing temporary left behind; per fault, the seconds to training again. Needs root; not a
speed benchmark (so not in benchmarks/), but it runs through their harness, from the repository root:

    .venv/bin/python -m scripts.soak [--seed 1] [--steps 300] [--faults 12] [--keep] [--quick]  # as root
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from benchmarks import harness as H
from disttrain.checkpoint.layout import CHECKSUMS, MARKER, METADATA, STEP_RE, TMP_PREFIX
from disttrain.testing.launch import DISTTRAIN, child_env
from disttrain.testing.tiny import tiny_cli_args, write_small_text

KINDS = ("kill", "stop", "disk_full", "truncate", "nan")
RESTARTING = frozenset({"kill", "stop", "truncate"})  # the kinds that end an attempt; nan and disk_full do not
SAVE_FAILED = re.compile(r"checkpoint at step (\d+) failed and was not committed")
RANKS, DISK_MB = 2, 16
OPTIONS = {
    **H.options(steps=300),
    "seed": (1, "draws the faults: kinds, steps, ranks, inside or outside"),
    "faults": (12, "faults dealt"),
    "interval": (5, "checkpoint every N steps"),
    "keep": (False, "keep the run folders (printed)"),
}
QUICK = {"steps": 100, "faults": 5}  # one of each kind


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


def process_state(pid: int) -> str:
    """The kernel's one-letter state of ``pid`` ('' when it is gone)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return ""
    return stat[stat.rindex(")") + 2 :].split()[0]


# -- the driver: what it reads of the running job and the faults it deals ---------------------------------
class Driver:
    """Watches one running ``disttrain run`` job (metrics.jsonl, health/, the committed checkpoints, its console
    in ``log``) and deals it the planned faults, one at a time; a fault the job injects fires on its own, and
    the driver waits for its mark (``DISTTRAIN_FAULT_STATE``) or its NaN record."""

    def __init__(self, proc: subprocess.Popen[bytes], log: Path, run: Path, ckpt: Path, state: Path) -> None:
        self.proc, self.log, self.run, self.ckpt, self.state = proc, log, run, ckpt, state
        self.metrics = JsonLines(run / "metrics.jsonl")
        self.events = JsonLines(run / "health" / "events.jsonl")
        self.stopped: list[int] = []  # pids this driver stopped: killed at the end if anything is left of them

    def wait(self, what: str, found: Callable[[], Any]) -> Any:
        """``found()`` once it is truthy; :class:`~benchmarks.harness.NotYet` when the job ends or time runs out."""
        return H.wait_for(what, found, [self.proc])

    def at_step(self, step: int) -> None:
        self.wait(f"step {step}", lambda: (r := self.metrics.poll()) and r[-1]["step"] >= step)

    def committed_steps(self) -> list[int]:
        """The steps of the committed checkpoints (COMMITTED written), oldest first."""
        steps = [int(m.group(1)) for p in self.ckpt.glob("step-*") if (m := STEP_RE.match(p.name))]
        return sorted(s for s in steps if (self.ckpt / f"step-{s:08d}" / MARKER).is_file())

    def next_commit(self) -> int:
        """Wait for a checkpoint newer than the newest now; its step."""
        before = max(self.committed_steps(), default=0)
        return int(self.wait(f"a checkpoint after step {before}", lambda: (c := self.newest()) > before and c))

    def newest(self) -> int:
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

    # -- dealing faults ------------------------------------------------------------------------------
    def deal(self, p: Planned) -> Outcome:
        """Deal (or wait for) fault ``p`` and follow it until the job trains again."""
        out = Outcome(p)
        if p.kind in ("kill", "stop"):
            self.injected(p, out) if p.injected else self.signal_rank(p, out)
        else:
            {"nan": self.nan, "disk_full": self.disk_full, "truncate": self.truncate}[p.kind](p, out)
        self.follow(out)
        out.survived = True
        return out

    def signal_rank(self, p: Planned, out: Outcome) -> None:
        self.at_step(p.step)
        time.sleep(p.delay_ms / 1000)
        pid, out.attempt = self.wait(f"rank {p.rank}'s process", lambda: self.worker(p.rank))
        out.fault_time, out.extra["committed"] = time.time(), self.committed_steps()
        os.kill(pid, signal.SIGSTOP if p.kind == "stop" else signal.SIGKILL)
        if p.kind == "stop":
            self.stopped.append(pid)

    def injected(self, p: Planned, out: Outcome) -> None:
        path = self.state / f"{'step' if p.kind == 'kill' else 'freeze'}-{p.step}-{p.rank}"

        def mark() -> dict[str, Any] | None:  # the mark a ``:once`` fault leaves when it fires
            try:
                return dict(json.loads(path.read_text()))
            except (OSError, ValueError):
                return None

        found = self.wait(f"{p.spec()} to fire", mark)
        out.fault_time, out.attempt = float(found["time"]), int(found["attempt"])
        out.extra["committed"] = self.committed_steps()  # read a moment after: a commit may have come since

    def nan(self, p: Planned, out: Outcome) -> None:
        def record() -> dict[str, Any] | None:
            return next((r for r in self.metrics.poll() if r["step"] == p.step and r.get("nonfinite")), None)

        rec = self.wait(f"the NaN of step {p.step}", record)
        out.attempt, out.fault_time, out.note = self.attempt(), float(rec["time"]), f"step {p.step} skipped (nonfinite)"

    def disk_full(self, p: Planned, out: Outcome) -> None:
        """Fill the checkpoint disk right after a commit, and keep it full (the purge of an old checkpoint frees
        space), so that the next save meets ENOSPC; free it once the job reports that save failed."""
        self.at_step(p.step)
        self.next_commit()
        filler, seen = self.ckpt.parent / "filler", self.log.stat().st_size
        fill(filler, p.slack_kib * 1024)
        out.fault_time, out.attempt = time.time(), self.attempt()

        def failed() -> int | None:
            fill(filler, p.slack_kib * 1024)  # tops it up
            with open(self.log, "rb") as f:
                f.seek(seen)
                m = SAVE_FAILED.search(f.read().decode(errors="replace"))
            return int(m.group(1)) if m else None

        try:
            step = self.wait("a save to fail on the full disk", failed)
        finally:
            filler.unlink()
        out.extra.update(failed_save=step, failed_after_s=time.time() - out.fault_time)
        out.note = f"save of step {step} failed ({p.slack_kib} KiB free)"
        after = self.wait(f"a checkpoint after step {step}", lambda: (c := self.newest()) > step and c)
        out.note += f", step {after} committed"

    def truncate(self, p: Planned, out: Outcome) -> None:
        """Right after a commit, cut the newest checkpoint's biggest file in half and SIGKILL a rank: the
        restart must see it, skip it and resume from the one before."""
        self.at_step(p.step)
        newest = self.next_commit()
        folder = self.ckpt / f"step-{newest:08d}"
        victim = max(folder.rglob("*.distcp"), key=lambda f: f.stat().st_size)
        os.truncate(victim, victim.stat().st_size // 2)
        self.signal_rank(Planned("kill", 0, p.rank, False), out)
        out.extra.update(truncated=f"{folder.name}/{victim.name}", truncated_step=newest)

    # -- following -----------------------------------------------------------------------------------
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
            # the newest intact checkpoint there was at the fault (a truncated one is not intact)
            cut = out.extra.get("truncated_step")
            expected = max((s for s in out.extra.get("committed", []) if cut is None or s < cut), default=None)
            out.extra["lost_checkpoint"] = expected is not None and (out.resumed_from or 0) < expected
            cause, r = restarts[0].get("cause", ""), out.planned.rank
            out.named, out.extra["cause"] = cause.startswith((f"rank {r} at", f"hang: rank {r} ")), cause[:200]
        if out.planned.kind == "stop":
            hangs = [e for e in self.events.poll() if e["event"] == "hang" and e["attempt"] == out.attempt]
            if hangs:
                out.detected_s = hangs[0]["time"] - out.fault_time
                out.named = [s["rank"] for s in hangs[0]["stuck"]] == [out.planned.rank]
                out.note = f"named by the {'launcher' if hangs[0].get('by') == 'launcher' else 'watchdog'}"
        if out.planned.kind == "truncate":
            out.extra["fell_back"] = fell_back = (out.resumed_from or 0) < out.extra["truncated_step"]
            out.note = f"{out.extra['truncated']} cut; resumed from {out.resumed_from}" + ("" if fell_back else " (!)")

    def restarts_after(self, out: Outcome) -> list[dict[str, Any]]:
        restarts = [e for e in self.events.poll() if e["event"] == "restart" and e["attempt"] > out.attempt]
        return [e for e in restarts if e["time"] > out.fault_time]


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


# -- the draw and the jobs ------------------------------------------------------------------------------
def draw(seed: int, steps: int, n: int, interval: int) -> list[Planned]:
    """``n`` faults: every kind once (when n >= 5), a second kill and stop (n >= 7), the rest at random; one
    per equal slice of the steps between the second checkpoint and the last two, at a random step of its slice
    that leaves the one before three checkpoints' room. A kind's first fault hits a random rank (kill and
    stop: from outside or injected, at random); its next ones take turns, so both ranks and both ways meet
    every kind that comes twice."""
    rng = random.Random(seed)
    base = [*KINDS, "kill", "stop"] if n >= 7 else list(KINDS)
    kinds = base[:n] + [rng.choice(KINDS) for _ in range(n - len(base))]
    rng.shuffle(kinds)
    lo, hi = 2 * interval + 1, steps - 2 * interval
    width = (hi - lo) / n
    if width < 3 * interval:
        raise SystemExit(f"{n} faults in {steps} steps leave {width:.0f} steps each; at least {3 * interval} needed")
    plan: list[Planned] = []
    for i, kind in enumerate(kinds):
        step = lo + math.ceil(i * width) + rng.randrange(max(1, int(width) - 3 * interval + 1))
        before = [q for q in plan if q.kind == kind]
        rank = 1 - before[-1].rank if before else rng.randrange(RANKS)
        injected = kind == "nan" or (
            kind in ("kill", "stop") and (not before[-1].injected if before else rng.random() < 0.5)
        )
        slack = rng.randrange(4, 1200) if kind == "disk_full" else 4  # KiB: less than one save (~1.7 MiB)
        delay = rng.randrange(500) if kind in ("kill", "stop") and not injected else 0  # ms: ~10 steps here
        plan.append(Planned(kind, step, rank, injected, slack, delay))
    return plan


def job(args: argparse.Namespace, data: Path, root: Path, name: str, *extra: str) -> list[str]:
    opts = f"--run.root {root} --run.name {name} --parallel.strategy fsdp --checkpoint.interval {args.interval}"
    opts += f" --launch.max-restarts {2 * args.faults + 2} --health.heartbeat-s 0.5 --health.hang-timeout-s 5"
    return [str(DISTTRAIN), *tiny_cli_args(data, args.steps, *opts.split(), *extra)]


def environment(plan: list[Planned], state: Path | None) -> dict[str, str]:
    """The job's environment: the injected faults (all of them in the soak, the NaNs in the reference)."""
    specs = [s for p in plan if (s := p.spec()) and (state is not None or p.kind == "nan")]
    extra = {"DISTTRAIN_FAULT": ",".join(specs)} if specs else {}
    if state is not None:
        extra["DISTTRAIN_FAULT_STATE"] = str(state)
    return child_env(extra=extra)


@contextmanager
def tmpfs(path: Path, size_mb: int) -> Iterator[Path]:
    """A tmpfs of ``size_mb`` MiB at ``path`` (root only), unmounted at the end."""
    path.mkdir(parents=True, exist_ok=True)
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size_mb}m", "tmpfs", str(path)], capture_output=True)
    if done.returncode != 0:
        raise SystemExit(f"mounting a tmpfs at {path} failed (the soak needs root): {done.stderr.decode().strip()}")
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], check=False)


def soak(args: argparse.Namespace, plan: list[Planned], data: Path, root: Path) -> dict[str, Any]:
    """The faulted run: start it, deal the faults one by one, wait for its end; outcomes and checks' inputs."""
    state, run, log = root / "fault-state", root / "soak", root / "soak.log"
    with tmpfs(root / "ckpt-disk", DISK_MB) as disk, open(log, "wb") as console:
        ckpt = disk / "checkpoints"
        cmd = job(args, data, root, "soak", "--checkpoint.folder", str(ckpt))
        t0 = time.perf_counter()
        proc = subprocess.Popen(
            cmd, env=environment(plan, state), stdout=console, stderr=subprocess.STDOUT, start_new_session=True
        )
        driver = Driver(proc, log, run, ckpt, state)
        try:
            outcomes, error = deal_all(driver, plan)
            if error is None:
                try:
                    proc.wait(timeout=600)
                except subprocess.TimeoutExpired:
                    error = "the job did not end within 600 s of the last fault"
            wall = time.perf_counter() - t0
        finally:  # also on Ctrl-C or a bug here: nothing of the job outlives the soak, the tmpfs unmounts
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
            for pid in driver.stopped:  # a stopped process dies of SIGKILL
                if process_state(pid) in ("T", "t"):
                    os.kill(pid, signal.SIGKILL)
        leftovers = [str(p) for p in [*ckpt.glob(f"{TMP_PREFIX}*"), *ckpt.glob(f"*/{CHECKSUMS}")]]
        leftovers += [str(p) for p in (run / "health").rglob(".*")] + [str(p) for p in disk.glob("filler")]
        same_bytes, checkpoints = same_files(ckpt, root / "reference" / "checkpoints"), verify(run)
    return {
        "outcomes": outcomes,
        "error": error,
        "rc": None if error else proc.returncode,
        "wall_s": wall,
        "leftovers": leftovers,
        "checkpoints": checkpoints,
        "same_bytes": same_bytes,
        "torn_lines": driver.metrics.torn + driver.events.torn,
    }


def deal_all(driver: Driver, plan: list[Planned]) -> tuple[list[Outcome], str | None]:
    outcomes = []
    for i, p in enumerate(plan):
        print(f"fault {i + 1}/{len(plan)}: {p.kind} ({p.how}) of rank {p.rank} from step {p.step}", flush=True)
        try:
            out = driver.deal(p)
        except H.NotYet as e:
            outcomes.append(Outcome(p, note=str(e)))
            return outcomes, f"fault {i + 1} ({p.kind}): {e}"
        print(f"  trains again {out.seconds:.2f}s after it; {out.note}", flush=True)
        outcomes.append(out)
    return outcomes, None


# -- the checks --------------------------------------------------------------------------------------------
def losses(run: Path) -> dict[int, tuple[float, bool]]:
    """Each step's (loss, nonfinite) as last logged (a step run again after a resume logs again)."""
    return {
        int(r["step"]): (r["loss"], bool(r.get("nonfinite"))) for r in H.records(run / "metrics.jsonl") if "loss" in r
    }


def compare(ref: dict[int, tuple[float, bool]], got: dict[int, tuple[float, bool]], nans: set[int]) -> dict[str, Any]:
    """Bitwise equal losses except the steps both runs logged non-finite, which must be the planned NaNs."""
    skipped = sorted(s for s, (_, bad) in got.items() if bad)
    differ = [s for s in sorted(ref) if s not in skipped and got.get(s, (None,))[0] != ref[s][0]]
    missing = sorted(set(ref) - set(got))
    return {
        "steps": len(ref),
        "equal_bitwise": len(set(ref) - set(skipped)) - len(differ),
        "differ": differ[:20],
        "missing": missing[:20],
        "skipped_named": skipped,
        "ok": not differ and not missing and set(skipped) == nans == {s for s, (_, b) in ref.items() if b},
    }


def verify(run: Path) -> list[dict[str, Any]]:
    """``disttrain ckpt verify --all --json`` of the run's checkpoints: each one's step and verdict."""
    ran = H.command([str(DISTTRAIN), "ckpt", "verify", "--all", "--json", str(run)], env=child_env(), check=False)
    try:
        return [{"step": c["step"], "ok": c["ok"], "problems": c["problems"]} for c in json.loads(ran.stdout)]
    except (ValueError, KeyError):
        return [{"step": None, "ok": False, "problems": [(ran.stdout + ran.stderr)[-500:]]}]


def same_files(ckpt: Path, ref: Path) -> dict[str, list[str]]:
    """Per kept checkpoint, the files whose size and CRC32 (manifest.json) differ from the uninterrupted run's
    checkpoint of the same step (DCP's ``.metadata`` left out: it holds a fresh id per save)."""
    out = {}
    for manifest in sorted(ckpt.glob("step-*/manifest.json")):
        theirs = ref / manifest.parent.name / "manifest.json"
        mine = json.loads(manifest.read_text())["files"]
        other = json.loads(theirs.read_text())["files"] if theirs.is_file() else {}
        out[manifest.parent.name] = sorted(
            n for n in (mine.keys() | other.keys()) - {METADATA} if mine.get(n) != other.get(n)
        )
    return out


def report(plan: list[Planned], result: dict[str, Any], ref_wall: float, cmp: dict[str, Any]) -> dict[str, Any]:
    outcomes: list[Outcome] = result["outcomes"]
    rows = [
        {"#": i + 1, "kind": o.planned.kind, "how": o.planned.how, "rank": o.planned.rank, "from step": o.planned.step}
        | {"restarts": o.restarts, "resumed": o.resumed_from, "detected": o.detected_s, "seconds": o.seconds}
        | {"named": o.named, "note": o.note}
        for i, o in enumerate(outcomes)
    ]
    H.table(rows, "faults, and the seconds from each to the next step logged (after the restart, if one)")
    survived = [o for o in outcomes if o.survived]
    restarting = [o for o in survived if o.planned.kind in RESTARTING]
    stopping = [o.seconds for o in restarting if o.seconds is not None]
    checks = {
        f"faults survived ({dict(Counter(o.planned.kind for o in survived))})": len(survived) == len(plan),
        f"the job's exit code ({result['rc']})": result["rc"] == 0,
        f"losses bitwise equal but the NaN steps ({cmp['equal_bitwise']}/{cmp['steps']}; {cmp})": cmp["ok"],
        f"checkpoints kept verify ({result['checkpoints']})": bool(result["checkpoints"])
        and all(c["ok"] for c in result["checkpoints"]),
        "shard and RNG files equal to the uninterrupted run's": not any(result["same_bytes"].values()),
        "every restart named the rank hit": all(o.named for o in restarting),
        "resumed from the newest intact checkpoint": not any(o.extra.get("lost_checkpoint") for o in survived),
        "every truncation fell back": all(o.extra.get("fell_back") for o in survived if o.planned.kind == "truncate"),
        f"no temporary files left ({result['leftovers']})": not result["leftovers"],
        f"no torn log lines ({result['torn_lines']})": not result["torn_lines"],
        f"no error ({result['error']})": not result["error"],
    }
    H.table([{"check": k[:200], "": "ok" if v else "FAILED"} for k, v in checks.items()])
    summary = {"ok": all(checks.values()), "checks": checks, "restarts": sum(o.restarts for o in survived)}
    summary |= {
        "restart_faults_median_s": H.median(stopping) if stopping else None,
        "restart_faults_worst_s": max(stopping, default=None),
    }
    if stopping:
        print(f"fault -> training again (kill, stop, truncate): median {H.median(stopping):.1f} s, ", end="")
        print(f"worst {max(stopping):.1f} s")
    print(f"wall time: soak {result['wall_s']:.0f}s, uninterrupted {ref_wall:.0f}s")
    print("soak: " + ("PASSED" if summary["ok"] else "FAILED"), flush=True)
    return summary | {"soak_wall_s": result["wall_s"], "reference_wall_s": ref_wall, "same_bytes": result["same_bytes"]}


def run(args: argparse.Namespace) -> dict[str, Any]:
    plan = draw(args.seed, args.steps, args.faults, args.interval)
    root = Path(tempfile.mkdtemp(prefix="disttrain-soak-"))
    try:
        data = write_small_text(root / "small.txt")
        print(f"uninterrupted run: {args.steps} steps ...", flush=True)
        ref_wall = H.command(job(args, data, root, "reference"), env=environment(plan, None), timeout=1200).wall_s
        print(f"soak: {args.steps} steps, {len(plan)} faults (seed {args.seed}) in {root}", flush=True)
        result = soak(args, plan, data, root)
        cmp = compare(losses(root / "reference"), losses(root / "soak"), {p.step for p in plan if p.kind == "nan"})
        ref_ckpts = sorted(int(p.name[5:]) for p in (root / "reference" / "checkpoints").glob("step-*"))
        if [c["step"] for c in result["checkpoints"]] != ref_ckpts:
            result["checkpoints"].append({"step": None, "ok": False, "problems": [f"reference keeps {ref_ckpts}"]})
        summary = report(plan, result, ref_wall, cmp)
    finally:
        if args.keep:
            print(f"run folders kept in {root}")
        else:
            shutil.rmtree(root, ignore_errors=True)
    outcomes = [vars(o) | {"planned": vars(o.planned)} for o in result["outcomes"]]
    goal = H.Goal("faults survived, nothing lost (of the faults dealt)", len(plan)).check(len(plan) * summary["ok"])
    return {"plan": [vars(p) | {"how": p.how} for p in plan], "outcomes": outcomes, "summary": summary, "goals": [goal]}


if __name__ == "__main__":
    results = H.main(__file__, __doc__, OPTIONS, QUICK, run)
    sys.exit(0 if results is not None and results["summary"]["ok"] else 1)
