"""One training job from a resolved config: the worker side of ``disttrain run``.

The parent (``disttrain run``) validates the config, makes the run folder and writes ``config.toml``
there, then starts the workers; each worker runs :func:`main` with that folder. Builds data and model,
hands them to the :class:`Trainer`, then reports: final validation loss vs the unigram baseline, and a
few lines of generated text for text models.
"""

from __future__ import annotations

import importlib
import json
import logging
import os
import signal
import sys
import time
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.utils.data import Dataset

from disttrain.checkpoint import CheckpointError, CheckpointManager
from disttrain.config import ConfigError, JobConfig, MetaDeviceError, load_toml
from disttrain.data.text import TextData, load_text_data
from disttrain.dist.env import destroy_distributed, init_distributed
from disttrain.dist.mesh import SHARDED
from disttrain.dist.strategy import resolve_strategy
from disttrain.health import HealthError, Terminated, raise_on_sigterm, record_exit
from disttrain.models.gpt import GPT, GPTConfig
from disttrain.train.trainer import Trainer

log = logging.getLogger("disttrain")


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


def setup_logging(run_dir: Path, rank: int) -> None:
    (run_dir / "logs").mkdir(parents=True, exist_ok=True)
    handler = logging.FileHandler(run_dir / "logs" / f"rank{rank}.log")
    handler.setFormatter(logging.Formatter("%(asctime)s rank" + str(rank) + " %(levelname)s %(message)s"))
    log.addHandler(handler)
    log.setLevel(logging.INFO)


def full_model_for_sampling(trainer: Trainer, cfg: JobConfig, vocab: int) -> nn.Module | None:
    """A plain, unsharded copy of the model on rank 0 (collective: every rank must call it)."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    if not trainer.dims.fsdp_enabled:
        return trainer.model.inner if trainer.env.is_main else None
    sd = get_model_state_dict(trainer.model.module, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    if not trainer.env.is_main:
        return None
    plain = build_model(cfg, vocab, on_meta=False)
    plain.load_state_dict(sd)
    return plain.to(trainer.env.device)


def main(run_dir: str | Path) -> int:
    run_dir = Path(run_dir)
    raise_on_sigterm()
    cfg = load_toml(run_dir / "config.toml")
    # long collective timeout for the start-up; the Trainer sets parallel.timeout_s after the first step
    env = init_distributed(cfg.parallel.device, max(cfg.parallel.timeout_s, cfg.health.startup_timeout_s))
    setup_logging(run_dir, env.rank)
    t_start = time.time()
    try:
        train, val, text = build_data(cfg)
        vocab = text.tokenizer.vocab_size if text else getattr(train, "vocab_size", None)
        strategy = resolve_strategy(cfg.parallel.strategy, env.world_size)
        model = build_model(cfg, vocab, on_meta=strategy in SHARDED)
        ckpt_dir = Path(cfg.checkpoint.folder)
        ckpt = CheckpointManager(
            ckpt_dir if ckpt_dir.is_absolute() else run_dir / ckpt_dir,
            cfg.checkpoint,
            rank=env.rank,
            world_size=env.world_size,
            strategy=strategy,
        )
        trainer = Trainer(model, train, cfg, val_data=val, run_dir=run_dir, env=env, checkpoint=ckpt)
        if cfg.checkpoint.create_seed:
            ckpt.save(0, trainer.state())
            ckpt.close()
            if env.is_main:
                print(f"seed checkpoint: {ckpt.folder / 'step-00000000'}", flush=True)
            return 0
        result = trainer.fit()
        summary: dict[str, Any] = {
            "steps": trainer.step,
            "strategy": trainer.dims.strategy,
            "world_size": env.world_size,
            "final_loss": result.losses[-1],
            "final_val_loss": result.val_losses.get(trainer.step),
            "skipped_steps": result.skipped_steps,
            "tokens_per_s": result.tokens_per_s,
            "mfu": result.mfu,
            "peak_memory_bytes": result.peak_memory_bytes,
            "wall_s": time.time() - t_start,
        }
        if text is not None:
            summary["unigram_val_loss"] = text.unigram_loss()
        sample = ""
        if text is not None and cfg.train.generate_chars > 0 and isinstance(model, GPT):
            plain = full_model_for_sampling(trainer, cfg, text.tokenizer.vocab_size)
            if plain is not None:
                assert isinstance(plain, GPT)
                prompt = text.tokenizer.encode("\n").view(1, 1).to(env.device)
                with trainer.model.autocast():
                    out = plain.generate(prompt, cfg.train.generate_chars, seed=cfg.train.seed)
                sample = text.tokenizer.decode(out[0, 1:].tolist())
        if env.is_main:
            (run_dir / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
            lines = [
                f"done: {trainer.step} steps in {summary['wall_s']:.0f}s | final val loss "
                f"{summary['final_val_loss']:.4f}"
                + (f" (unigram baseline {summary['unigram_val_loss']:.4f})" if text is not None else "")
                + f" | skipped steps {result.skipped_steps}"
            ]
            if sample:
                (run_dir / "sample.txt").write_text(sample)
                lines += ["--- sample ---", sample, "--------------"]
            lines.append(f"run folder: {run_dir}")
            for line in lines:
                print(line, flush=True)
                log.info(line)
        return 0
    except (ConfigError, CheckpointError) as e:
        if env.is_main:
            print(f"disttrain: error: {e}", file=sys.stderr, flush=True)
        return 2
    except HealthError as e:
        record_exit(run_dir, env.rank, f"stopped: {e}")
        if env.is_main:
            print(f"disttrain: stopped: {e}", file=sys.stderr, flush=True)
        return 3
    except Terminated as e:  # torchrun stopping this rank because another one failed: a note, no traceback
        record_exit(run_dir, env.rank, str(e))
        return 128 + signal.SIGTERM
    except BaseException as e:  # noted for the restart log, then torchrun sees the failure
        record_exit(run_dir, env.rank, f"{type(e).__name__}: {e}"[:500])
        raise
    finally:
        destroy_distributed()


if __name__ == "__main__":
    code = main(sys.argv[1])
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)  # skip interpreter teardown: torch's gloo/DDP destructors can deadlock there
