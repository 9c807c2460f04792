"""Models the project did not write, imported by path in the tests (`--model.module hf_models:gpt2`).

Tiny Hugging Face GPT-2 and Llama built from configs (no download), returned directly or wrapped in a
small module, and two hand-written models that exercise initialisation after a meta-device build.
Vocabulary 128 covers every character of the test corpora.
"""

from __future__ import annotations

import torch
from torch import nn
from transformers import GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM
from transformers.utils import logging as hf_logging

hf_logging.set_verbosity_error()  # the tiny configs' token ids lie outside the tiny vocabulary: not used here

VOCAB = 128


TOKENS = {"vocab_size": VOCAB, "bos_token_id": 0, "eos_token_id": 0}
"""What every tiny config shares: the vocabulary and its special ids."""


def gpt2_config() -> GPT2Config:
    shape = {"n_positions": 64, "n_embd": 64, "n_layer": 2, "n_head": 4}
    return GPT2Config(**TOKENS, **shape, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)


def llama_config(vocab: int = VOCAB, **tokens: int) -> LlamaConfig:
    """The tiny Llama; ``tokens`` replace the shared special ids (``bos_token_id=1``, ...)."""
    shape = {"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4}
    ids = {**TOKENS, "vocab_size": vocab, **tokens}
    return LlamaConfig(**ids, **shape, num_key_value_heads=2, max_position_embeddings=64, tie_word_embeddings=True)


def gpt2() -> nn.Module:
    """GPT-2 returned as it is: its forward returns a ``CausalLMOutputWithCrossAttentions``."""
    torch.manual_seed(5)
    return GPT2LMHeadModel(gpt2_config())


def llama() -> nn.Module:
    torch.manual_seed(5)
    return LlamaForCausalLM(llama_config())


def llama_sized(vocab_size: int) -> nn.Module:
    """The tiny Llama with the data's vocabulary; bos and eos 0: the end of text of a ``bpe:VOCAB`` tokenizer."""
    torch.manual_seed(5)
    return LlamaForCausalLM(llama_config(vocab_size))


def llama_default_ids(vocab_size: int) -> nn.Module:
    """The tiny Llama with LlamaConfig's own special ids (bos 1, eos 2): not a ``data prepare`` tokenizer's."""
    torch.manual_seed(5)
    return LlamaForCausalLM(llama_config(vocab_size, bos_token_id=1, eos_token_id=2))


class LogitsOnly(nn.Module):
    """The wrapper a user writes first: forward returns ``.logits``, no ``init_weights()`` of its own."""

    def __init__(self, inner: nn.Module) -> None:
        super().__init__()
        self.inner = inner

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.inner(input_ids=x).logits


def gpt2_wrapped() -> nn.Module:
    return LogitsOnly(gpt2())


def llama_wrapped() -> nn.Module:
    return LogitsOnly(llama())


class Scaled(nn.Module):
    """A block with a raw parameter and no ``reset_parameters()``: nothing initialises it after ``to_empty``."""

    def __init__(self, width: int) -> None:
        super().__init__()
        self.gain = nn.Parameter(torch.ones(width))

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        return h * self.gain


class Partial(nn.Module):
    """Embedding and head (they reset themselves) around a ``Scaled`` (it does not)."""

    def __init__(self) -> None:
        super().__init__()
        self.emb = nn.Embedding(VOCAB, 32)
        self.blocks = nn.ModuleList([Scaled(32), Scaled(32)])
        self.head = nn.Linear(32, VOCAB)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.emb(x)
        for b in self.blocks:
            h = b(h)
        return self.head(h)


def partial() -> nn.Module:
    torch.manual_seed(5)
    return Partial()


class WithTable(nn.Module):
    """A non-persistent buffer computed in ``__init__`` (a sinusoid table, as rotary models have)."""

    def __init__(self) -> None:
        super().__init__()
        self.emb = nn.Embedding(VOCAB, 32)
        pos = torch.arange(64).float()[:, None] / (10_000 ** (torch.arange(32).float() / 32))
        self.register_buffer("table", torch.sin(pos), persistent=False)
        self.blocks = nn.ModuleList([nn.Linear(32, 32), nn.Linear(32, 32)])
        self.head = nn.Linear(32, VOCAB)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.emb(x) + self.table[: x.shape[-1]]
        for b in self.blocks:
            h = torch.relu(b(h))
        return self.head(h)


def with_table() -> nn.Module:
    torch.manual_seed(5)
    return WithTable()
