"""``disttrain ps``: a click-through-rate model trained against parameter servers (arguments only)."""

from __future__ import annotations

from disttrain.config.overrides import parse_dataclass
from disttrain.ps.config import PSConfig


def main(argv: list[str]) -> int:
    from disttrain.jobs.ps import launch_ps

    cfg = parse_dataclass(PSConfig, argv, prog="disttrain ps")
    return launch_ps(cfg)
