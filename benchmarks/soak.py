"""The soak: one long ``disttrain run`` job meets random faults of every kind the project claims to survive,
drawn from a seed, and must end exactly where an uninterrupted run ends.

The job: the tiny GPT (2 blocks, width 64, context 32, fp32), 2 ranks, FSDP, a checkpoint every
``--interval`` steps onto a small tmpfs of its own (mounted here; root), heartbeats every 0.5 s, a hang
timeout of 5 s and enough torchrun restarts. The faults (``--faults`` of them, every kind at least once when
there are five or more, any rank, spread over the run, one at a time):

* ``kill``: SIGKILL of a rank's process (rank 0 included), from outside at a random moment, or injected as
  the step starts (``step:<k>:<r>:once``: on whichever attempt first reaches step k);
* ``stop``: SIGSTOP of a rank's process, from outside or injected in the forward (``freeze:<k>:<r>:once``):
  only the launcher's watch (or rank 0's watchdog, for rank 1) can name it;
* ``disk_full``: the checkpoint disk filled right after a commit, so the next save meets ENOSPC; freed once
  the job reports that save failed;
* ``truncate``: the newest committed checkpoint's biggest file cut in half, then a rank SIGKILLed: the
  restart must skip it and resume from the one before;
* ``nan``: the loss of step k on rank r is NaN (``nan:<k>:<r>:every``: a bad batch stays bad when a resume
  replays it; the uninterrupted run gets it too), which the bad-step guard skips and names.

Then: every step's loss as last logged equals the uninterrupted run's bitwise, except the NaN steps the
guard skipped (named ``nonfinite`` in metrics.jsonl, and only those); every kept checkpoint passes
``disttrain ckpt verify`` (sizes, CRC32s, read back) and the same steps are kept as in the uninterrupted run;
no temporary folder or file is left in the checkpoint disk or health/; and, per fault, the seconds from the
fault to training again (the first step logged after it, after the restart for the faults that end an
attempt). NaN and a full disk do not stop training: their figure is the gap to the next logged step.

    .venv/bin/python -m benchmarks.soak [--seed 1] [--steps 300] [--faults 12] [--quick] [--keep]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from benchmarks import _common as C
from benchmarks.soak_driver import RESTARTING, Console, Driver, JsonLines, Outcome, Planned, SoakError
from disttrain.checkpoint.layout import CHECKSUMS, METADATA, TMP_PREFIX
from disttrain.testing.launch import DISTTRAIN, child_env
from disttrain.testing.tiny import tiny_cli_args, write_small_text

KINDS = ("kill", "stop", "disk_full", "truncate", "nan")
RANKS = 2
DISK_MB = 16


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--seed", type=int, default=1, help="draws the faults: kinds, steps, ranks, inside or outside")
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--faults", type=int, default=12)
    p.add_argument("--interval", type=int, default=5, help="checkpoint every N steps")
    p.add_argument("--quick", action="store_true", help="100 steps, 5 faults (one of each kind)")
    p.add_argument("--keep", action="store_true", help="keep the run folders (printed)")
    args = p.parse_args(argv)
    if args.quick:
        args.steps, args.faults = 100, 5
    return args


# -- the draw -------------------------------------------------------------------------------------------
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


# -- the jobs ---------------------------------------------------------------------------------------------
def job_args(data: Path, root: Path, name: str, steps: int, interval: int, n_faults: int, *extra: str) -> list[str]:
    return tiny_cli_args(
        data,
        steps,
        *("--run.root", str(root), "--run.name", name, "--parallel.strategy", "fsdp"),
        *("--checkpoint.interval", str(interval), "--launch.max-restarts", str(2 * n_faults + 2)),
        *("--health.heartbeat-s", "0.5", "--health.hang-timeout-s", "5"),
        *extra,
    )


def environment(plan: list[Planned], state: Path | None) -> dict[str, str]:
    """The job's environment: the injected faults (all of them in the soak, the NaNs in the reference)."""
    specs = [s for p in plan if (s := p.spec()) and (state is not None or p.kind == "nan")]
    extra = {"DISTTRAIN_FAULT": ",".join(specs)} if specs else {}
    if state is not None:
        extra["DISTTRAIN_FAULT_STATE"] = str(state)
    return child_env(extra=extra)


def reference(args: argparse.Namespace, plan: list[Planned], data: Path, root: Path) -> float:
    """The uninterrupted run (with the same NaNs): its wall time."""
    t0 = time.perf_counter()
    proc = subprocess.run(
        [str(DISTTRAIN), *job_args(data, root, "reference", args.steps, args.interval, args.faults)],
        env=environment(plan, None),
        capture_output=True,
        text=True,
        timeout=1200,
    )
    if proc.returncode != 0:
        raise SoakError(
            f"the reference run failed (exit {proc.returncode}):\n{proc.stdout[-3000:]}{proc.stderr[-3000:]}"
        )
    return time.perf_counter() - t0


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
    """The faulted run: start it, deal the faults one by one, wait for its end; outcomes and wall time."""
    state, run = root / "fault-state", root / "soak"
    with tmpfs(root / "ckpt-disk", DISK_MB) as disk:
        ckpt = disk / "checkpoints"
        cmd = [str(DISTTRAIN), *job_args(data, root, "soak", args.steps, args.interval, args.faults)]
        cmd += ["--checkpoint.folder", str(ckpt)]
        t0 = time.perf_counter()
        proc = subprocess.Popen(
            cmd,
            env=environment(plan, state),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,
        )
        driver = Driver(proc, Console(proc, root / "soak.log"), run, ckpt, state, disk)
        try:
            outcomes, error = deal_all(driver, plan)
            rc, error = ending(proc, error)
            wall = time.perf_counter() - t0
        finally:  # also on Ctrl-C or a bug here: nothing of the job outlives the soak, the tmpfs unmounts
            finish(proc, driver)
        leftovers = left_behind(ckpt, run)
        checkpoints = verify(run)
        same_bytes = same_files(ckpt, root / "reference" / "checkpoints")
        if (disk / "filler").exists():
            leftovers.append("filler on the checkpoint disk")
    return {
        "outcomes": outcomes,
        "error": error,
        "rc": rc,
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
        except SoakError as e:
            outcomes.append(Outcome(p, note=str(e)))
            return outcomes, f"fault {i + 1} ({p.kind}): {e}"
        print(f"  trains again {out.seconds:.2f}s after it; {out.note}", flush=True)
        outcomes.append(out)
    return outcomes, None


def ending(proc: subprocess.Popen[str], error: str | None) -> tuple[int | None, str | None]:
    """The job's exit code once it ends (None, with why, when it did not or the soak already failed)."""
    if error is not None:
        return None, error
    try:
        return proc.wait(timeout=600), None
    except subprocess.TimeoutExpired:
        return None, "the job did not end within 600 s of the last fault"


def finish(proc: subprocess.Popen[str], driver: Driver) -> None:
    """End what is left of the job (after a failure) and of the processes the driver stopped."""
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    driver.cleanup()
    driver.console.join()


# -- the checks --------------------------------------------------------------------------------------------
def losses(run: Path) -> dict[int, tuple[float, bool]]:
    """Each step's (loss, nonfinite) as last logged (a step run again after a resume logs again)."""
    records = JsonLines(run / "metrics.jsonl").poll()
    return {int(r["step"]): (r["loss"], bool(r.get("nonfinite"))) for r in records if "loss" in r}


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
    proc = subprocess.run(
        [str(DISTTRAIN), "ckpt", "verify", "--all", "--json", str(run)], env=child_env(), capture_output=True, text=True
    )
    try:
        return [{"step": c["step"], "ok": c["ok"], "problems": c["problems"]} for c in json.loads(proc.stdout)]
    except (ValueError, KeyError):
        return [{"step": None, "ok": False, "problems": [(proc.stdout + proc.stderr)[-500:]]}]


def same_files(ckpt: Path, ref: Path) -> dict[str, list[str]]:
    """Per kept checkpoint, the files whose size and CRC32 (manifest.json) differ from the uninterrupted run's
    checkpoint of the same step (empty lists: the same bytes). DCP's ``.metadata`` is left out: it holds a
    fresh id per save."""
    out = {}
    for manifest in sorted(ckpt.glob("step-*/manifest.json")):
        theirs = ref / manifest.parent.name / "manifest.json"
        mine = json.loads(manifest.read_text())["files"]
        other = json.loads(theirs.read_text())["files"] if theirs.is_file() else {}
        names = (mine.keys() | other.keys()) - {METADATA}
        out[manifest.parent.name] = sorted(n for n in names if mine.get(n) != other.get(n))
    return out


def left_behind(ckpt: Path, run: Path) -> list[str]:
    """Temporary folders and files a save or a heartbeat left: ``.tmp-step-*``, ``.checksums``, ``.<name>.*``."""
    found = [p for p in ckpt.glob(f"{TMP_PREFIX}*")] + list(ckpt.glob(f"*/{CHECKSUMS}"))
    found += [p for p in (run / "health").rglob(".*")]
    return [str(p) for p in found]


# -- the report ----------------------------------------------------------------------------------------
def report(plan: list[Planned], result: dict[str, Any], ref_wall: float, cmp: dict[str, Any]) -> dict[str, Any]:
    outcomes: list[Outcome] = result["outcomes"]
    C.table(
        ["#", "kind", "how", "rank", "from step", "restarts", "resumed", "detected", "seconds", "named", "note"],
        [
            [
                i + 1,
                o.planned.kind,
                o.planned.how,
                o.planned.rank,
                o.planned.step,
                o.restarts,
                o.resumed_from,
                o.detected_s,
                o.seconds,
                o.named,
                o.note,
            ]
            for i, o in enumerate(outcomes)
        ],
        title="faults, and the seconds from each to the next step logged (after the restart, if it ended the attempt)",
    )
    survived = [o for o in outcomes if o.survived]
    stopping = [o.seconds for o in survived if o.planned.kind in RESTARTING and o.seconds is not None]
    ckpts_ok = bool(result["checkpoints"]) and all(c["ok"] for c in result["checkpoints"])
    summary = {
        "faults": len(plan),
        "survived": len(survived),
        "by_kind": dict(Counter(o.planned.kind for o in survived)),
        "restart_faults_median_s": C.median(stopping) if stopping else None,
        "restart_faults_worst_s": max(stopping) if stopping else None,
        "all_median_s": C.median([o.seconds for o in survived if o.seconds is not None]) if survived else None,
        "restarts": sum(o.restarts for o in survived),
        "soak_wall_s": result["wall_s"],
        "reference_wall_s": ref_wall,
        "exit_code": result["rc"],
        "losses": cmp,
        "checkpoints_ok": ckpts_ok,
        "leftovers": result["leftovers"],
        "torn_lines": result["torn_lines"],
        "error": result["error"],
    }
    restarting = [o for o in survived if o.planned.kind in RESTARTING]
    summary["named_right"] = all(o.named for o in restarting)
    summary["fell_back"] = all(o.extra.get("fell_back") for o in survived if o.planned.kind == "truncate")
    summary["resumed_from_newest"] = not any(o.extra.get("lost_checkpoint") for o in survived)
    summary["same_bytes"] = result["same_bytes"]
    summary["ok_bytes"] = not any(result["same_bytes"].values())
    whole = summary["survived"] == len(plan) and result["rc"] == 0
    whole = whole and summary["named_right"] and summary["fell_back"] and summary["ok_bytes"]
    whole = whole and summary["resumed_from_newest"]
    summary["ok"] = whole and cmp["ok"] and ckpts_ok and not result["leftovers"] and not result["torn_lines"]
    print_summary(summary, result)
    return summary


def print_summary(s: dict[str, Any], result: dict[str, Any]) -> None:
    kinds = ", ".join(f"{k} {n}" for k, n in sorted(s["by_kind"].items()))
    print(f"faults survived: {s['survived']}/{s['faults']} ({kinds}); job exit code {s['exit_code']}")
    if s["restart_faults_median_s"] is not None:
        print(
            f"fault -> training again (kill, stop, truncate): median {s['restart_faults_median_s']:.1f}s, "
            f"worst {s['restart_faults_worst_s']:.1f}s; {s['restarts']} restarts"
        )
    cmp = s["losses"]
    print(
        f"losses: {cmp['equal_bitwise']}/{cmp['steps']} steps bitwise equal to the uninterrupted run; NaN steps "
        f"skipped and named: {cmp['skipped_named']}; differ: {cmp['differ']}; missing: {cmp['missing']}"
    )
    steps = [c["step"] for c in result["checkpoints"]]
    print(f"checkpoints kept {steps}: {'all verify' if s['checkpoints_ok'] else result['checkpoints']}")
    differ = {k: v for k, v in s["same_bytes"].items() if v}
    print(f"shard and RNG files equal to the uninterrupted run's of the same step: {differ or 'all'}")
    print(
        f"every restart named the rank hit: {s['named_right']}; resumed from the newest intact checkpoint: "
        f"{s['resumed_from_newest']}; every truncation fell back: {s['fell_back']}"
    )
    print(f"temporary files left: {s['leftovers'] or 'none'}; torn log lines: {s['torn_lines']}")
    print(f"wall time: soak {s['soak_wall_s']:.0f}s, uninterrupted {s['reference_wall_s']:.0f}s")
    if s["error"]:
        print(f"FAILED: {s['error']}")
    print("soak: " + ("PASSED" if s["ok"] else "FAILED"), flush=True)


def main(argv: list[str]) -> int:
    args = parse_args(argv)
    C.print_machine()
    plan = draw(args.seed, args.steps, args.faults, args.interval)
    root = Path(tempfile.mkdtemp(prefix="disttrain-soak-"))
    try:
        data = write_small_text(root / "small.txt")
        print(f"uninterrupted run: {args.steps} steps ...", flush=True)
        ref_wall = reference(args, plan, data, root)
        print(f"soak: {args.steps} steps, {len(plan)} faults (seed {args.seed}) in {root}", flush=True)
        result = soak(args, plan, data, root)
        nans = {p.step for p in plan if p.kind == "nan"}
        cmp = compare(losses(root / "reference"), losses(root / "soak"), nans)
        ref_ckpts = sorted(int(p.name[5:]) for p in (root / "reference" / "checkpoints").glob("step-*"))
        if [c["step"] for c in result["checkpoints"]] != ref_ckpts:
            result["checkpoints"].append({"step": None, "ok": False, "problems": [f"reference keeps {ref_ckpts}"]})
        summary = report(plan, result, ref_wall, cmp)
        C.write_results(
            "soak-quick" if args.quick else "soak",
            {
                "args": vars(args),
                "plan": [vars(p) | {"how": p.how} for p in plan],
                "outcomes": [vars(o) | {"planned": vars(o.planned)} for o in result["outcomes"]],
                "summary": summary,
            },
        )
        return 0 if summary["ok"] else 1
    finally:
        if args.keep:
            print(f"run folders kept in {root}")
        else:
            shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
