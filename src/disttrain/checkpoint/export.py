"""Model weights out of checkpoints and live models: the saved state read without a process group
(``load_state``, ``load_model_weights``), ``disttrain ckpt export`` (``export``), a live (possibly sharded) model
gathered to rank 0 (``export_live_model``), and the one plain file both write (``write_weights``).

Nothing here unpickles without restrictions: ``.metadata`` goes through ``read_metadata_safely`` and every
stored non-tensor item through ``torch.load(weights_only=True)``.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.checkpoint.default_planner import _EmptyStateDictLoadPlanner
from torch.distributed.checkpoint.state_dict import StateDictOptions
from torch.distributed.checkpoint.state_dict_loader import _load_state_dict

from disttrain.checkpoint.layout import find_checkpoint, folder_info
from disttrain.checkpoint.pretrained import HF_CONFIG, export_hf_folder
from disttrain.checkpoint.reader import SafeFileSystemReader, WeightsOnlyBytes, read_metadata_safely
from disttrain.checkpoint.verify import first_line
from disttrain.config import DTYPES
from disttrain.data.tokenizer_folder import RUN_TOKENIZER
from disttrain.errors import CheckpointError, ConfigError
from disttrain.parallel.held_order import state_to_defined

MODEL_PREFIX = ("app", "model")  # the Trainer saves {"app": ModelOptimState, "train": ...}


def write_weights(state: dict[str, torch.Tensor], path: Path, dtype: str = "fp32") -> Path:
    """One file of plain model weights: ``.safetensors`` by suffix, else ``torch.save`` (weights_only-loadable)."""
    cast: dict[str, torch.Tensor] = {}
    seen: set[int] = set()
    for k, v in state.items():
        t = v.detach().to("cpu", DTYPES[dtype]).contiguous()
        ptr = t.untyped_storage().data_ptr()
        cast[k] = t.clone() if ptr in seen else t  # tied weights: safetensors stores no shared memory
        seen.add(ptr)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    if path.suffix == ".safetensors":
        from safetensors.torch import save_file

        save_file(cast, str(tmp))
    else:
        torch.save(cast, tmp)
    os.replace(tmp, path)
    return path


def export_live_model(model: nn.Module, path: Path, dtype: str = "fp32") -> Path | None:
    """Gather the full model to rank 0 and write it there (collective: every rank calls it)."""
    from torch.distributed.checkpoint.state_dict import get_model_state_dict

    sd = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    state_to_defined(model, sd)  # full tensors: in the model's own order, whatever a TP plan holds
    if dist.is_initialized() and dist.get_rank() != 0:
        return None
    return write_weights(sd, path, dtype)  # type: ignore[arg-type]


class _SafeEmptyPlanner(WeightsOnlyBytes, _EmptyStateDictLoadPlanner):
    """Rebuilds the saved state dict from the metadata; non-tensor items are loaded ``weights_only``."""


def load_state(ckpt: Path, keys: set[str] | None = None) -> dict[str, Any]:
    """The saved state (nested as saved, e.g. ``{"app": {"model": ..., "optim": ...}, "train": ...}``), in memory,
    without a process group. ``keys`` limits it to those dotted prefixes (``{"app.model"}``)."""
    read_metadata_safely(ckpt)  # a clean error before DCP starts (its reader re-reads it, safely, below)
    sd: dict[str, Any] = {}
    try:
        _load_state_dict(
            sd, storage_reader=SafeFileSystemReader(ckpt), planner=_SafeEmptyPlanner(keys=keys), no_dist=True
        )
    except CheckpointError:
        raise
    except Exception as e:
        raise CheckpointError(f"{ckpt}: cannot be read ({first_line(e)}); run `disttrain ckpt verify {ckpt}`") from None
    return sd


def load_model_weights(ckpt: Path) -> dict[str, torch.Tensor]:
    """``{fqn: tensor}`` of the model in a checkpoint written by the Trainer (full tensors, whatever the sharding)."""
    sd = load_state(ckpt, keys={".".join(MODEL_PREFIX)})
    model = sd.get(MODEL_PREFIX[0], {}).get(MODEL_PREFIX[1])
    if not model:
        raise CheckpointError(f"{ckpt}: no model weights in it (keys {'.'.join(MODEL_PREFIX)}.*)")
    return {k: v for k, v in model.items() if isinstance(v, torch.Tensor)}


def hf_config_of_run(run: Path) -> Path:
    """Where a run's Hugging Face ``config.json`` comes from when ``--config-from`` is not given: the pretrained
    folder the run started from (``model.weights``), else the config its model was built with (``RUN/hf-config``,
    written by the run); a ConfigError naming what is missing otherwise (a folder without a config.json is one
    ``from_pretrained`` cannot load)."""
    import tomllib

    weights = None
    if (run / "config.toml").is_file():
        weights = tomllib.loads((run / "config.toml").read_text()).get("model", {}).get("weights")
    folder = Path(weights) if weights else None
    if folder is not None and not folder.is_dir():
        folder = folder.parent
    if folder is not None and (folder / "config.json").is_file():
        return folder
    if (run / HF_CONFIG / "config.json").is_file():
        return run / HF_CONFIG
    started = f"it started from {weights}, which has no config.json" if weights else "it named no model.weights"
    raise ConfigError(
        f"--format hf needs the model's config.json and {run} does not say where it is ({started}, and its model "
        "is not a Hugging Face one); pass "
        "--config-from FOLDER (a save_pretrained folder of the same model, e.g. the one it came from)"
    )


def export(
    path: Path,
    step: int | None = None,
    fmt: str | None = None,
    dtype: str = "fp32",
    out: Path | None = None,
    config_from: Path | None = None,
) -> int:
    """Write the model weights of one checkpoint to one file (``torch.load(weights_only=True)`` / safetensors),
    or to a Hugging Face folder (``fmt="hf"``: ``model.safetensors``, the ``config.json`` of ``config_from`` or
    of the run, and the run's tokenizer files)."""
    if dtype not in DTYPES:
        raise ConfigError(f"--dtype must be one of {', '.join(DTYPES)}, got {dtype!r}")
    if fmt is None:
        fmt = "safetensors" if out is None or out.suffix == ".safetensors" else "torch"
    if fmt not in ("torch", "safetensors", "hf"):
        raise ConfigError(f"--format must be torch, safetensors or hf, got {fmt!r}")
    if fmt != "hf" and out is not None and (out.suffix == ".safetensors") != (fmt == "safetensors"):
        raise ConfigError(
            f"--out {out} does not fit --format {fmt}: safetensors files end in .safetensors, others must not"
        )
    if config_from is not None and fmt != "hf":
        raise ConfigError("--config-from is for --format hf (a folder from_pretrained loads)")
    ckpt = find_checkpoint(path, step)
    info = folder_info(ckpt)
    if not info.usable:
        raise CheckpointError(f"{ckpt} cannot be exported: {info.problem}; see `disttrain ckpt verify {ckpt}`")
    weights = load_model_weights(ckpt)
    run = ckpt.resolve().parent.parent
    if fmt == "hf":
        cast = {k: v.to(DTYPES[dtype]) for k, v in weights.items()}
        config = config_from or hf_config_of_run(run)
        target = export_hf_folder(cast, out or run / "hf", config, run / RUN_TOKENIZER)
    else:
        target = write_weights(weights, out or run / f"model.{'safetensors' if fmt == 'safetensors' else 'pt'}", dtype)
    n = sum(t.numel() for t in weights.values())
    print(f"wrote {target}: {len(weights)} tensors, {n:,} parameters, {dtype}, from {ckpt}")
    return 0
