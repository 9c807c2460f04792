"""What each command's run folder gets: its x axis, its panels (in order, each with a title, the keys it draws
and its y axis label and unit), the summary table's columns, and the keys never drawn. ``disttrain run``,
``ps`` and ``rl`` each have a row; keys no row names are still drawn, generically, after the named panels."""

from __future__ import annotations

from dataclasses import dataclass, field

from disttrain.report.units import Unit, readable, unit_of


@dataclass(frozen=True)
class Panel:
    """One figure: ``keys`` drawn as lines (the first solid, the others dashed, one colour per run); a key
    holding a list of numbers (one per rank) is a line per rank."""

    name: str
    """The PNG's name and the page's ``data-plot``."""
    title: str
    keys: tuple[str, ...]
    ylabel: str
    """The quantity on the y axis; the unit the axis is drawn in (MiB, ms, %) is added after it."""
    unit: Unit = ""
    dots: str = ""
    """A key drawn as dots in the run's colour (evaluations); the title says so only when there are some."""
    from_zero: bool = False
    """The y axis starts at 0 (memory, throughput): a 0.2% change stays a 0.2% change."""
    by_tokens: bool = False
    """x = tokens seen (step x tokens per step): language-model runs only."""


@dataclass(frozen=True)
class Column:
    """One column of the summary table: the run's last value of ``key`` (or summary.json's when ``summary``)."""

    key: str
    unit: Unit = ""
    summary: bool = False
    """summary.json's whole-run figure wins over the last record's (ps: samples/s over the run)."""

    @property
    def label(self) -> str:
        return readable(self.key)


@dataclass(frozen=True)
class Command:
    """The report's view of one command's run folders."""

    name: str
    x: str
    """The key the panels' x axis is (records without it are not drawn)."""
    xlabel: str
    panels: tuple[Panel, ...]
    columns: tuple[Column, ...]
    hidden: frozenset[str] = field(default_factory=frozenset)
    """Keys never drawn: the x key, clocks, counters that only grow, lists that are not per rank."""


def _loss(name: str, ylabel: str, dots: str) -> Panel:
    return Panel(name, "loss", ("loss",), ylabel, dots=dots)


RUN = Command(
    "run",
    "step",
    "step",
    (
        _loss("loss", "cross-entropy (nats/token)", "val_loss"),
        Panel("loss_vs_tokens", "loss vs tokens seen", ("loss",), "cross-entropy (nats/token)", by_tokens=True),
        Panel("lr", "learning rate", ("lr",), "learning rate", "lr"),
        Panel("grad_norm", "gradient norm (global, before clipping)", ("grad_norm",), "L2 norm"),
        Panel(
            "tokens_per_s", "throughput: tokens/s (all ranks)", ("tokens_per_s",), "tokens/s", "per_s", from_zero=True
        ),
        Panel("mfu", "MFU: model FLOP/s as a share of peak", ("mfu",), "MFU", "percent", from_zero=True),
        Panel("step_time_s", "step time", ("step_time_s",), "time per step", "s", from_zero=True),
        Panel("peak_memory_bytes", "peak memory per rank", ("peak_memory_bytes",), "memory", "bytes", from_zero=True),
        Panel("rank_compute_s", "compute per step, per rank: stragglers stand out", ("rank_compute_s",), "time", "s"),
        Panel("rank_data_s", "data wait per step, per rank", ("rank_data_s",), "time", "s"),
        Panel("skipped_steps", "skipped steps (non-finite or spiking loss)", ("skipped_steps",), "steps", "count"),
    ),
    (
        Column("last_step", "count"),
        Column("loss"),
        Column("val_loss"),
        Column("grad_norm"),
        Column("tokens_per_s", "per_s"),
        Column("mfu", "percent"),
        Column("step_time_s", "s"),
        Column("peak_memory_bytes", "bytes"),
        Column("wall_s", "s", summary=True),
        Column("restarts", "count"),
    ),
    frozenset({"step", "time", "val_loss", "last_step_time_s", "tokens_per_s_per_rank", "nonfinite", "stragglers"}),
)

PS = Command(
    "ps",
    "step",
    "step",
    (
        _loss("loss", "log loss (nats/sample)", "logloss"),
        Panel("auc", "AUC on held-out clicks (dashed: the ceiling)", ("auc", "ceiling_auc"), "AUC"),
        Panel(
            "samples_per_s",
            "throughput: samples/s (all trainers)",
            ("samples_per_s",),
            "samples/s",
            "per_s",
            from_zero=True,
        ),
        Panel("staleness", "staleness: steps ahead of the slowest trainer", ("staleness",), "steps", "count"),
        Panel(
            "bytes_per_step", "bytes moved per step (trainer 0)", ("bytes_per_step",), "data", "bytes", from_zero=True
        ),
    ),
    (
        Column("last_step", "count"),
        Column("loss"),
        Column("auc"),
        Column("ceiling_auc"),
        Column("logloss"),
        Column("samples_per_s", "per_s", summary=True),
        Column("bytes_per_step", "bytes", summary=True),
        Column("max_staleness", "count"),
        Column("restarts", "count"),
    ),
    frozenset({"step", "time", "logloss", "ceiling_auc"}),
)

RL = Command(
    "rl",
    "env_steps",
    "environment steps",
    (
        Panel("return", "episode return (dashed: all actors)", ("return", "return_all"), "return"),
        Panel("episode_length", "episode length", ("episode_length",), "steps"),
        Panel("loss", "learner loss", ("loss",), "loss"),
        Panel(
            "env_steps_per_s", "env steps/s (all actors)", ("env_steps_per_s",), "env steps/s", "per_s", from_zero=True
        ),
        Panel("updates_per_s", "learner updates/s", ("updates_per_s",), "updates/s", "per_s", from_zero=True),
        Panel("replay_size", "replay buffer size", ("replay_size",), "transitions", "count", from_zero=True),
        Panel("actor_lag", "actor lag: updates behind the learner", ("actor_lag",), "updates"),
    ),
    (
        Column("env_steps", "count"),
        Column("episodes", "count"),
        Column("updates", "count"),
        Column("return"),
        Column("return_all"),
        Column("env_steps_per_s", "per_s"),
        Column("updates_per_s", "per_s"),
        Column("wall_s", "s"),
    ),
    frozenset({"env_steps", "time_s", "wall_s", "episodes", "updates"}),
)

COMMANDS = {c.name: c for c in (RUN, PS, RL)}


def generic_panel(key: str) -> Panel:
    """A key no command names: its readable name as title and y label, its unit from its suffix."""
    name = readable(key)
    return Panel(key, name, (key,), name, unit_of(key))
