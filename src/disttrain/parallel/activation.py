"""Activation checkpointing per block: keep only a block's input in forward, recompute it in backward.

Uses torch's composable ``checkpoint(module)`` (non-reentrant), which works under FSDP2 and DDP and,
unlike ``checkpoint_wrapper``, does not rename parameters: checkpoints and per-name initialisation are
the same with and without it. Applied before FSDP/DDP wrap the model, as torchtitan does.
"""

from __future__ import annotations

from torch import nn
from torch.distributed._composable import checkpoint


def checkpointed_indices(spec: str, n_blocks: int) -> list[int]:
    """Which blocks recompute: none, full (all), or every K-th (0, K, 2K, ...); the memory plan counts the same."""
    if spec == "none":
        return []
    k = 1 if spec == "full" else int(spec)
    return list(range(0, n_blocks, k))


def apply_activation_checkpointing(blocks: list[nn.Module], spec: str) -> int:
    """Checkpoint the chosen blocks in place; returns how many."""
    chosen = checkpointed_indices(spec, len(blocks))
    for i in chosen:
        checkpoint(blocks[i])
    return len(chosen)
