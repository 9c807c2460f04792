"""One training job from a resolved job: the worker side of ``disttrain run``.

The parent (``disttrain run``) validates the config, makes the run folder and writes ``config.toml`` and
``resolved.json`` (:class:`~disttrain.config.ResolvedJob`) there, then starts the workers; each worker runs
:func:`main` with that folder. Builds data and model, hands them to the :class:`Trainer`, then reports: final
validation loss vs the unigram baseline, and a few lines of generated text for text models.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import sys
import time
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from disttrain.build import build_data, build_for_training, build_model, vocab_size
from disttrain.checkpoint.layout import list_checkpoints
from disttrain.checkpoint.manager import CheckpointManager
from disttrain.checkpoint.pretrained import save_hf_config
from disttrain.config import JobConfig, ResolvedJob
from disttrain.data.text import TextData
from disttrain.data.tokenizer_folder import RUN_TOKENIZER, read_tokenizer_folder
from disttrain.errors import CheckpointError, ConfigError, HealthError, Preempted
from disttrain.health.events import attempt, health_dir, log_event, record_exit
from disttrain.health.peers import PEER_LOST_EXIT, learn_nodes, lost_peer, other_nodes
from disttrain.health.signals import STOPPING, install_stop_signals
from disttrain.launch.network import interface_of
from disttrain.models.gpt import GPT
from disttrain.parallel import strategies
from disttrain.parallel.env import DistEnv, destroy_distributed, init_distributed
from disttrain.testing.faults import install_if_requested
from disttrain.train.sample import can_sample, sample_ids
from disttrain.train.trainer import FitResult, Trainer
from disttrain.utils.process import exit_now, say_on_console

log = logging.getLogger("disttrain")


def setup_logging(run_dir: Path, rank: int) -> None:
    (run_dir / "logs").mkdir(parents=True, exist_ok=True)
    handler = logging.FileHandler(run_dir / "logs" / f"rank{rank}.log")
    handler.setFormatter(logging.Formatter("%(asctime)s rank" + str(rank) + " %(levelname)s %(message)s"))
    log.addHandler(handler)
    log.setLevel(logging.INFO)


def full_model_for_sampling(trainer: Trainer, cfg: JobConfig, vocab: int) -> nn.Module | None:
    """A plain, unsharded copy of the model on rank 0 (collective: every rank must call it)."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    dims = trainer.dims
    if not dims.fsdp_enabled and not dims.tp_enabled and not dims.pp_enabled:  # every rank holds the whole model
        return trainer.model.inner if trainer.env.is_main else None
    # (cpu_offload keeps the full tensors on global rank 0 only; each pipeline rank needs its stages' own)
    options = StateDictOptions(full_state_dict=True, cpu_offload=not dims.pp_enabled)
    sd = get_model_state_dict(trainer.model.module, options=options)
    if dims.pp_enabled:  # each stage's part, gathered along the pipeline (rank 0's holds the first stage)
        sd = {k: v.cpu() for k, v in sd.items() if isinstance(v, torch.Tensor)}
        parts: list[dict[str, torch.Tensor] | None] = [None] * dims.pp
        dist.all_gather_object(parts, sd, group=dims.pp_mesh(trainer.env.device.type).get_group())
        sd = {k: v for part in parts if part for k, v in part.items()}
    if not trainer.env.is_main:
        return None
    plain = build_model(cfg, vocab, on_meta=False)
    plain.load_state_dict(sd)
    return plain.to(trainer.env.device)


def build_trainer(job: ResolvedJob, env: DistEnv, run_dir: Path) -> tuple[Trainer, TextData | None]:
    """Data, model (on the meta device when it will be sharded), checkpoint manager and Trainer, all from the
    job the parent resolved (at this attempt's membership, for an elastic job)."""
    resolved = job.at_world(env.world_size, env.local_world_size)
    if resolved is not job:
        log.info("elastic membership %d x %d (planned %d x %d)", resolved.nnodes, resolved.nproc, job.nnodes, job.nproc)
    cfg = resolved.config
    train, val, text = build_data(cfg)
    # TP splits the parameters too, and a pipeline rank keeps only its stages' (each built on the meta device)
    shards = strategies.get(resolved.strategy).shards_parameters or cfg.parallel.tp > 1 or cfg.parallel.pp > 1
    model = build_for_training(cfg, vocab_size(train, text), shards, env.local_world_size)
    if env.is_main:
        save_hf_config(model, run_dir)  # what `ckpt export --format hf` writes beside the weights
    ckpt = CheckpointManager(
        checkpoints_folder_of(cfg, run_dir),
        cfg.checkpoint,
        rank=env.rank,
        world_size=env.world_size,
        strategy=resolved.strategy,
    )
    trainer = Trainer(model, train, cfg, val_data=val, run_dir=run_dir, env=env, checkpoint=ckpt, job=resolved)
    return trainer, text


def save_seed(trainer: Trainer) -> int:
    """``checkpoint.create_seed``: save the initialised state as step 0 and stop."""
    ckpt = trainer.checkpoint
    assert ckpt is not None
    ckpt.save(0, trainer.state())
    ckpt.close()
    if trainer.env.is_main:
        print(f"seed checkpoint: {ckpt.folder / 'step-00000000'}", flush=True)
    return 0


def summarize(trainer: Trainer, result: FitResult, text: TextData | None, wall_s: float) -> dict[str, Any]:
    summary: dict[str, Any] = {
        "steps": trainer.step,
        "strategy": trainer.dims.strategy,
        "world_size": trainer.env.world_size,
        "final_loss": result.losses[-1],
        "final_val_loss": result.val_losses.get(trainer.step),
        "skipped_steps": result.skipped_steps,
        "tokens_per_s": result.tokens_per_s,
        "mfu": result.mfu,
        "peak_memory_bytes": result.peak_memory_bytes,
        "wall_s": wall_s,
    }
    if text is not None:
        summary["unigram_val_loss"] = text.unigram_loss()
    return summary


def sample_text(trainer: Trainer, cfg: JobConfig, text: TextData | None, run_dir: Path) -> str:
    """A few generated characters from the trained model, decoded by the run's tokenizer (``RUN/tokenizer``:
    the built-in GPT or a Hugging Face model) or the bundled character one (the built-in GPT); collective, ''
    elsewhere."""
    n = cfg.train.generate_chars
    tok = read_tokenizer_folder(run_dir / RUN_TOKENIZER) if text is None and n > 0 else None
    model = trainer.model.inner
    if n <= 0 or not (isinstance(model, GPT) if text is not None else tok is not None and can_sample(model)):
        return ""
    vocab = text.tokenizer.vocab_size if text is not None else tok.vocab_size  # type: ignore[union-attr]
    plain = full_model_for_sampling(trainer, cfg, vocab)
    if plain is None:
        return ""
    if text is not None:
        return text.tokenizer.decode(sample_from(trainer, plain, text.tokenizer.encode("\n"), cfg))
    assert tok is not None
    start = torch.tensor([tok.eot_id if tok.bos_id is None else tok.bos_id])  # a document's start
    try:
        ids = sample_from(trainer, plain, start, cfg)
        # an embedding padded beyond the tokenizer's ids can sample ids it has no text for
        return tok.decode([i for i in ids if i < tok.vocab_size])[:n]
    except Exception as e:  # a model of the user's that cannot generate: the training is done, say so and go on
        msg = f"no sample ({type(e).__name__}: {str(e)[:200]}); --train.generate-chars 0 skips it"
        log.warning(msg)
        say_on_console(f"disttrain: warning: {msg}")
        return ""


def sample_from(trainer: Trainer, plain: nn.Module, start: torch.Tensor, cfg: JobConfig) -> list[int]:
    """``train.generate_chars`` token ids sampled after the one token ``start``, under the run's autocast."""
    with trainer.model.autocast():
        prompt = start.view(1, 1).to(trainer.env.device)
        return sample_ids(plain, prompt, cfg.train.generate_chars, cfg.model.context, cfg.train.seed)


def report(run_dir: Path, summary: dict[str, Any], sample: str, has_text: bool) -> None:
    """Rank 0: write ``summary.json`` (and ``sample.txt``) and print the closing lines."""
    (run_dir / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    val = summary["final_val_loss"]  # None when no evaluation ran (no validation data, or too little)
    lines = [
        f"done: {summary['steps']} steps in {summary['wall_s']:.0f}s | final val loss "
        + ("n/a (no evaluation ran)" if val is None else f"{val:.4f}")
        + (f" (unigram baseline {summary['unigram_val_loss']:.4f})" if has_text else "")
        + f" | skipped steps {summary['skipped_steps']}"
    ]
    if sample:
        (run_dir / "sample.txt").write_text(sample)
        lines += ["--- sample ---", sample, "--------------"]
    lines.append(f"run folder: {run_dir}")
    for line in lines:
        print(line, flush=True)
        log.info(line)


def train_job(job: ResolvedJob, env: DistEnv, run_dir: Path) -> int:
    t_start = time.time()
    cfg = job.config
    trainer, text = build_trainer(job, env, run_dir)
    if cfg.checkpoint.create_seed:
        return save_seed(trainer)
    result = trainer.fit()
    summary = summarize(trainer, result, text, time.time() - t_start)
    sample = sample_text(trainer, cfg, text, run_dir)
    if env.is_main:
        report(run_dir, summary, sample, text is not None)
    return 0


def checkpoints_folder_of(cfg: JobConfig, run_dir: Path) -> Path:
    folder = Path(cfg.checkpoint.folder)
    return folder if folder.is_absolute() else run_dir / folder


def peer_lost(cfg: JobConfig, env: DistEnv, run_dir: Path, addr: str, what: str) -> int:
    """One line per node (from its first rank to notice) instead of a traceback per rank: who was lost, what
    happens next."""
    usable = [c for c in list_checkpoints(checkpoints_folder_of(cfg, run_dir)) if c.usable]
    newest = f"the newest checkpoint is step {usable[-1].step}" if usable else "no checkpoint yet"
    left = int(os.environ.get("TORCHELASTIC_MAX_RESTARTS", "0")) - attempt()
    if left > 0:  # torchrun restarts the ranks: a new rendezvous round, then a resume
        nodes = "with the nodes that are left" if ":" in cfg.launch.nnodes else "once every node is back"
        start = f"step {usable[-1].step}" if usable else "the start (no checkpoint yet)"
        then = f"restarting ({left} restart(s) left), resuming {nodes} from {start}"
    else:
        then = f"this node stops ({newest}; start the job on every node again to resume)"
    msg = f"lost contact with {addr} ({what}): a node of this job went away or its link is down; {then}"
    record_exit(run_dir, env.rank, msg)
    log_event(run_dir, "peer_lost", rank=env.rank, peer=addr, cause=what)
    with contextlib.suppress(FileExistsError):  # else another rank of this node said it already
        node_marker(run_dir).touch(exist_ok=False)
        say_on_console(f"disttrain: rank {env.rank}: {msg}")
    return stop_now(env, PEER_LOST_EXIT)


def node_marker(run_dir: Path) -> Path:
    """Made by the first rank of this node (torchrun's GROUP_RANK) that lost a peer, in this attempt."""
    return health_dir(run_dir) / f"peer-lost-attempt{attempt()}-node{os.environ.get('GROUP_RANK', '0')}"


def stop_now(env: DistEnv, code: int) -> int:
    """Leave at once on a stop signal: no process-group teardown, which can wait on a peer that is itself
    stuck in a collective (its Python signal handler runs only when that returns); in-process (one rank,
    no torchrun) the caller prints the line, so just return."""
    if env.world_size > 1:
        exit_now(code)
    return code


def broken_collective(e: RuntimeError, cfg: JobConfig, env: DistEnv, run_dir: Path) -> int:
    """A RuntimeError out of training: a stop signal's broken collective, a lost peer, or a real error
    (re-raised for torchrun to report)."""
    if STOPPING:  # a collective broken by the other ranks stopping on the same signal
        record_exit(run_dir, env.rank, f"stopped by signal {STOPPING[0]}")
        return stop_now(env, 128 + STOPPING[0])
    lost = lost_peer(e)
    # a rank of this node that died is torchrun's to report, unless this node already lost another node
    local = lost is not None and interface_of(lost[0]) is not None
    if lost is None or (local and not node_marker(run_dir).exists()):
        record_exit(run_dir, env.rank, f"{type(e).__name__}: {e}"[:500])
        raise e
    return peer_lost(cfg, env, run_dir, other_nodes() if local or lost[0] == "a peer" else lost[0], lost[1])


def main(run_dir: str | Path) -> int:
    """Run the job in ``run_dir``; exit codes: 0 done, 2 a mistake in the job, 3 stopped on purpose."""
    run_dir = Path(run_dir)
    install_stop_signals()
    job = ResolvedJob.read(run_dir)
    cfg = job.config
    # long collective timeout for the start-up; the Trainer sets parallel.timeout_s after the first step
    env = init_distributed(cfg.parallel.device, max(cfg.parallel.timeout_s, cfg.health.startup_timeout_s))
    setup_logging(run_dir, env.rank)
    try:
        install_if_requested()  # tests: faults on purpose, on the engines' hook points
        learn_nodes()
        return train_job(job, env, run_dir)
    except (ConfigError, CheckpointError) as e:
        if env.is_main:
            print(f"disttrain: error: {e}", file=sys.stderr, flush=True)
        return 2
    except HealthError as e:
        record_exit(run_dir, env.rank, f"stopped: {e}")
        if env.is_main:
            print(f"disttrain: stopped: {e}", file=sys.stderr, flush=True)
        return 3
    except KeyboardInterrupt:  # Ctrl-C (torchrun passes the SIGINT on to every worker)
        record_exit(run_dir, env.rank, "interrupted (Ctrl-C)")
        return stop_now(env, 130)
    except Preempted as e:  # SIGTERM / SIGUSR1: every rank saved the same step; the launcher says the line
        record_exit(run_dir, env.rank, str(e))
        return stop_now(env, 128 + e.signum)
    except RuntimeError as e:
        return broken_collective(e, cfg, env, run_dir)
    except BaseException as e:  # noted for the restart log, then torchrun sees the failure
        record_exit(run_dir, env.rank, f"{type(e).__name__}: {e}"[:500])
        raise
    finally:
        destroy_distributed()


def entry(argv: list[str]) -> int:
    """``python -m disttrain.jobs.run_worker RUN_DIR``: one rank of the job, its exit code."""
    try:
        return main(argv[0])
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    exit_now(entry(sys.argv[1:]))
