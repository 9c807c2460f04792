"""The run folder's health record: ``<run>/health/events.jsonl`` (hangs, stragglers, bad steps, rollbacks,
restarts), each rank's last state and exit reason per attempt, and the restart event built from them."""

from __future__ import annotations

import json
import logging
import os
import threading
import time
from pathlib import Path
from typing import Any

log = logging.getLogger("disttrain")


def attempt() -> int:
    """Which torchrun attempt this is (0 = the first; restarts count up)."""
    return int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))


def health_dir(run_dir: Path) -> Path:
    d = run_dir / "health"
    d.mkdir(parents=True, exist_ok=True)
    return d


def log_event(run_dir: Path | None, kind: str, **fields: Any) -> dict[str, Any]:
    """Append one event to ``<run>/health/events.jsonl`` (and return it)."""
    event = {"event": kind, "attempt": attempt(), "time": time.time(), **fields}
    if run_dir is not None:
        with open(health_dir(run_dir) / "events.jsonl", "a") as f:
            f.write(json.dumps(event) + "\n")
    return event


_state_lock = threading.Lock()  # the heartbeat thread, the watchdog and the main thread all write the file


def _state_path(run_dir: Path, rank: int, k: int | None = None) -> Path:
    return health_dir(run_dir) / f"attempt{attempt() if k is None else k}-rank{rank}.json"


def _read_state(path: Path, k: int | None = None) -> dict[str, Any]:
    try:
        state = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return state if state.get("attempt") == (attempt() if k is None else k) else {}


def write_state(run_dir: Path | None, rank: int, state: dict[str, Any]) -> None:
    """Mirror this rank's heartbeat to ``health/attempt<k>-rank<r>.json``, keeping an exit reason already
    recorded there (a heartbeat written after the exit record must not erase the root cause)."""
    if run_dir is None:
        return
    path = _state_path(run_dir, rank)
    with _state_lock:
        if exit_reason := _read_state(path).get("exit"):
            state = {**state, "exit": exit_reason}
        _write_atomic(path, json.dumps(state))


def _write_atomic(path: Path, text: str) -> None:
    """A temporary file, then a rename: a reader (the launcher's watch) never sees half a heartbeat."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}")
    tmp.write_text(text)
    os.replace(tmp, path)


def record_exit(run_dir: Path | None, rank: int, reason: str, k: int | None = None) -> None:
    """Note in this rank's state file why it is leaving (read after a restart to say what happened); ``k``: of
    that attempt (the launcher's watch, which has no attempt of its own). The first reason is kept: it is the
    root cause, later ones are its consequences."""
    if run_dir is None:
        return
    path = _state_path(run_dir, rank, k)
    with _state_lock:
        state = _read_state(path, k) or {"attempt": attempt() if k is None else k, "rank": rank}
        if not state.get("exit"):
            _write_atomic(path, json.dumps({**state, "exit": reason}))


def last_states(run_dir: Path, prev_attempt: int) -> dict[int, dict[str, Any]]:
    """Every rank's last heartbeat of ``prev_attempt`` (as mirrored to ``health/attempt<k>-rank<r>.json``)."""
    out: dict[int, dict[str, Any]] = {}
    for p in sorted((run_dir / "health").glob(f"attempt{prev_attempt}-rank*.json")):
        try:
            state = json.loads(p.read_text())
        except (OSError, ValueError):
            continue
        if state.get("attempt") == prev_attempt:
            out[int(state["rank"])] = state
    return out


def write_elastic_error(msg: str) -> None:
    """torchrun's per-rank error file (what it reports as the failure's root cause)."""
    path = os.environ.get("TORCHELASTIC_ERROR_FILE")
    if not path:
        return
    data = {"message": {"message": msg, "extraInfo": {"py_callstack": msg, "timestamp": str(int(time.time()))}}}
    try:
        Path(path).write_text(json.dumps(data))
    except OSError:
        pass


def restart_event(run_dir: Path | None, resumed_step: int | None, world_size: int) -> dict[str, Any] | None:
    """On a restarted attempt (rank 0): what happened to the previous one, and where this one resumes.

    A rank that left no exit record stopped without raising: killed by a signal (SIGKILL, the OOM killer)
    or crashed in native code; the ranks that did raise were most often only waiting for it."""
    if run_dir is None or attempt() == 0:
        return None
    prev = attempt() - 1
    states = last_states(run_dir, prev)
    ranks = {
        r: {"step": s.get("step"), "phase": s.get("phase"), "exit": (s.get("exit") or "")[:300] or None}
        for r in range(world_size)
        for s in [states.get(r, {})]
    }
    silent = [r for r, s in ranks.items() if not s["exit"]]
    errors = [f"rank {r}: {s['exit']}" for r, s in ranks.items() if s["exit"]]
    cause = next((s["exit"] for s in ranks.values() if s["exit"] and s["exit"].startswith("hang")), None)
    if cause is None and silent:
        where = ", ".join(f"rank {r} at step {ranks[r]['step']} ({ranks[r]['phase']})" for r in silent)
        cause = f"{where} stopped without an error (killed by a signal such as SIGKILL or the OOM killer, or a crash)"
        if errors:
            cause += f"; then {errors[0][:120]}"
    elif cause is None:
        cause = errors[0] if errors else "unknown"
    return log_event(run_dir, "restart", previous_attempt=prev, cause=cause, ranks=ranks, resumed_from=resumed_step)
