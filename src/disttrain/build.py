"""The user's model and data by import path (``model.module`` / ``data.module``), or the built-in GPT and text corpus;
where a sharded model is built (meta device or CPU, ``parallel.init``).

Imports only config, errors, models and data: the planner, the launcher and the worker all build through here.
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.util
import inspect
import os
import sys
import traceback
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import torch
from torch import nn
from torch.utils.data import Dataset

from disttrain.config import JobConfig
from disttrain.data.prepared import is_prepared, load_prepared, prepared_tokenizer
from disttrain.data.stream import check_size, is_raw, raw_windows
from disttrain.data.text import TextData, load_text_data
from disttrain.data.tokenizers import TextTokenizer, load_tokenizer
from disttrain.errors import ConfigError, MetaDeviceError, ModelBuildError, VocabularyError
from disttrain.models.gpt import GPT, GPTConfig


def import_object(spec: str, what: str) -> Any:
    """'pkg.mod:name' (importable from the current folder too, as ``python -m`` has it) or 'path/to/file.py:name'
    -> the object; ConfigError saying what failed otherwise."""
    target, _, attr = spec.rpartition(":")
    if not target or not attr:
        raise ConfigError(f"{what} {spec!r}: expected 'pkg.module:function' or 'path/to/file.py:function'")
    try:
        mod = _load_file(target) if target.endswith(".py") else _import_here(target)
    except ConfigError as e:
        raise ConfigError(f"{what} {spec!r}: {e}") from None
    except Exception as e:  # any import-time error in user code
        raise ConfigError(f"{what} {spec!r}: cannot import module {target!r} ({type(e).__name__}: {e})") from None
    obj = getattr(mod, attr, None)
    if obj is None or not callable(obj):
        raise ConfigError(f"{what} {spec!r}: module {target!r} has no callable {attr!r}")
    return obj


def _import_here(name: str) -> Any:
    """``importlib.import_module`` with the current folder on the path, as ``python -m`` and torchrun have it."""
    here = os.getcwd()
    if here not in sys.path and "" not in sys.path:
        sys.path.insert(0, here)
    return importlib.import_module(name)


def _load_file(path: str) -> Any:
    """A module from a file path (relative to the current folder), loaded once per process under its stem."""
    file = Path(path).expanduser().resolve()
    if not file.is_file():
        raise ConfigError(f"file {path!r} does not exist (looked in {Path.cwd()})")
    name = f"disttrain_user_{file.stem}"
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, file)
    if spec is None or spec.loader is None:
        raise ConfigError(f"{path!r} is not a Python file that can be imported")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        del sys.modules[name]
        raise
    return module


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
    if is_prepared(cfg.data.path):
        assert cfg.data.path is not None
        prepared = load_prepared(cfg.data.path, cfg.model.context, cfg.data.tokenizer, cfg.train.global_batch)
        return prepared.train, prepared.val, None
    if is_raw(cfg.data.path, cfg.data.tokenizer):
        assert cfg.data.path is not None and cfg.data.tokenizer is not None
        train, val = raw_windows(
            cfg.data.path, cfg.data.tokenizer, cfg.model.context, cfg.train.seed, cfg.data.val_fraction
        )
        check_size(train, cfg.train.global_batch)
        return train, val, None
    text = load_text_data(cfg.data.path, cfg.model.context, cfg.data.val_fraction)
    return text.train, text.val, text


def data_tokenizer(cfg: JobConfig) -> TextTokenizer | None:
    """The tokenizer the job's token ids come from: a prepared folder's, or ``data.tokenizer`` (a file, a
    save_pretrained folder or ``bytes``) beside raw files or a dataset of the user's (``data.module``); None for
    text read character by character."""
    if cfg.data.module is None:
        path, spec = cfg.data.path, cfg.data.tokenizer
        if path is not None and is_prepared(path):
            return prepared_tokenizer(path)
        return load_tokenizer(spec, "data.tokenizer") if spec is not None and is_raw(path, spec) else None
    spec = cfg.data.tokenizer
    if spec is None or spec == "chars" or spec.startswith("bpe:"):  # made from a corpus: nothing to load
        return None
    return load_tokenizer(spec, "data.tokenizer")


def build_model(
    cfg: JobConfig, vocab_size: int | None, on_meta: bool, tokenizer: TextTokenizer | None = None
) -> nn.Module:
    """The configured model; on the meta device when FSDP will shard it (no full copy in memory). With the
    data's ``tokenizer``, a Hugging Face model's special ids are checked against it."""
    if cfg.model.module:
        factory = import_object(cfg.model.module, "model.module")
        torch.manual_seed(cfg.train.seed)  # every rank (and a single process) builds the same weights
        # build(vocab_size=...) gets the data's vocabulary when it takes one
        takes_vocab = vocab_size is not None and "vocab_size" in inspect.signature(factory).parameters
        kwargs = {"vocab_size": vocab_size} if takes_vocab else {}
        try:
            with torch.device("meta") if on_meta else torch.device("cpu"):
                model = factory(**kwargs)
        except Exception as e:  # the user's function raised: say what, and where
            raise build_error(cfg.model.module, e, on_meta) from None
        if not isinstance(model, nn.Module):
            raise ConfigError(f"model.module {cfg.model.module!r} returned {type(model).__name__}, not an nn.Module")
        check_vocabulary(model, vocab_size, cfg.model.module)
        if tokenizer is not None:
            check_special_ids(model, tokenizer, cfg.model.module)
        return model
    if vocab_size is None:
        raise ConfigError("the built-in GPT needs a text dataset (data.path) or a dataset with a vocab_size attribute")
    m = cfg.model
    gcfg = GPTConfig(vocab_size, m.n_layers, m.d_model, m.n_heads, m.context, m.dropout)
    with torch.device("meta") if on_meta else torch.device("cpu"):
        return GPT(gcfg, seed=cfg.train.seed)


def build_error(spec: str, e: Exception, on_meta: bool) -> ConfigError:
    """What a user's build function raised, with its last frame; the meta-device advice only for an error the
    meta device caused (tensor data read while building)."""
    first = str(e).splitlines()[0][:200] if str(e) else ""
    frames = traceback.extract_tb(e.__traceback__) if e.__traceback__ else []
    ours = str(Path(__file__).parent)
    # the user's own last frame, not torch's or ours under it
    theirs = [f for f in frames if "site-packages" not in f.filename and not f.filename.startswith(ours)]
    last = theirs or frames
    where = f" at {last[-1].filename}:{last[-1].lineno} in {last[-1].name}" if last else ""
    what = f"{type(e).__name__}: {first}{where}"
    if on_meta and "meta" in str(e).lower():
        return MetaDeviceError(
            f"model.module {spec!r} cannot be built on the meta device ({what}); sharded strategies and the memory "
            "plan build it there: avoid tensor data access (.item(), .tolist(), numpy) in __init__"
        )
    return ModelBuildError(f"model.module {spec!r} raised {what}")


def input_embedding(model: nn.Module) -> nn.Embedding | None:
    """The embedding the token ids index: the model's own answer (``get_input_embeddings``, as Hugging Face models
    and the built-in GPT have it), else the first ``nn.Embedding`` not named for positions."""
    get = getattr(model, "get_input_embeddings", None)
    found = get() if callable(get) else None
    if isinstance(found, nn.Embedding):
        return found
    named = [(n, m) for n, m in model.named_modules() if isinstance(m, nn.Embedding)]
    tokens = [m for n, m in named if not any(w in n.rsplit(".", 1)[-1].lower() for w in ("pos", "wpe"))]
    return tokens[0] if tokens else None


def check_vocabulary(model: nn.Module, vocab: int | None, spec: str) -> None:
    """A model whose embedding has fewer rows than the data has token ids would fail with an IndexError inside
    every rank's first forward: say so here, before any worker starts."""
    emb = input_embedding(model)
    if vocab is None or emb is None or emb.num_embeddings >= vocab:
        return
    raise VocabularyError(
        f"model.module {spec!r} embeds {emb.num_embeddings} token ids, but the data has {vocab}; build the "
        f"embedding with at least {vocab} rows (a build(vocab_size) parameter gets the data's vocabulary)"
    )


def _ids(value: Any) -> list[int]:
    """A config's token id field (None, one id or a list of them) as a list."""
    if value is None:
        return []
    return [int(v) for v in value] if isinstance(value, list | tuple) else [int(value)]


def special_id_problem(config: Any, tok: TextTokenizer) -> str | None:
    """What is wrong with a Hugging Face config's special ids for ``tok``, or None."""
    named = {k: _ids(getattr(config, k, None)) for k in ("eos_token_id", "bos_token_id", "pad_token_id")}
    for key, ids in named.items():
        bad = [i for i in ids if not 0 <= i < tok.vocab_size]
        if bad:
            return f"{key} {bad[0]} is not an id of the tokenizer (it has {tok.vocab_size})"
    if tok.eot_id not in named["eos_token_id"]:
        return f"eos_token_id {getattr(config, 'eos_token_id', None)} is not the tokenizer's end of text"
    if tok.bos_id is not None and named["bos_token_id"] not in ([], [tok.bos_id]):
        return f"bos_token_id {named['bos_token_id'][0]} is not the tokenizer's start of sequence"
    return None


def check_special_ids(model: nn.Module, tok: TextTokenizer, spec: str) -> None:
    """A Hugging Face model's ``eos_token_id`` must be the tokenizer's end of text, its ``bos_token_id`` the
    tokenizer's start of sequence (when both have one) and every special id one of the tokenizer's: otherwise
    generation stops at the wrong token and the exported model and tokenizer disagree."""
    for hf in hf_models(model):
        problem = special_id_problem(hf.config, tok)
        if problem is None:
            continue
        ends = f"end of text {tok.eot_id} ({tok.token(tok.eot_id)!r})"
        starts = f", start of sequence {tok.bos_id}" if tok.bos_id is not None else ""
        fix = f"eos_token_id={tok.eot_id}" + (f", bos_token_id={tok.bos_id}" if tok.bos_id is not None else "")
        raise VocabularyError(
            f"model.module {spec!r}: its config's {problem} (the {tok.spec!r} tokenizer: {ends}{starts}); "
            f"build the config with {fix}"
        )


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
