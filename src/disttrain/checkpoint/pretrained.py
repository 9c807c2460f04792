"""Pretrained weights into a live, possibly sharded model (``--model.weights``), and Hugging Face folders out
(``disttrain ckpt export --format hf``: the weights, the model's ``config.json`` and the run's tokenizer files).

Loading reads safetensors by their JSON headers and plain reads: under FSDP / HSDP each rank reads only the
rows of each tensor that its shard holds, straight into the shard (no memory map, no full copy anywhere).
Names are matched exactly, or after removing one leading wrapper name (``inner.``) on either side; tied
tensors are satisfied by any of their names (Hugging Face saves the embedding once). What does not match is
listed in one error.
"""

from __future__ import annotations

import json
import math
import shutil
from dataclasses import dataclass
from io import BufferedReader
from pathlib import Path

import torch
from torch import nn
from torch.distributed.tensor import DTensor
from torch.distributed.tensor._utils import compute_local_shape_and_global_offset

from disttrain.build import hf_models
from disttrain.data.tokenizer_folder import HF_FILES
from disttrain.errors import ConfigError

HF_CONFIG = "hf-config"
"""The folder of a run that holds its Hugging Face model's ``config.json`` (written by rank 0 at the start)."""


def weight_files(path: Path) -> list[Path]:
    """The safetensors files at ``path``: the file itself, or every ``*.safetensors`` in the folder."""
    if path.is_file():
        if path.suffix != ".safetensors":
            raise ConfigError(f"model.weights {path}: not a .safetensors file; save weights with safetensors")
        return [path]
    files = sorted(path.glob("*.safetensors")) if path.is_dir() else []
    if not files:
        what = "no .safetensors files in that folder" if path.is_dir() else "does not exist"
        raise ConfigError(f"model.weights {path}: {what}; point it at a safetensors file or a save_pretrained folder")
    return files


def _targets(model: nn.Module) -> dict[str, list[str]]:
    """What must be loaded: the first name of each parameter / persistent buffer -> all of its names."""
    names: dict[int, list[str]] = {}
    for n, t in model.named_parameters(remove_duplicate=False):
        names.setdefault(id(t), []).append(n)
    persistent = set(model.state_dict().keys())
    for n, b in model.named_buffers(remove_duplicate=False):
        if n in persistent:
            names.setdefault(id(b), []).append(n)
    return {ns[0]: ns for ns in names.values()}


def _strip(name: str, prefix: str) -> str:
    return name[len(prefix) :] if prefix and name.startswith(prefix) else name


def match_names(model_names: dict[str, list[str]], file_names: set[str]) -> dict[str, str]:
    """model name -> file name, trying no prefix, then a leading wrapper name removed from the model's or
    the file's names; ConfigError listing what is missing and unexpected when nothing fits exactly."""
    heads = {n.split(".", 1)[0] + "." for ns in model_names.values() for n in ns if "." in n}
    heads |= {n.split(".", 1)[0] + "." for n in file_names if "." in n}
    best: tuple[int, dict[str, str]] = (-1, {})
    for strip_model, strip_file in [("", ""), *((h, "") for h in heads), *(("", h) for h in heads)]:
        by_file = {_strip(f, strip_file): f for f in file_names}
        found = {}
        for key, aliases in model_names.items():
            hit = next((by_file[_strip(a, strip_model)] for a in aliases if _strip(a, strip_model) in by_file), None)
            if hit is not None:
                found[key] = hit
        if len(found) > best[0]:
            best = (len(found), found)
    found = best[1]
    missing = sorted(k for k in model_names if k not in found)
    unexpected = sorted(file_names - set(found.values()))
    if missing or unexpected:
        raise ConfigError(
            f"model.weights do not fit the model: {len(missing)} missing ({', '.join(missing[:6]) or '-'}"
            f"{' ...' if len(missing) > 6 else ''}), {len(unexpected)} unexpected "
            f"({', '.join(unexpected[:6]) or '-'}{' ...' if len(unexpected) > 6 else ''}); check that the "
            "file was saved from the same architecture and config"
        )
    return found


def _local_rows(t: torch.Tensor) -> tuple[torch.Tensor, tuple[slice, ...]]:
    """The tensor to write into and the slice of the full tensor it holds (its shard under FSDP)."""
    if not isinstance(t, DTensor):
        return t, tuple(slice(0, s) for s in t.shape)
    shape, offset = compute_local_shape_and_global_offset(t.shape, t.device_mesh, list(t.placements))
    return t.to_local(), tuple(slice(o, o + s) for o, s in zip(offset, shape, strict=True))


ST_DTYPES = {
    "F64": torch.float64,
    "F32": torch.float32,
    "F16": torch.float16,
    "BF16": torch.bfloat16,
    "I64": torch.int64,
    "I32": torch.int32,
    "I16": torch.int16,
    "I8": torch.int8,
    "U8": torch.uint8,
    "BOOL": torch.bool,
}


@dataclass(frozen=True)
class Stored:
    """Where one tensor lies in a safetensors file."""

    file: Path
    offset: int
    """Of its first byte, from the start of the file."""
    dtype: torch.dtype
    shape: tuple[int, ...]


def read_index(files: list[Path]) -> dict[str, Stored]:
    """Every tensor in the files, from their JSON headers (no data read, nothing mapped)."""
    index: dict[str, Stored] = {}
    for f in files:
        size = f.stat().st_size
        try:
            with open(f, "rb") as fh:
                n = int.from_bytes(fh.read(8), "little")
                header = json.loads(fh.read(n)) if 0 < n <= size - 8 else None
        except (OSError, ValueError):
            header = None
        if not isinstance(header, dict):
            raise ConfigError(f"model.weights {f}: not a readable safetensors file (bad header)")
        header.pop("__metadata__", None)
        for key, e in header.items():
            begin, stop = e["data_offsets"]
            if e["dtype"] not in ST_DTYPES or 8 + n + stop > size:
                raise ConfigError(f"model.weights {f}: {key} is truncated or of an unknown dtype {e['dtype']!r}")
            index[key] = Stored(f, 8 + n + begin, ST_DTYPES[e["dtype"]], tuple(e["shape"]))
    return index


def _read_rows(fh: BufferedReader, stored: Stored, rows: tuple[slice, ...], into: torch.Tensor) -> None:
    """Read the rows ``rows[0]`` of a stored tensor straight into ``into`` (its shard: the rows FSDP gives
    this rank are one contiguous run of bytes); through a buffer when the dtype differs."""
    if any(r != slice(0, s) for r, s in zip(rows[1:], stored.shape[1:], strict=True)):
        raise ConfigError(f"model.weights: a shard that splits a dimension other than the first ({rows})")
    row = math.prod(stored.shape[1:]) * stored.dtype.itemsize
    first = rows[0].start if stored.shape else 0
    buf = into if into.dtype == stored.dtype and into.is_contiguous() else torch.empty(into.shape, dtype=stored.dtype)
    fh.seek(stored.offset + first * row)
    view = buf.detach().reshape(-1).view(torch.uint8).numpy()
    if fh.readinto(view.data) != view.nbytes:
        raise ConfigError(f"model.weights {stored.file}: ends early (truncated file)")
    if buf is not into:
        into.copy_(buf)


@torch.no_grad()
def load_pretrained(model: nn.Module, path: str | Path) -> int:
    """Copy the weights at ``path`` into ``model`` (plain, DDP-wrapped inner, or sharded), each rank reading
    only its own rows with plain reads (no memory map: nothing but the shard is ever resident); the number
    of tensors loaded."""
    index = read_index(weight_files(Path(path)))
    mapping = match_names(_targets(model), set(index))
    tensors = dict(model.named_parameters(remove_duplicate=False)) | dict(model.named_buffers())
    handles: dict[Path, BufferedReader] = {}
    try:
        for name, key in mapping.items():
            stored, target = index[key], tensors[name]
            if list(stored.shape) != list(target.shape):
                raise ConfigError(
                    f"model.weights {stored.file.name}: {key} has shape {list(stored.shape)}, "
                    f"the model's {name} {list(target.shape)}"
                )
            fh = handles.get(stored.file) or handles.setdefault(stored.file, open(stored.file, "rb"))  # noqa: SIM115
            local, rows = _local_rows(target)
            _read_rows(fh, stored, rows, local)
    finally:
        for fh in handles.values():
            fh.close()
    return len(mapping)


def save_hf_config(model: nn.Module, run_dir: Path) -> Path | None:
    """``RUN/hf-config/config.json`` of the one Hugging Face model in ``model`` (the config it was built with,
    e.g. from a ``build(vocab_size)`` of the user's), for ``ckpt export --format hf``; None for other models."""
    found = hf_models(model)
    if len(found) != 1 or not callable(getattr(getattr(found[0], "config", None), "save_pretrained", None)):
        return None
    folder = run_dir / HF_CONFIG
    found[0].config.save_pretrained(folder)  # type: ignore[operator,union-attr]
    return folder / "config.json"


def copy_tokenizer(tokenizer: Path, out: Path) -> list[str]:
    """The Hugging Face tokenizer files of a run's ``tokenizer/`` folder into ``out`` (replacing any that
    ``--config-from`` brought: the run trained with this one); the names copied."""
    copied = []
    for name in HF_FILES:
        if (tokenizer / name).is_file():
            shutil.copy2(tokenizer / name, out / name)
            copied.append(name)
    return copied


def export_hf_folder(
    weights: dict[str, torch.Tensor], out: Path, config_from: Path | None, tokenizer: Path | None = None
) -> Path:
    """A folder ``from_pretrained`` loads offline: ``model.safetensors`` (the model's own names, one leading
    wrapper name removed when every name shares it), ``config.json`` (with the rest of ``config_from``'s
    small files) when given, and the tokenizer files of ``tokenizer`` (a run's ``tokenizer/``) when it has them."""
    from safetensors.torch import save_file

    heads = {k.split(".", 1)[0] for k in weights}
    if len(heads) == 1 and all("." in k for k in weights):
        weights = {k.split(".", 1)[1]: v for k, v in weights.items()}
    out.mkdir(parents=True, exist_ok=True)
    if config_from is not None:
        src = config_from if config_from.is_dir() else config_from.parent
        if not (src / "config.json").is_file():
            raise ConfigError(f"--config-from {config_from}: no config.json there; give a save_pretrained folder")
        for f in src.iterdir():
            if f.is_file() and f.suffix in (".json", ".txt", ".model") and f.name != "model.safetensors.index.json":
                shutil.copy2(f, out / f.name)
    if tokenizer is not None:
        copy_tokenizer(tokenizer, out)
    tmp = out / "model.safetensors.tmp"
    save_file({k: v.contiguous() for k, v in weights.items()}, str(tmp), metadata={"format": "pt"})
    tmp.replace(out / "model.safetensors")
    return out / "model.safetensors"
