"""Reading a run folder for the report: ``metrics.jsonl`` (a line cut short by a crash is left out with a
warning), ``health/events.jsonl``, ``config.toml``, ``strategy.json``, ``summary.json`` and the checkpoints'
manifests. Any command's run folder works: :attr:`Run.command` says which command made it (``run``, ``ps``,
``rl``: its config.toml's sections, else the keys its records hold), and so what its x axis is."""

from __future__ import annotations

import json
import math
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from disttrain.errors import ConfigError
from disttrain.report.panels import COMMANDS


@dataclass
class Run:
    """One run folder's records, as read."""

    path: Path
    metrics: list[dict[str, Any]]
    events: list[dict[str, Any]] = field(default_factory=list)
    config: str = ""
    strategy: dict[str, Any] = field(default_factory=dict)
    resolved: dict[str, Any] = field(default_factory=dict)
    """The job as it ran (``resolved.json``: strategy, degrees, batch arithmetic, precision)."""
    summary: dict[str, Any] = field(default_factory=dict)
    saves: list[dict[str, Any]] = field(default_factory=list)
    """Checkpoint saves: step, blocked_s (the training thread's wait) and save_s (until committed)."""
    warnings: list[str] = field(default_factory=list)

    @property
    def name(self) -> str:
        return self.path.name

    @property
    def command(self) -> str:
        """``rl``, ``ps`` or ``run``: config.toml's ``[rl]`` or ``[ps]`` section, any other config (or
        resolved.json) is a training run; with neither, the keys the records hold."""
        sections = self._config()
        for name in ("rl", "ps"):
            if name in sections:
                return name
        if sections or self.resolved:
            return "run"
        keys = {k for r in self.metrics for k in r}
        if "env_steps" in keys and "step" not in keys:
            return "rl"
        return "ps" if keys & {"auc", "staleness", "samples_per_s"} else "run"

    @property
    def x_key(self) -> str:
        """The key the curves are drawn against: ``step``, or ``env_steps`` for an rl run."""
        return COMMANDS[self.command].x

    def steps_of(self, key: str) -> tuple[list[float], list[Any]]:
        """(x, values) of the records that have ``key``, x being :attr:`x_key` (``step`` but for rl runs); the
        last record wins for an x seen twice (a step run again after a restart)."""
        x = self.x_key
        by_step: dict[float, Any] = {}
        for r in self.metrics:
            if key in r and x in r:
                by_step[r[x]] = r[key]
        steps = sorted(by_step)
        return steps, [by_step[s] for s in steps]

    def _config(self) -> dict[str, Any]:
        try:
            return tomllib.loads(self.config) if self.config else {}
        except tomllib.TOMLDecodeError:
            return {}

    def scalar_keys(self) -> list[str]:
        """Keys with a number in some record (not step/time), in order of first appearance."""
        keys: dict[str, None] = {}
        for r in self.metrics:
            for k, v in r.items():
                if k not in ("step", "time", self.x_key) and _is_number(v):
                    keys[k] = None
        return list(keys)

    def per_rank_keys(self) -> list[str]:
        """Keys holding one number per rank (a list of numbers)."""
        keys: dict[str, None] = {}
        for r in self.metrics:
            for k, v in r.items():
                if isinstance(v, list) and v and all(_is_number(x) for x in v):
                    keys[k] = None
        return list(keys)

    def tokens_per_step(self) -> int | None:
        """Global batch x context for a language-model run (from the job the run resolved, ``resolved.json``;
        config.toml for a run folder from before it), else None."""
        try:
            if self.resolved:
                return int(self.resolved["batch"]["global_batch"]) * int(self.resolved["config"]["model"]["context"])
            cfg = self._config()
            return int(cfg["train"]["global_batch"]) * int(cfg["model"]["context"])
        except (KeyError, TypeError, ValueError):
            return None


def _is_number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def read_jsonl(path: Path) -> tuple[list[dict[str, Any]], list[str]]:
    """The JSON objects of ``path``, one per line; lines that do not parse are left out and named."""
    if not path.is_file():
        return [], []
    out, warnings = [], []
    lines = path.read_text(errors="replace").splitlines()
    for i, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            rec = json.loads(line)
        except json.JSONDecodeError:
            cut = " (cut short: the job stopped while writing it?)" if i == len(lines) else ""
            warnings.append(f"{path.name}: line {i} is not valid JSON{cut}; left out")
            continue
        if isinstance(rec, dict):
            out.append(rec)
    return out, warnings


def load_run(path: str | Path) -> Run:
    """Read the run folder at ``path``; a clear error if it is not one."""
    path = Path(path)
    if not path.is_dir():
        raise ConfigError(f"report: {path} is not a folder; give run folders, e.g. runs/my-run")
    metrics, warnings = read_jsonl(path / "metrics.jsonl")
    if not metrics and not (path / "config.toml").is_file():
        raise ConfigError(f"report: {path} has no metrics.jsonl or config.toml: not a run folder (runs/<name>)")
    events, more = read_jsonl(path / "health" / "events.jsonl")
    run = Run(path=path, metrics=metrics, events=events, warnings=warnings + more)
    if (path / "config.toml").is_file():
        run.config = (path / "config.toml").read_text()
    for name in ("strategy", "summary", "resolved"):
        f = path / f"{name}.json"
        if f.is_file():
            try:
                setattr(run, name, json.loads(f.read_text()))
            except json.JSONDecodeError:
                run.warnings.append(f"{f.name} is not valid JSON; left out")
    run.saves = _saves(path, events)
    if not metrics:
        run.warnings.append("metrics.jsonl has no records yet")
    return run


def _saves(path: Path, events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Each checkpoint event joined with its manifest's commit time (save_s: start to committed)."""
    committed: dict[int, float] = {}
    for manifest in path.glob("checkpoints/step-*/manifest.json"):
        try:
            m = json.loads(manifest.read_text())
            committed[int(m["step"])] = float(m["time"])
        except (ValueError, KeyError, json.JSONDecodeError):
            continue
    out = []
    for e in events:
        if e.get("event") == "checkpoint" and "step" in e:
            done, blocked = committed.get(int(e["step"])), e.get("blocked_s") or 0.0
            save_s = done - (e["time"] - blocked) if done is not None and "time" in e else None  # from its start
            out.append(
                {"step": e["step"], "blocked_s": e.get("blocked_s"), "save_s": save_s, "final": bool(e.get("final"))}
            )
    return out
