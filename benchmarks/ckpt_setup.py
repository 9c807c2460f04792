"""The jobs of bench_checkpoint.py (and profile_save_cpu.py): their config and their Trainer."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from benchmarks import _common as C


def config(args: argparse.Namespace, world: int, big: bool, ckpt: dict[str, Any] | None = None) -> Any:
    """Parts 1-2 (``big``): the ``--big-*`` GPT, micro-batch 1; part 3: the ``--layers ...`` GPT."""
    from disttrain.config import from_dict

    if big:
        model = {"n_layers": args.big_layers, "d_model": args.big_width, "n_heads": 6, "context": args.big_context}
        micro = 1
    else:
        model = C.gpt_shape(args)
        micro = args.micro_batch
    return from_dict(
        {
            "model": model,
            "train": {
                "steps": 1,
                "global_batch": micro * world,
                "micro_batch": micro,
                "eval_interval": 0,
                "generate_chars": 0,
            },
            "parallel": {"device": "cpu"},
            "metrics": {"peak_tflops": 1.0, "progress": "off"},
            "checkpoint": {"resume": "never", "save_final": "none", **(ckpt or {})},
        }
    )


def make_trainer(cfg: Any, text: Any, env: Any, ckpt_folder: Path | None = None) -> Any:
    """A Trainer as a job builds it, with a CheckpointManager writing under ``ckpt_folder`` if given."""
    from disttrain.build import build_model
    from disttrain.checkpoint import CheckpointManager
    from disttrain.parallel.strategies import resolve_name
    from disttrain.train.trainer import Trainer

    strategy = resolve_name(cfg.parallel.strategy, env.world_size)
    manager = None
    if ckpt_folder is not None:
        manager = CheckpointManager(
            ckpt_folder, cfg.checkpoint, rank=env.rank, world_size=env.world_size, strategy=strategy
        )
    model = build_model(cfg, text.tokenizer.vocab_size, on_meta=strategy == "fsdp")
    return Trainer(model, text.train, cfg, env=env, checkpoint=manager)
