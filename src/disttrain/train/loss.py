"""How a batch becomes a loss: the default token cross-entropy over a model's logits, or the model's own.

:class:`Objective` is what the Trainer (and evaluation) use: the keyword arguments the model is called with
(``labels=`` when the model computes its loss) and the loss function applied to its output.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from disttrain.config import ModelConfig
from disttrain.models.outputs import is_hf_causal_lm, logits_of, loss_of

LossFn = Callable[[Any, torch.Tensor], torch.Tensor]
"""``loss_fn(model_output, targets) -> scalar loss``."""


def cross_entropy(out: Any, targets: torch.Tensor) -> torch.Tensor:
    """Mean token cross-entropy for (batch, time, vocab) logits (a tensor, or any output holding them), in fp32."""
    logits = logits_of(out)
    return F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), targets.reshape(-1))


def model_loss(out: Any, targets: torch.Tensor) -> torch.Tensor:
    """The loss the model computed itself from the ``labels`` it was given."""
    return loss_of(out)


@dataclass(frozen=True)
class Objective:
    """What the model is called with besides the input, and how its output becomes the loss."""

    loss_fn: LossFn = cross_entropy
    labels: str = "none"
    """none (the model gets only the input), targets (``labels=`` the dataset's targets), or inputs
    (``labels=`` the input ids: for models that shift labels themselves, as Hugging Face causal LMs do)."""

    def call_kwargs(self, x: Any, y: Any) -> dict[str, Any]:
        if self.labels == "targets":
            return {"labels": y}
        if self.labels == "inputs":
            return {"labels": x}
        return {}

    @classmethod
    def from_config(cls, cfg: ModelConfig, model: nn.Module, loss_fn: LossFn = cross_entropy) -> Objective:
        """``model.loss = "model"``: the model's own loss, with labels per ``model.labels`` (auto: the input
        ids for a Hugging Face causal LM, which shifts them, else the targets); otherwise ``loss_fn``."""
        if cfg.loss != "model":
            return cls(loss_fn)
        labels = cfg.labels
        if labels == "auto":
            labels = "inputs" if is_hf_causal_lm(model) else "targets"
        return cls(model_loss, labels)
