"""Losses the Trainer can use: the default token cross-entropy over a model's logits."""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F

LossFn = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
"""``loss_fn(model_output, targets) -> scalar loss``."""


def cross_entropy(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Mean token cross-entropy for (batch, time, vocab) logits, in fp32."""
    return F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), targets.reshape(-1))
