"""``disttrain rl``: actors and a learner on RPC solve a gymnasium environment (arguments only)."""

from __future__ import annotations

from disttrain.config.overrides import parse_dataclass
from disttrain.rl.config import RLConfig


def main(argv: list[str]) -> int:
    from disttrain.jobs.rl import launch_rl

    return launch_rl(parse_dataclass(RLConfig, argv, prog="disttrain rl"))
