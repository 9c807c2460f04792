"""Text corpus, character tokenizer and the next-token window dataset.

The bundled corpus (18 Shakespeare plays, public domain) ships inside the package, so a job never
downloads anything. The held-out split is the *tail* of the text, so no validation window overlaps a
training one.
"""

from __future__ import annotations

import gzip
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

import torch
from torch.utils.data import Dataset

BUNDLED_CORPUS = "shakespeare.txt.gz"


def read_text(path: str | Path | None = None) -> str:
    """Read a UTF-8 text file (``.gz`` allowed); ``None`` means the bundled Shakespeare corpus."""
    if path is None:
        data = resources.files("disttrain.data").joinpath(BUNDLED_CORPUS).read_bytes()
        return gzip.decompress(data).decode("utf-8")
    p = Path(path)
    if not p.is_file():
        raise FileNotFoundError(f"data.path {str(p)!r} does not exist; pass a UTF-8 text file")
    raw = p.read_bytes()
    if p.suffix == ".gz":
        raw = gzip.decompress(raw)
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise ValueError(f"data.path {str(p)!r} is not UTF-8 text ({e.reason} at byte {e.start})") from None


@dataclass(frozen=True)
class CharTokenizer:
    """Maps each distinct character of a corpus to an id (sorted, so it is the same on every rank)."""

    chars: str

    @classmethod
    def from_text(cls, text: str) -> CharTokenizer:
        return cls("".join(sorted(set(text))))

    @property
    def vocab_size(self) -> int:
        return len(self.chars)

    def encode(self, text: str) -> torch.Tensor:
        lut = {c: i for i, c in enumerate(self.chars)}
        return torch.tensor([lut[c] for c in text], dtype=torch.long)

    def decode(self, ids: torch.Tensor | list[int]) -> str:
        return "".join(self.chars[int(i)] for i in ids)


class TokenWindows(Dataset[tuple[torch.Tensor, torch.Tensor]]):
    """Every window of ``context`` tokens and its next-token targets: item i = (tok[i:i+T], tok[i+1:i+T+1])."""

    def __init__(self, tokens: torch.Tensor, context: int) -> None:
        if len(tokens) <= context:
            raise ValueError(f"text of {len(tokens)} tokens is too short for context {context}")
        self.tokens = tokens
        self.context = context

    def __len__(self) -> int:
        return len(self.tokens) - self.context

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        w = self.tokens[i : i + self.context + 1]
        return w[:-1], w[1:]


@dataclass
class TextData:
    """A tokenised corpus split into train and validation windows."""

    tokenizer: CharTokenizer
    train: TokenWindows
    val: TokenWindows

    def unigram_loss(self) -> float:
        """Cross-entropy (nats) of predicting validation tokens from training character frequencies."""
        counts = torch.bincount(self.train.tokens, minlength=self.tokenizer.vocab_size).double() + 1.0
        logp = (counts / counts.sum()).log()
        return float(-logp[self.val.tokens].mean())


def load_text_data(path: str | None, context: int, val_fraction: float) -> TextData:
    text = read_text(path)
    tok = CharTokenizer.from_text(text)
    ids = tok.encode(text)
    n_val = max(int(len(ids) * val_fraction), context + 1)
    if len(ids) - n_val <= context:
        raise ValueError(
            f"data.path has {len(ids)} characters: too short for context {context} "
            f"with val_fraction {val_fraction}; use a longer text or a shorter --model.context"
        )
    return TextData(tok, TokenWindows(ids[:-n_val], context), TokenWindows(ids[-n_val:], context))
