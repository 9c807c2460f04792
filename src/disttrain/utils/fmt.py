"""Human-readable sizes for tables and messages."""

from __future__ import annotations

_UNITS = (("TiB", 2**40), ("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10))


def fmt_bytes(n: float, digits: int = 2) -> str:
    """``1536`` -> ``'1.50 KiB'`` (``digits`` decimals); below 1 KiB a whole number of bytes."""
    for unit, size in _UNITS:
        if abs(n) >= size:
            return f"{n / size:.{digits}f} {unit}"
    return f"{int(n)} B"


def fmt_rate(bytes_per_s: float) -> str:
    """``1.26e9`` -> ``'1.26 GB/s'``, ``2.3e6`` -> ``'2.30 MB/s'`` (decimal units, as links are rated)."""
    if bytes_per_s >= 1e8:
        return f"{bytes_per_s / 1e9:.2f} GB/s"
    return f"{bytes_per_s / 1e6:.2f} MB/s"


def fmt_duration(seconds: float) -> str:
    """``75.4`` -> ``'1m15s'``, ``3700`` -> ``'1h01m'``, ``4.2`` -> ``'4s'``: an ETA or an elapsed time."""
    s = max(round(seconds), 0)
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    return f"{s // 3600}h{s % 3600 // 60:02d}m"
