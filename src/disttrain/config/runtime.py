"""What a job keeps and watches: the checkpoint, run-folder and health sections."""

from __future__ import annotations

import dataclasses
from typing import Literal

from disttrain.config.values import check


@dataclasses.dataclass
class CheckpointConfig:
    """Sharded distributed checkpoints (DCP): when, how, what is kept, where to resume from."""

    folder: str = "checkpoints"
    """Checkpoint folder (relative paths are inside the run folder)."""
    interval: int = 100
    """Save every N steps (0 = only the final save)."""
    keep_latest: int = 2
    """Complete checkpoints kept (older ones are purged in the background); at least 2."""
    async_mode: Literal["off", "thread", "process"] = "thread"
    """off: the loop waits for the write; thread/process: it waits only for the copy to CPU memory."""
    save_final: Literal["full", "model_only", "none"] = "full"
    """At the end: a full checkpoint, the model weights alone (export_dtype), or nothing."""
    export_dtype: Literal["fp32", "bf16", "fp16"] = "fp32"
    """dtype of the model_only final save."""
    direct_io: bool = True
    """Write shard files with O_DIRECT where the file system takes it (Linux; else buffered): no page cache
    filled and then flushed; saves went from 0.33 to 0.82-0.93 of a plain write here (bench_checkpoint.py)."""
    background_nice: int = 10
    """Niceness of the background save threads (copy, write, commit, purge; Linux, per thread): they run
    when training does not need the core (0 = the same priority as training)."""
    resume: str = "auto"
    """auto (newest complete checkpoint), never, a step number, or a checkpoint path."""
    create_seed: bool = False
    """Only initialise the model on one process and save it as step 0 (a seed checkpoint that a run of any
    world size can start from with --checkpoint.resume PATH), then exit."""

    def __post_init__(self) -> None:
        check(self.interval >= 0, f"checkpoint.interval must be >= 0, got {self.interval}")
        check(
            self.keep_latest >= 2,
            f"checkpoint.keep_latest must be >= 2 (so a crash during a save leaves one), got {self.keep_latest}",
        )
        check(
            self.resume in ("auto", "never") or self.resume.isdigit() or "/" in self.resume,
            f"checkpoint.resume must be auto, never, a step number or a path, got {self.resume!r}",
        )
        check(
            0 <= self.background_nice <= 19,
            f"checkpoint.background_nice must be a niceness from 0 to 19, got {self.background_nice}",
        )


@dataclasses.dataclass
class RunConfig:
    """Where the run folder goes."""

    name: str | None = None
    """Run folder name (default: the date and time, then the strategy, or ps or rl); an existing run folder's
    name resumes that run from its newest checkpoint."""
    root: str = "runs"
    """Parent folder of run folders."""


@dataclasses.dataclass
class HealthConfig:
    """Heartbeats, hang watchdog, stragglers, bad-step guards and debug presets (see disttrain.health)."""

    enabled: bool = True
    """Heartbeats, the hang watchdog and straggler detection (the bad-step guards below work either way)."""
    heartbeat_s: float = 2.0
    """Seconds between heartbeats: each rank's step and phase, sent to the rendezvous store by a thread."""
    hang_timeout_s: float | None = None
    """A rank making no progress this long is hung (default: max(hang_floor_s, hang_factor x median step))."""
    hang_factor: float = 5.0
    """Automatic hang timeout, in median step times."""
    hang_floor_s: float = 60.0
    """The automatic hang timeout is never shorter than this."""
    startup_timeout_s: float = 600.0
    """Collective timeout and hang limit until the first step is done, and during eval and checkpoints
    (afterwards collectives use parallel.timeout_s)."""
    straggler_interval: int = 50
    """Compare every rank's step (compute) and data-loading times every N steps (0 = off)."""
    straggler_factor: float = 1.5
    """A rank slower than the median of the others by this factor is named a straggler."""
    spike_rtol: float = 1.0
    """Skip a step whose loss exceeds the median of the last spike_window good losses by this relative
    margin (1.0: twice the median; 0 = off). NaN/Inf loss or grad norm: see train.skip_nonfinite."""
    spike_window: int = 50
    """Good steps in the rolling window of the spike guard."""
    max_bad_steps: int = 5
    """After this many bad (skipped) steps in a row, do what on_bad_steps says."""
    on_bad_steps: Literal["rollback", "stop", "continue"] = "rollback"
    """rollback: reload the last checkpoint (skipping the data since) and go on; stop: exit with a message."""
    rollback_lr_factor: float = 1.0
    """Multiply the learning rate by this at each rollback (e.g. 0.5)."""
    max_rollbacks: int = 3
    """Stop after this many rollbacks in one attempt."""
    debug: str = "off"
    """Debug presets, comma-separated: comms (TORCH_DISTRIBUTED_DEBUG=DETAIL, gloo/NCCL logs, NCCL flight
    recorder), anomaly (autograd anomaly detection); or off."""

    def __post_init__(self) -> None:
        check(self.heartbeat_s > 0, f"health.heartbeat_s must be > 0, got {self.heartbeat_s}")
        check(
            self.hang_timeout_s is None or self.hang_timeout_s > 2 * self.heartbeat_s,
            f"health.hang_timeout_s ({self.hang_timeout_s}) must be > 2 x health.heartbeat_s ({self.heartbeat_s}); "
            "raise it or lower --health.heartbeat-s",
        )
        for key in ("hang_factor", "hang_floor_s", "startup_timeout_s", "straggler_factor", "rollback_lr_factor"):
            check(getattr(self, key) > 0, f"health.{key} must be > 0, got {getattr(self, key)}")
        check(self.straggler_factor > 1, f"health.straggler_factor must be > 1, got {self.straggler_factor}")
        check(self.straggler_interval >= 0, f"health.straggler_interval must be >= 0, got {self.straggler_interval}")
        check(self.spike_rtol >= 0, f"health.spike_rtol must be >= 0 (0 = off), got {self.spike_rtol}")
        check(self.spike_window >= 2, f"health.spike_window must be >= 2, got {self.spike_window}")
        check(self.max_bad_steps >= 1, f"health.max_bad_steps must be >= 1, got {self.max_bad_steps}")
        check(self.max_rollbacks >= 0, f"health.max_rollbacks must be >= 0, got {self.max_rollbacks}")
        bad = sorted(self.debug_presets - {"comms", "anomaly"})
        check(not bad, f"health.debug: unknown preset(s) {bad}; use comms, anomaly, 'comms,anomaly' or off")

    @property
    def debug_presets(self) -> set[str]:
        return {p.strip() for p in self.debug.split(",") if p.strip() and p.strip() != "off"}
