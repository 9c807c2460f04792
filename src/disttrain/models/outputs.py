"""What a model returns, read the one way the whole project reads it.

A model may return a tensor of logits, an object or dict with ``logits`` (Hugging Face ``ModelOutput``),
or a tuple whose first item is the logits; a model that computes its own loss (``model(x, labels=...)``)
returns it as ``loss``. Loss, FLOP counting, evaluation and the memory plan all go through here.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch


def _field(out: Any, name: str) -> Any:
    if isinstance(out, Mapping):  # a dict, or a ModelOutput (an OrderedDict subclass)
        return out.get(name)
    return getattr(out, name, None)


def logits_of(out: Any) -> torch.Tensor:
    """The logits in a model's output: the tensor itself, ``out.logits`` / ``out["logits"]``, or ``out[0]``."""
    if isinstance(out, torch.Tensor):
        return out
    logits = _field(out, "logits")
    if isinstance(logits, torch.Tensor):
        return logits
    if isinstance(out, (tuple, list)) and out and isinstance(out[0], torch.Tensor):
        return out[0]
    raise TypeError(
        f"the model returned {type(out).__name__}, which holds no logits: return a tensor, an object or dict "
        "with 'logits', or a tuple whose first item is the logits"
    )


def loss_of(out: Any) -> torch.Tensor:
    """The loss a model computed itself (``model.loss = "model"``): ``out.loss`` / ``out["loss"]``."""
    loss = _field(out, "loss")
    if isinstance(loss, torch.Tensor):
        return loss
    raise TypeError(
        f"model.loss is 'model' but the model returned {type(out).__name__} without a 'loss' tensor: it must "
        "compute its loss when called with labels=, or use model.loss = 'cross_entropy'"
    )


def is_hf_causal_lm(model: torch.nn.Module) -> bool:
    """A Hugging Face causal LM (``...ForCausalLM``, ``...LMHeadModel``): it shifts ``labels`` itself."""
    name = type(model).__name__
    return hasattr(model, "config") and (name.endswith("ForCausalLM") or name.endswith("LMHeadModel"))
