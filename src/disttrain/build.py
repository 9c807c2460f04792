"""The user's model and data by import path (``model.module`` / ``data.module``), or the built-in GPT and text corpus;
where a sharded model is built (meta device or CPU, ``parallel.init``).

Imports only config, errors, models and data: the planner, the launcher and the worker all build through here.
"""

from __future__ import annotations

import contextlib
import importlib
from collections.abc import Iterator
from typing import Any

import psutil
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
        torch.manual_seed(cfg.train.seed)  # every rank (and a single process) builds the same weights
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


def hf_models(model: nn.Module) -> list[nn.Module]:
    """The outermost Hugging Face models (``PreTrainedModel``s) in ``model``'s tree, ``model`` itself included."""
    found: list[nn.Module] = []

    def visit(m: nn.Module) -> None:
        if callable(getattr(m, "init_weights", None)) and hasattr(m, "_init_weights") and hasattr(m, "config"):
            found.append(m)
            return
        for child in m.children():
            visit(child)

    visit(model)
    return found


def declared_init(model: nn.Module) -> str | None:
    """How a model says it initialises itself after a meta-device build: init_param (per full tensor:
    exact at any world size), hf (Hugging Face's _init_weights), init_weights, or None."""
    if callable(getattr(model, "init_param", None)):
        return "init_param"
    if hf_models(model):
        return "hf"
    if callable(getattr(model, "init_weights", None)):
        return "init_weights"
    return None


def resolve_init(mode: str, model: nn.Module, ranks_per_host: int = 1, weights: bool = False) -> str:
    """``parallel.init`` for a model built on the meta device: auto is meta when the model initialises each
    full tensor itself (init_param), or when it declares an initialisation and either pretrained weights
    replace it anyway (``weights``) or one full copy per rank would not fit in host memory; cpu otherwise
    (any model, the same weights as one process)."""
    if mode != "auto":
        return mode
    how = declared_init(model)
    if how == "init_param" or (how is not None and weights):
        return "meta"
    full = sum(p.numel() * p.element_size() for p in model.parameters())
    if how is not None and full * ranks_per_host > 0.5 * psutil.virtual_memory().available:
        return "meta"
    return "cpu"


@contextlib.contextmanager
def params_on_meta() -> Iterator[None]:
    """Build with parameters moved to the meta device as they are registered, buffers real (as Accelerate's
    ``init_empty_weights(include_buffers=False)``): one parameter at a time exists in memory."""
    register = nn.Module.register_parameter

    def on_meta(module: nn.Module, name: str, param: nn.Parameter | None) -> None:
        register(module, name, param)
        if param is not None and not param.is_meta:
            module._parameters[name] = nn.Parameter(param.to("meta"), requires_grad=param.requires_grad)

    nn.Module.register_parameter = on_meta  # type: ignore[method-assign,assignment]
    try:
        yield
    finally:
        nn.Module.register_parameter = register  # type: ignore[method-assign]


def build_for_training(cfg: JobConfig, vocab: int | None, sharded: bool, ranks_per_host: int = 1) -> nn.Module:
    """The model as its strategy wants it: on the meta device when sharded and ``parallel.init`` resolves to
    meta (each rank then initialises only its shards), else on CPU with the job's seed.

    Non-persistent buffers computed at build time (causal masks, rotary tables) are not in any checkpoint
    and often not re-created by an init function: they are computed once more by a build with the
    parameters on the meta device, and kept."""
    if not sharded:
        return build_model(cfg, vocab, on_meta=False)
    model = build_model(cfg, vocab, on_meta=True)
    if resolve_init(cfg.parallel.init, model, ranks_per_host, cfg.model.weights is not None) == "cpu":
        return build_model(cfg, vocab, on_meta=False)
    computed = {n for m_name, m in model.named_modules() for n in _non_persistent(m_name, m)}
    if computed and cfg.model.module:
        with params_on_meta():
            real = dict(build_model(cfg, vocab, on_meta=False).named_buffers())
        for name in computed:
            owner, _, leaf = name.rpartition(".")
            model.get_submodule(owner)._buffers[leaf] = real[name]
    return model


def _non_persistent(prefix: str, module: nn.Module) -> list[str]:
    names = [b for b in module._non_persistent_buffers_set if module._buffers.get(b) is not None]
    return [f"{prefix}.{b}" if prefix else b for b in names]
