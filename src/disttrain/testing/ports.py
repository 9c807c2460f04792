"""Free ports for tests and benchmarks (the one helper lives in :mod:`disttrain.utils.host`, which production
code uses too)."""

from __future__ import annotations

from disttrain.utils.host import free_port

__all__ = ["free_port"]
