"""Distributed reinforcement learning on torch.distributed.rpc: actors, a learner, experience replay."""
