"""The job's inputs checked in the parent before any worker starts: the text file or prepared folder to train on, the
pretrained weights (``model.weights``) and the checkpoint ``checkpoint.resume`` names. A mistake here is one
line and exit 2, not a traceback in N workers.
"""

from __future__ import annotations

from pathlib import Path

from disttrain.checkpoint.layout import resume_target
from disttrain.config import JobConfig
from disttrain.data.prepared import is_prepared, load_prepared
from disttrain.data.stream import is_raw, plan_raw
from disttrain.data.text import check_text_data
from disttrain.errors import ConfigError


def check_inputs(cfg: JobConfig) -> None:
    """The data file (``data.path``) and the checkpoint to resume from, where they can be checked up front."""
    if cfg.data.path is not None and cfg.data.module is None:
        check_data(cfg)
    if cfg.model.weights is not None:
        from disttrain.checkpoint.pretrained import weight_files  # DTensor's import: only with weights

        weight_files(Path(cfg.model.weights))
    if not cfg.checkpoint.create_seed:
        check_resume(cfg)


def check_data(cfg: JobConfig) -> None:
    """A prepared folder (its index, tokenizer and size), raw files with a tokenizer (tokenized on the fly), or a
    text file read character by character."""
    assert cfg.data.path is not None
    if is_prepared(cfg.data.path):
        load_prepared(cfg.data.path, cfg.model.context, cfg.data.tokenizer, cfg.train.global_batch)
        return
    if is_raw(cfg.data.path, cfg.data.tokenizer):
        assert cfg.data.tokenizer is not None
        plan_raw(cfg.data.path, cfg.data.tokenizer)  # tokenized on the fly by the workers' loaders
        return
    check_text_data(cfg.data.path, cfg.model.context, cfg.data.val_fraction)


def checkpoint_folder(cfg: JobConfig) -> Path | None:
    """Where the workers will look for checkpoints, when that is known before the run folder is made: an
    absolute ``checkpoint.folder``, or a relative one inside a named run folder (``run.name``)."""
    folder = Path(cfg.checkpoint.folder)
    if folder.is_absolute():
        return folder
    return Path(cfg.run.root) / cfg.run.name / folder if cfg.run.name else None


def check_resume(cfg: JobConfig) -> None:
    """A step number or path in ``checkpoint.resume`` must name a usable checkpoint (auto and never always do)."""
    spec = cfg.checkpoint.resume
    if spec in ("auto", "never"):
        return
    folder = checkpoint_folder(cfg)
    if spec.isdigit() and folder is None:
        raise ConfigError(
            f"checkpoint.resume={spec!r}: there is no checkpoint for step {int(spec)}: without --run.name every run "
            "starts in a new run folder; name the run to resume (--run.name NAME) or give a checkpoint path"
        )
    resume_target(folder or Path("."), spec)  # CheckpointError (one line, exit 2) unless usable
