"""``disttrain rl``: actors and a learner on RPC solve a gymnasium environment (arguments only)."""

from __future__ import annotations

from disttrain.config import parse_job
from disttrain.rl.config import RLJobConfig

SUMMARY = """Actors play a gymnasium environment and send experience to one learner over torch.distributed.rpc: DQN
(Ape-X style, replay, n-step returns) or REINFORCE, inference on the actors or batched on the learner."""


def main(argv: list[str]) -> int:
    line = parse_job(RLJobConfig, argv, "disttrain rl", SUMMARY)
    if line is None:
        return 0
    from disttrain.jobs.rl import launch_rl

    return launch_rl(line.cfg)
