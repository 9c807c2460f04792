"""Text sampled from a trained model at the end of a run (``--train.generate-chars``): the built-in GPT's own
sampler, or a Hugging Face model's ``generate``, from one start token; decoding is the caller's (the bundled
character tokenizer, or the run's tokenizer).
"""

from __future__ import annotations

import torch
from torch import nn

from disttrain.build import hf_models
from disttrain.models.gpt import GPT

TEMPERATURE = 0.8


def can_sample(model: nn.Module) -> bool:
    """Whether :func:`sample_ids` can sample from ``model``: the built-in GPT or one holding a Hugging Face model
    that generates."""
    return isinstance(model, GPT) or any(callable(getattr(m, "generate", None)) for m in hf_models(model))


@torch.no_grad()
def sample_ids(model: nn.Module, prompt: torch.Tensor, n: int, context: int, seed: int) -> list[int]:
    """``n`` sampled token ids after ``prompt`` (1 x t) at temperature 0.8, the same for the same ``seed``; a
    Hugging Face model stops at ``context`` tokens in all (the length it was trained on) or at its end of text."""
    if isinstance(model, GPT):
        return [int(i) for i in model.generate(prompt, n, temperature=TEMPERATURE, seed=seed)[0, prompt.shape[1] :]]
    hf = next(m for m in hf_models(model) if callable(getattr(m, "generate", None)))
    n = min(n, context - prompt.shape[1])
    if n <= 0:
        return []
    torch.manual_seed(seed)  # Hugging Face samples with the global generator
    eos = getattr(hf.config, "eos_token_id", None)
    out = hf.generate(  # type: ignore[operator]
        prompt,
        attention_mask=torch.ones_like(prompt),
        max_new_tokens=n,
        do_sample=True,
        temperature=TEMPERATURE,
        pad_token_id=eos[0] if isinstance(eos, list) else eos,
    )
    return [int(i) for i in out[0, prompt.shape[1] :]]
