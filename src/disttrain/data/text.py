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

from disttrain.errors import ConfigError

BUNDLED_CORPUS = "shakespeare.txt.gz"


def read_text(path: str | Path | None = None) -> str:
    """Read a UTF-8 text file (``.gz`` allowed); ``None`` means the bundled Shakespeare corpus.

    A file that is missing, unreadable, not UTF-8 or empty is a :class:`ConfigError` naming it."""
    if path is None:
        data = resources.files("disttrain.data").joinpath(BUNDLED_CORPUS).read_bytes()
        return gzip.decompress(data).decode("utf-8")
    p = Path(path)
    if p.is_dir():
        texts = sorted(str(f.relative_to(p)) for f in p.iterdir() if f.is_file())[:3]
        some = f" (it holds {', '.join(texts)}{', ...' if len(texts) == 3 else ''})" if texts else " (empty)"
        raise ConfigError(
            f"data.path {str(p)!r} is a folder{some} without an index.json; pass one UTF-8 text file, e.g. "
            f"{p / 'input.txt'}, or a folder made by `disttrain data prepare`"
        )
    if not p.is_file():
        raise ConfigError(f"data.path {str(p)!r} does not exist; pass a UTF-8 text file")
    try:
        raw = p.read_bytes()
        if p.suffix == ".gz":
            raw = gzip.decompress(raw)
    except (OSError, EOFError) as e:  # unreadable, or a broken .gz (BadGzipFile is an OSError)
        raise ConfigError(f"data.path {str(p)!r} cannot be read ({e}); pass a UTF-8 text file") from None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise ConfigError(f"data.path {str(p)!r} is not UTF-8 text ({e.reason} at byte {e.start})") from None
    if not text:
        raise ConfigError(f"data.path {str(p)!r} is empty; pass a UTF-8 text file to train on")
    return text


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


def validation_size(n_chars: int, context: int, val_fraction: float) -> int:
    """Characters held out for validation; ConfigError when the rest cannot fill one training window."""
    n_val = max(int(n_chars * val_fraction), context + 1)
    if n_chars - n_val <= context:
        raise ConfigError(
            f"data.path has {n_chars} characters: too short for context {context} "
            f"with val_fraction {val_fraction}; use a longer text or a shorter --model.context"
        )
    return n_val


def check_text_data(path: str | None, context: int, val_fraction: float) -> None:
    """What :func:`load_text_data` checks, without tokenising: for the parent, before any worker starts."""
    validation_size(len(read_text(path)), context, val_fraction)


def load_text_data(path: str | None, context: int, val_fraction: float) -> TextData:
    """The corpus at ``path`` (None: the bundled one) as train and validation windows of ``context``."""
    text = read_text(path)
    n_val = validation_size(len(text), context, val_fraction)
    tok = CharTokenizer.from_text(text)
    ids = tok.encode(text)
    return TextData(tok, TokenWindows(ids[:-n_val], context), TokenWindows(ids[-n_val:], context))
