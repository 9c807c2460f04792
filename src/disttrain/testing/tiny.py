"""Tiny jobs for tests and benchmarks: a slice of the bundled corpus, and the tiny GPT job (2 blocks, width 64,
context 32, fp32) in its three forms: a config dict, ``disttrain run`` arguments, a single-process Trainer."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from disttrain.data.text import read_text

if TYPE_CHECKING:
    from disttrain.train.trainer import Trainer


def write_small_text(path: Path, chars: int = 60_000) -> Path:
    """The first ``chars`` characters of the bundled corpus at ``path``: enough for tiny models, quick to
    tokenise."""
    path.write_text(read_text()[:chars])
    return path


def tiny_config(data_path: Path, **sections: dict[str, Any]) -> dict[str, Any]:
    """A tiny GPT job in TOML layout (2 blocks, width 64, context 32), fp32, no eval noise; ``sections`` update
    its sections."""
    cfg: dict[str, Any] = {
        "model": {"n_layers": 2, "d_model": 64, "n_heads": 4, "context": 32},
        "data": {"path": str(data_path)},
        "train": {
            "steps": 20,
            "global_batch": 16,
            "micro_batch": 8,
            "eval_interval": 0,
            "eval_batches": 2,
            "generate_chars": 0,
            "seed": 7,
        },
        "optim": {"lr": 3e-3, "warmup_steps": 5},
        "parallel": {"strategy": "auto", "device": "cpu", "timeout_s": 60},
        "precision": {"dtype": "fp32"},
        "metrics": {"progress": "off", "peak_tflops": 1.0},
    }
    for sec, body in sections.items():
        cfg.setdefault(sec, {}).update(body)
    return cfg


def tiny_cli_args(
    data: Path, steps: int, *extra: str, model: tuple[int, int, int] = (2, 64, 4), job: bool = True
) -> list[str]:
    """`disttrain run` arguments for a tiny GPT (``model`` = layers, width, heads; context 32) on ``data``.

    ``job`` adds the whole-job settings of tiny_config: batch 16 in micro-batches of 8, fp32, no evaluation
    and no sample, a metrics record every step. ``extra`` comes last (run folder, faults, overrides).
    """
    layers, width, heads = model
    args = [
        "run",
        "--data.path",
        str(data),
        "--model.n-layers",
        str(layers),
        "--model.d-model",
        str(width),
        "--model.n-heads",
        str(heads),
        "--model.context",
        "32",
        "--train.steps",
        str(steps),
    ]
    if job:
        args += [
            "--train.global-batch",
            "16",
            "--train.micro-batch",
            "8",
            "--train.eval-interval",
            "0",
            "--train.generate-chars",
            "0",
            "--precision.dtype",
            "fp32",
            "--metrics.log-interval",
            "1",
            "--metrics.peak-tflops",
            "1",
        ]
    return [*args, *extra]


def build_tiny_trainer(
    data: Path,
    *,
    seed: int | None = None,
    run_dir: Path | None = None,
    checkpoints: Path | None = None,
    **sections: dict[str, Any],
) -> Trainer:
    """A single-process fp32 Trainer on CPU for a 1-block GPT (width 32, 2 heads, context 32), batch 8.

    ``sections`` update the config's TOML sections; ``seed`` seeds both the data order and the model's
    initialisation (else the defaults of each); ``checkpoints`` is the folder of a CheckpointManager.
    """
    from disttrain.checkpoint import CheckpointManager
    from disttrain.config import from_dict
    from disttrain.data.text import load_text_data
    from disttrain.models.gpt import GPT, GPTConfig
    from disttrain.train.trainer import Trainer

    raw: dict[str, Any] = {
        "model": {"context": 32},
        "data": {"path": str(data)},
        "train": {"global_batch": 8, "micro_batch": 8, "eval_interval": 0},
        "parallel": {"strategy": "single", "device": "cpu"},
        "precision": {"dtype": "fp32"},
        "metrics": {"progress": "off", "peak_tflops": 1.0},
    }
    if seed is not None:
        raw["train"]["seed"] = seed
    for sec, body in sections.items():
        raw.setdefault(sec, {}).update(body)
    cfg = from_dict(raw)
    text = load_text_data(str(data), 32, 0.1)
    gpt = GPTConfig(text.tokenizer.vocab_size, n_layers=1, d_model=32, n_heads=2, context=32)
    model = GPT(gpt) if seed is None else GPT(gpt, seed=seed)
    ckpt = None if checkpoints is None else CheckpointManager(checkpoints, cfg.checkpoint)
    return Trainer(model, text.train, cfg, run_dir=run_dir, checkpoint=ckpt)
