"""``disttrain rl``: actors and a learner on RPC solve a gymnasium environment (arguments only)."""

from __future__ import annotations

from disttrain.cli.run import K8S
from disttrain.config import parse_job
from disttrain.rl.config import RLJobConfig

SUMMARY = """Actors play a gymnasium environment and send experience to one learner over torch.distributed.rpc: DQN
(Ape-X style, replay, n-step returns) or REINFORCE, inference on the actors or batched on the learner."""

FLAGS = (K8S,)


def main(argv: list[str]) -> int:
    line = parse_job(RLJobConfig, argv, "disttrain rl", SUMMARY, FLAGS)
    if line is None:
        return 0
    if line.flags["k8s"] is not None:
        from disttrain.jobs.k8s_rpc import write_rl_manifest

        return write_rl_manifest(line.cfg, line.flags["k8s"])
    from disttrain.jobs.rl import launch_rl

    return launch_rl(line.cfg)
