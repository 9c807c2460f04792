"""A user's own model and dataset, imported by path in the tests (`--model.module usermodel:build`)."""

from __future__ import annotations

import torch
from torch import nn

from disttrain.models.gpt import GPT, GPTConfig


def build() -> nn.Module:
    """Any nn.Module factory; this one is a tiny GPT that covers every ASCII code point."""
    return GPT(GPTConfig(vocab_size=128, n_layers=2, d_model=32, n_heads=2, context=32), seed=11)


class Pairs(torch.utils.data.Dataset):
    """(input, target) pairs of ASCII codes: the next character of a repeating alphabet."""

    vocab_size = 128

    def __len__(self) -> int:
        return 2000

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        seq = (torch.arange(i, i + 33) % 26) + 65
        return seq[:-1], seq[1:]


def dataset() -> tuple[Pairs, Pairs]:
    return Pairs(), Pairs()


def not_on_meta() -> nn.Module:
    """A factory that reads tensor data while building: it cannot run on the meta device."""
    model = build()
    scale = float(next(model.parameters()).detach().abs().max())  # .item() on a meta tensor fails
    assert scale >= 0
    return model
