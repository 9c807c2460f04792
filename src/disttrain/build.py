"""The user's model and data by import path (``model.module`` / ``data.module``), or the built-in GPT and text corpus.

Imports only config, errors, models and data: the planner, the launcher and the worker all build through here.
"""

from __future__ import annotations

import importlib
from typing import Any

import torch
from torch import nn
from torch.utils.data import Dataset

from disttrain.config import JobConfig
from disttrain.data.text import TextData, load_text_data
from disttrain.errors import ConfigError, MetaDeviceError
from disttrain.models.gpt import GPT, GPTConfig


def import_object(spec: str, what: str) -> Any:
    """'pkg.mod:name' -> the object; ConfigError saying what failed otherwise."""
    mod_name, _, attr = spec.partition(":")
    try:
        mod = importlib.import_module(mod_name)
    except Exception as e:  # any import-time error in user code
        raise ConfigError(f"{what} {spec!r}: cannot import module {mod_name!r} ({type(e).__name__}: {e})") from None
    obj = getattr(mod, attr, None)
    if obj is None or not callable(obj):
        raise ConfigError(f"{what} {spec!r}: module {mod_name!r} has no callable {attr!r}")
    return obj


def check_imports(cfg: JobConfig) -> None:
    """Fail before launching workers if a user model/dataset path does not import."""
    if cfg.model.module:
        import_object(cfg.model.module, "model.module")
    if cfg.data.module:
        import_object(cfg.data.module, "data.module")


def build_data(cfg: JobConfig) -> tuple[Dataset[Any], Dataset[Any] | None, TextData | None]:
    if cfg.data.module:
        out = import_object(cfg.data.module, "data.module")()
        if isinstance(out, tuple) and len(out) == 2:
            return out[0], out[1], None
        return out, None, None
    text = load_text_data(cfg.data.path, cfg.model.context, cfg.data.val_fraction)
    return text.train, text.val, text


def build_model(cfg: JobConfig, vocab_size: int | None, on_meta: bool) -> nn.Module:
    """The configured model; on the meta device when FSDP will shard it (no full copy in memory)."""
    if cfg.model.module:
        factory = import_object(cfg.model.module, "model.module")
        try:
            with torch.device("meta") if on_meta else torch.device("cpu"):
                model = factory()
        except Exception as e:  # user code failing under the meta device
            if not on_meta:
                raise
            raise MetaDeviceError(
                f"model.module {cfg.model.module!r} cannot be built on the meta device ({type(e).__name__}: "
                f"{str(e).splitlines()[0][:200] if str(e) else ''}); sharded strategies and the memory plan build "
                "it there: avoid tensor data access (.item(), .tolist(), numpy) in __init__"
            ) from None
        if not isinstance(model, nn.Module):
            raise ConfigError(f"model.module {cfg.model.module!r} returned {type(model).__name__}, not an nn.Module")
        return model
    if vocab_size is None:
        raise ConfigError("the built-in GPT needs a text dataset (data.path) or a dataset with a vocab_size attribute")
    m = cfg.model
    gcfg = GPTConfig(vocab_size, m.n_layers, m.d_model, m.n_heads, m.context, m.dropout)
    with torch.device("meta") if on_meta else torch.device("cpu"):
        return GPT(gcfg, seed=cfg.train.seed)


def vocab_size(train: Dataset[Any], text: TextData | None) -> int | None:
    """The vocabulary the built-in GPT needs: the tokenizer's, or the dataset's ``vocab_size`` attribute."""
    return text.tokenizer.vocab_size if text else getattr(train, "vocab_size", None)
