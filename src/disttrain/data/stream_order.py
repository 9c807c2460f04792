"""The order raw-file windows are trained in: deterministic, and the same at any world size.

Epoch e visits the units in a seeded permutation, grouped into *blocks* of consecutive units of about
:data:`BLOCK_BYTES` on disk (at least one unit). Within a block, its windows (every unit's, as ``data prepare``
would cut them) come in a seeded permutation. So global sample position p names one window through the unit
token counts alone, whatever the number of ranks; a rank holds only the tokens of the block it is in and the
next one, which its tokenizer workers prepare ahead. A global permutation over the whole corpus (what a prepared
folder gets) would need every unit tokenized for every batch.
"""

from __future__ import annotations

import torch

BLOCK_BYTES = 16 << 20
"""Windows are shuffled across the units of a block of about this much input."""
_MIX = 1_000_003


def _generator(*keys: int) -> torch.Generator:
    seed = 0
    for k in keys:
        seed = (seed * _MIX + k + 1) % (1 << 63)
    return torch.Generator().manual_seed(seed)


def epoch_blocks(sizes: list[int], seed: int, epoch: int, block_bytes: int = BLOCK_BYTES) -> list[list[int]]:
    """Epoch ``epoch``'s units (a seeded permutation) cut into blocks of about ``block_bytes``."""
    order = torch.randperm(len(sizes), generator=_generator(seed, epoch)).tolist()
    blocks: list[list[int]] = [[]]
    size = 0
    for u in order:
        if blocks[-1] and size + sizes[u] > block_bytes:
            blocks.append([])
            size = 0
        blocks[-1].append(u)
        size += sizes[u]
    return blocks


def block_permutation(n_windows: int, seed: int, epoch: int, block: int) -> torch.Tensor:
    """The order of a block's ``n_windows`` windows (numbered unit by unit, in the block's unit order)."""
    return torch.randperm(n_windows, generator=_generator(seed, epoch, block))


def windows_of(tokens: int, context: int) -> int:
    """Windows of ``context + 1`` tokens, every ``context`` tokens, in a unit of ``tokens`` (as a shard has)."""
    return (tokens - 1) // context if tokens > context else 0
