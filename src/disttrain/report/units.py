"""How the report writes numbers and names: a metric key's readable name (``tokens/s``, not ``tokens_per_s``),
its unit, a value as a table cell (``66.1%``, ``31.5k``, ``332 MiB``, ``27.9 ms``) and the scale an axis is
drawn in (bytes as MiB or GiB, seconds as ms when under one). Plain functions, no matplotlib."""

from __future__ import annotations

import math
from typing import Any, Literal

Unit = Literal["", "count", "percent", "s", "bytes", "per_s", "lr"]
"""'' a plain number (4 significant digits); count: a whole number with thousands separators; percent: a
fraction of 1 shown in %; s: seconds; bytes; per_s: a rate (SI prefixes); lr: a small number (scientific)."""

NAMES = {
    "loss": "loss",
    "val_loss": "val loss",
    "grad_norm": "grad norm",
    "lr": "learning rate",
    "tokens_per_s": "tokens/s",
    "tokens_per_s_per_rank": "tokens/s per rank",
    "mfu": "MFU",
    "step_time_s": "step time",
    "last_step_time_s": "last step time",
    "peak_memory_bytes": "peak memory",
    "rank_compute_s": "compute per step",
    "rank_data_s": "data wait per step",
    "skipped_steps": "skipped steps",
    "last_step": "step",
    "wall_s": "wall time",
    "world_size": "ranks",
    "unigram_val_loss": "unigram val loss",
    "auc": "AUC",
    "ceiling_auc": "AUC ceiling",
    "logloss": "eval log loss",
    "samples_per_s": "samples/s",
    "bytes_per_step": "bytes/step",
    "process_cpu_s": "process CPU per step",
    "max_staleness": "max staleness",
    "env_steps": "env steps",
    "env_steps_per_s": "env steps/s",
    "updates_per_s": "updates/s",
    "replay_size": "replay size",
    "actor_lag": "actor lag",
    "episode_length": "episode length",
    "return_all": "return (all actors)",
    "time_s": "time",
}
UNITS: dict[str, Unit] = {
    "mfu": "percent",
    "lr": "lr",
    "last_step": "count",
    "steps": "count",
    "skipped_steps": "count",
    "bad_steps": "count",
    "rollbacks": "count",
    "restarts": "count",
    "world_size": "count",
    "episodes": "count",
    "updates": "count",
    "env_steps": "count",
    "replay_size": "count",
    "max_staleness": "count",
    "tokens_per_s_per_rank": "per_s",
}


def readable(key: str) -> str:
    """The name a person reads for a metric key: the table's header and the panels' titles."""
    if key in NAMES:
        return NAMES[key]
    for suffix, text in (("_per_s", "/s"), ("_bytes", ""), ("_s", "")):
        if key.endswith(suffix) and len(key) > len(suffix):
            return key[: -len(suffix)].replace("_", " ") + text
    return key.replace("_", " ")


def unit_of(key: str) -> Unit:
    """The unit of a metric key: the table above, else its suffix (``_per_s``, ``_bytes``, ``_s``)."""
    if key in UNITS:
        return UNITS[key]
    if key.endswith("_per_s"):
        return "per_s"
    if key.endswith("_bytes") or key.startswith("bytes"):
        return "bytes"
    if key.endswith("_s"):
        return "s"
    return ""


def si(v: float) -> str:
    """A rate or a large count with an SI prefix, 3 significant digits: 31543 -> 31.5k, 1.2e6 -> 1.2M."""
    a = abs(v)
    for factor, prefix in ((1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")):
        if a >= factor * 0.9995:
            return f"{v / factor:.3g}{prefix}"
    return f"{v:.3g}"


def fmt_bytes(v: float) -> str:
    """Bytes in binary units: 348160000 -> 332 MiB, 1.5 * 2**30 -> 1.50 GiB, 512 -> 512 B."""
    for power, name in ((4, "TiB"), (3, "GiB"), (2, "MiB"), (1, "KiB")):
        if abs(v) >= 1024**power:
            x = v / 1024**power
            return f"{x:.3g} {name}" if x < 1000 else f"{x:.0f} {name}"
    return f"{v:.0f} B"


def fmt_seconds(v: float) -> str:
    """Seconds with sensible digits: 0.0279 -> 27.9 ms, 2.62 -> 2.62 s, 125 -> 2 min 05 s, 3720 -> 1 h 02 min."""
    a = abs(v)
    if a == 0:
        return "0 s"
    if a < 1e-3:
        return f"{v * 1e6:.3g} µs"
    if a < 1:
        return f"{v * 1e3:.3g} ms"
    if a < 60:
        return f"{v:.3g} s"
    if a < 3600:
        return f"{int(v // 60)} min {int(v % 60):02d} s"
    return f"{int(v // 3600)} h {int(v % 3600 // 60):02d} min"


def fmt_number(v: float) -> str:
    """4 significant digits; thousands separators for large numbers (3.645, 0.0592, 12,345)."""
    if v != 0 and (abs(v) >= 1e15 or abs(v) < 1e-4):
        return f"{v:.3e}"
    if abs(v) >= 1e4:
        return f"{v:,.0f}"
    return f"{v:.4g}"


def fmt(v: Any, unit: Unit = "") -> str:
    """A value as a table cell: numbers by ``unit``, a list of numbers (one per rank) by its largest, text as is."""
    if isinstance(v, bool) or not isinstance(v, (int, float, list)):
        return str(v)
    if isinstance(v, list):
        nums = [x for x in v if isinstance(x, (int, float)) and not isinstance(x, bool)]
        return f"max {fmt(max(nums), unit)}" if nums else str(v)
    if not math.isfinite(v):
        return str(v)
    if unit == "percent":
        return f"{v * 100:.3g}%"
    if unit == "s":
        return fmt_seconds(v)
    if unit == "bytes":
        return fmt_bytes(v)
    if unit == "per_s":
        return si(v)
    if unit == "lr":
        return f"{v:.3g}"
    if unit == "count" or isinstance(v, int):
        return f"{v:,.0f}" if abs(v) < 1e7 else si(v)
    return fmt_number(v)


def axis_scale(unit: Unit, largest: float) -> tuple[float, str]:
    """(factor, unit text) an axis is drawn in, chosen from the largest value it shows: bytes in KiB/MiB/GiB,
    seconds in ms below one, fractions in %; the text goes into the axis label."""
    if unit == "bytes":
        for power, name in ((4, "TiB"), (3, "GiB"), (2, "MiB"), (1, "KiB")):
            if largest >= 1024**power:
                return 1024.0**-power, name
        return 1.0, "B"
    if unit == "s":
        return (1e3, "ms") if largest < 1 else (1.0, "s")
    if unit == "percent":
        return 100.0, "%"
    return 1.0, ""
