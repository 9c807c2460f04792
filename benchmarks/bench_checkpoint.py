"""Checkpointing cost: training-loop time blocked per save, save/load throughput against the disk, step-time
overhead of periodic async saves.

One launch of ``--nproc`` ranks (gloo, one thread each; default 2, the real setting), strategy ``auto``
(DDP for 2 ranks), checkpoints written under a fresh folder in /tmp (the script prints its disk). Variants
are interleaved round by round (order rotating, ``_common.interleave``); every figure is a median over
rounds of a ratio taken inside one round, on the slowest rank. Three parts:

1. **Blocked time per save.** A GPT of 17.9M parameters (10 blocks, width 384) after one AdamW step:
   params + both Adam moments in fp32, 216 MB of checkpoint per save. ``CheckpointManager.save`` with
   ``async_mode`` off / thread / process; ``blocked_s`` is what ``save()`` costs the training thread.
   Ratio = async blocked / sync save time of the same round. Goal <= 0.10. Diagnostic rows: ``dcp.save``
   without the manager, rank 0's CRC32 pass over the files at commit, and the staging copy (state dict +
   copy, as DCP does it per save, and with one stager kept across saves so its buffers are reused).
2. **Throughput.** Checkpoint bytes / sync save time, and bytes / ``CheckpointManager.load`` time (into
   the live trainer state, from a cold page cache: ``posix_fadvise(DONTNEED)`` on every file first; also
   warm), against plain Python in the same rounds: write + ``fsync`` the same bytes (each rank its share,
   concurrently, or rank 0 one file) and read them back cold. Ratio = checkpoint speed / speed of the
   faster plain variant of the same round. Goal >= 0.50.
3. **Step-time overhead.** The real ``Trainer.fit()`` on a small GPT (2 x 128, context 256, micro-batch
   8: 4096 tokens per step like the default job) with a ``CheckpointManager`` (async thread, a save every
   50 steps) and without one. Blocks of 50 steps alternate; blocks start half-way between two saves, so
   each checkpointed block holds one save and ends waiting for it (begun 25 steps earlier) to commit, as the
   manager's ``close()`` at the end of ``fit()`` would, minus releasing the stager's buffers and thread,
   which a real job does once, at its end. Overhead = t_ckpt_block / t_plain_block - 1. Goal <= 0.02.

    .venv/bin/python benchmarks/bench_checkpoint.py [--rounds 5] [--step-rounds 8] [--skip-saves|--skip-steps]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import zlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

import _common as C

GOAL_BLOCKED = 0.10
GOAL_THROUGHPUT = 0.50
GOAL_OVERHEAD = 0.02
MB = 1e6


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--nproc", type=int, default=2)
    p.add_argument("--rounds", type=int, default=5, help="timed rounds of parts 1-2 (one save per variant)")
    p.add_argument("--big-layers", type=int, default=10)
    p.add_argument("--big-width", type=int, default=384)
    p.add_argument("--big-context", type=int, default=256)
    p.add_argument("--step-rounds", type=int, default=6, help="timed rounds of part 3 (one block per variant)")
    p.add_argument("--interval", type=int, default=50, help="part 3: save every N steps")
    p.add_argument("--saves-per-block", type=int, default=1, help="part 3: block = this x interval steps")
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--width", type=int, default=128)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--context", type=int, default=256)
    p.add_argument("--micro-batch", type=int, default=8)
    p.add_argument("--skip-saves", action="store_true", help="skip parts 1-2")
    p.add_argument("--skip-steps", action="store_true", help="skip part 3")
    p.add_argument("--root", default=None, help="checkpoint folder (default: a fresh one in /tmp)")
    p.add_argument("--out", default=None, help=argparse.SUPPRESS)  # set for the workers
    return p.parse_args(argv)


# -- files --------------------------------------------------------------------------------------------
def drop_cache(paths: list[Path]) -> None:
    """Evict these (fsynced, clean) files from the page cache, so the next read comes from the disk."""
    for p in paths:
        fd = os.open(p, os.O_RDONLY)
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def files_under(folder: Path) -> list[Path]:
    return sorted(p for p in folder.rglob("*") if p.is_file())


def write_fsync(path: Path, data: Any) -> None:
    with open(path, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())


def read_all(path: Path, buf: Any) -> int:
    with open(path, "rb", buffering=0) as f:
        return f.readinto(buf)


def crc32_folder(folder: Path) -> None:
    for p in files_under(folder):
        crc, chunk = 0, 1 << 22
        with open(p, "rb") as f:
            while block := f.read(chunk):
                crc = zlib.crc32(block, crc)


# -- workers ------------------------------------------------------------------------------------------
def config(args: argparse.Namespace, world: int, big: bool, ckpt: dict[str, Any] | None = None) -> Any:
    from disttrain.config import from_dict

    if big:
        model = {"n_layers": args.big_layers, "d_model": args.big_width, "n_heads": 6, "context": args.big_context}
        micro = 1
    else:
        model = {"n_layers": args.layers, "d_model": args.width, "n_heads": args.heads, "context": args.context}
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
    from disttrain.build import build_model
    from disttrain.checkpoint import CheckpointManager
    from disttrain.dist.mesh import resolve_strategy
    from disttrain.train.trainer import Trainer

    strategy = resolve_strategy(cfg.parallel.strategy, env.world_size)
    manager = None
    if ckpt_folder is not None:
        manager = CheckpointManager(
            ckpt_folder, cfg.checkpoint, rank=env.rank, world_size=env.world_size, strategy=strategy
        )
    model = build_model(cfg, text.tokenizer.vocab_size, on_meta=strategy == "fsdp")
    return Trainer(model, text.train, cfg, env=env, checkpoint=manager)


def rounds_of(
    variants: dict[str, Callable[[], dict[str, float]]], rounds: int, warmup: int
) -> dict[str, list[dict[str, float]]]:
    """Each variant once per round (order rotating), after ``warmup`` untimed calls of each; every call
    returns its own timings (this rank's), which are collected per round."""
    recorded: dict[str, list[dict[str, float]]] = {n: [] for n in variants}

    def runner(name: str) -> Callable[[int], None]:
        def run(n: int) -> None:
            for _ in range(n):
                recorded[name].append(variants[name]())

        return run

    C.interleave(
        {n: runner(n) for n in variants}, steps_per_block=1, rounds=rounds, warmup=warmup, before_block=dist.barrier
    )
    return {n: r[warmup:] for n, r in recorded.items()}


def part_saves(args: argparse.Namespace, text: Any, env: Any, root: Path) -> dict[str, Any]:
    """Parts 1 and 2: ~212 MB of state saved sync / thread / process, loaded, vs plain writes and reads."""
    from disttrain.checkpoint import CheckpointManager

    rank, world = env.rank, env.world_size
    trainer = make_trainer(config(args, world, big=True), text, env)
    trainer.train_step()  # AdamW's moments exist from the first step on
    n_params = sum(p.numel() for p in trainer.model.module.parameters())
    managers = {
        mode: CheckpointManager(
            root / mode,
            config(args, world, True, {"async_mode": mode}).checkpoint,
            rank=rank,
            world_size=world,
            strategy=trainer.dims.strategy,
        )
        for mode in ("off", "thread", "process")
    }
    counter = [0]

    def save(mode: str) -> dict[str, float]:
        """One save; async: then one training step, as the Trainer runs it (its optimizer step waits for the
        background copy of the state: ``wait_for_staging``), then wait until written and committed."""
        m = managers[mode]
        counter[0] += 1
        t0 = time.perf_counter()
        m.save(counter[0], trainer.state())
        blocked = m.blocked_s[-1]
        out = {"blocked_s": blocked}
        if mode != "off":
            waits = len(m.staging_wait_s)
            trainer.checkpoint = m
            t1 = time.perf_counter()
            trainer.train_step()
            out["step_s"] = time.perf_counter() - t1
            trainer.checkpoint = None
            out["staging_wait_s"] = sum(m.staging_wait_s[waits:])
        m.wait()  # async: until written and committed (rank 0 commits)
        out["total_s"] = time.perf_counter() - t0
        dist.barrier()
        if m._purger is not None:  # the keep-k purge runs in the background: not into the next variant
            m._purger.join()
        if mode == "off" and rank == 0:  # what rank 0's commit spends on CRC32s (files still cached)
            t1 = time.perf_counter()
            crc32_folder(root / mode / f"step-{counter[0]:08d}")
            out["crc32_s"] = time.perf_counter() - t1
        dist.barrier()
        return out

    # One untimed sync save: the sizes of what each rank writes, for the plain-Python baseline.
    save("off")
    newest = root / "off" / f"step-{counter[0]:08d}"
    sizes = {str(p.relative_to(newest)): p.stat().st_size for p in files_under(newest)}
    total_bytes = sum(sizes.values())
    share = sizes.get(f"__{rank}_0.distcp", 0)
    plain_dir = root / "plain"
    if rank == 0:
        plain_dir.mkdir(parents=True, exist_ok=True)
    dist.barrier()
    gen = torch.Generator().manual_seed(rank)
    data = torch.randint(0, 256, (max(share, total_bytes),), dtype=torch.uint8, generator=gen)
    buf = data.numpy()
    mine = plain_dir / f"rank{rank}.bin"
    whole = plain_dir / "whole.bin"

    def plain_write_shares() -> dict[str, float]:
        t0 = time.perf_counter()
        write_fsync(mine, buf[:share])
        dt = time.perf_counter() - t0
        dist.barrier()
        return {"total_s": dt}

    fresh_files: list[Path] = []

    def plain_write_new_file() -> dict[str, float]:
        """Each rank its share to a new file each time, the one before last deleted (like keep_latest=2):
        buffered writes into page-cache pages the guest may not have touched lately (see docs)."""
        path = plain_dir / f"rank{rank}-{len(fresh_files)}.bin"
        t0 = time.perf_counter()
        write_fsync(path, buf[:share])
        dt = time.perf_counter() - t0
        fresh_files.append(path)
        if len(fresh_files) > 2:
            fresh_files[-3].unlink()
        dist.barrier()
        return {"total_s": dt}

    def plain_write_whole() -> dict[str, float]:
        dt = 0.0
        if rank == 0:
            t0 = time.perf_counter()
            write_fsync(whole, buf[:total_bytes])
            dt = time.perf_counter() - t0
        dist.barrier()
        return {"total_s": dt}

    def plain_read(which: str) -> Callable[[], dict[str, float]]:
        """Read back cold: each rank its share; rank 0 the one whole file; every rank the whole file."""
        path, size = (mine, share) if which == "shares" else (whole, total_bytes)
        reads = which != "one" or rank == 0

        def run() -> dict[str, float]:
            if which == "shares" or rank == 0:
                drop_cache([path])
            dist.barrier()
            dt = 0.0
            if reads:
                t0 = time.perf_counter()
                got = read_all(path, buf[:size])
                dt = time.perf_counter() - t0
                assert got == size, (got, size)
            dist.barrier()
            return {"total_s": dt}

        return run

    def load(cold: bool) -> Callable[[], dict[str, float]]:
        def run() -> dict[str, float]:
            m = managers["off"]
            info = m.latest()
            assert info is not None
            if rank == 0:
                drop_cache(files_under(info.path)) if cold else [p.read_bytes() for p in files_under(info.path)]
            dist.barrier()
            t0 = time.perf_counter()
            m.load(trainer.state(), info)
            dt = time.perf_counter() - t0
            dist.barrier()
            return {"total_s": dt}

        return run

    def train_step() -> dict[str, float]:
        """A training step with no save around it: what the step after an async save is compared with."""
        t0 = time.perf_counter()
        trainer.train_step()
        dt = time.perf_counter() - t0
        dist.barrier()
        return {"total_s": dt}

    def load_dcp_reader() -> dict[str, float]:
        """DCP's own FileSystemReader (torch.load per tensor), cold: what the manager's reader replaces."""
        import torch.distributed.checkpoint as dcp
        from torch.distributed.checkpoint import FileSystemReader

        info = managers["off"].latest()
        assert info is not None
        if rank == 0:
            drop_cache(files_under(info.path))
        dist.barrier()
        t0 = time.perf_counter()
        dcp.load(trainer.state(), storage_reader=FileSystemReader(info.path))
        dt = time.perf_counter() - t0
        dist.barrier()
        return {"total_s": dt}

    def raw_dcp_save() -> dict[str, float]:
        import torch.distributed.checkpoint as dcp

        counter[0] += 1
        t0 = time.perf_counter()
        dcp.save(trainer.state(), checkpoint_id=root / "raw" / f"{counter[0]}")
        dt = time.perf_counter() - t0
        dist.barrier()
        if rank == 0:
            shutil.rmtree(root / "raw" / f"{counter[0]}", ignore_errors=True)
        dist.barrier()
        return {"total_s": dt}

    from torch.distributed.checkpoint.staging import DefaultStager, StagingOptions
    from torch.distributed.checkpoint.state_dict_saver import _stateful_to_state_dict

    kept = DefaultStager(StagingOptions(False, False, False, False))

    def stage(reuse: bool) -> Callable[[], dict[str, float]]:
        """What async_save's staging costs the loop: DCP's default (a stager, so fresh buffers, per save)
        vs one stager kept across saves (its storage cache reuses the buffers)."""

        def run() -> dict[str, float]:
            t0 = time.perf_counter()
            sd = _stateful_to_state_dict(trainer.state())
            stager = kept if reuse else DefaultStager(StagingOptions(False, False, False, False))
            staged = stager.stage(sd)
            if not reuse:
                stager.close()
            dt = time.perf_counter() - t0
            del staged
            dist.barrier()
            return {"total_s": dt}

        return run

    variants: dict[str, Callable[[], dict[str, float]]] = {
        "save off": lambda: save("off"),
        "save thread": lambda: save("thread"),
        "save process": lambda: save("process"),
        "dcp.save (no manager)": raw_dcp_save,
        "staging, fresh buffers": stage(reuse=False),
        "staging, reused buffers": stage(reuse=True),
        "plain write (per rank)": plain_write_shares,
        "plain write (1 file)": plain_write_whole,
        "plain write (per rank, new file)": plain_write_new_file,
        "load (cold)": load(cold=True),
        "load, DCP's reader (cold)": load_dcp_reader,
        "train step": train_step,
        "plain read (per rank)": plain_read("shares"),
        "plain read (1 file)": plain_read("one"),
        "plain read (every rank all)": plain_read("all"),
        "load (warm)": load(cold=False),
    }
    results = rounds_of(variants, args.rounds, warmup=1)
    for m in managers.values():
        m.close()
    return {
        "params": n_params,
        "strategy": trainer.dims.strategy,
        "checkpoint_bytes": total_bytes,
        "file_sizes": sizes,
        "share_bytes": share,
        "rounds": results,
    }


def part_steps(args: argparse.Namespace, text: Any, env: Any, root: Path) -> dict[str, Any]:
    """Part 3: Trainer.fit() with async saves every ``interval`` steps vs without checkpoints.

    One Trainer for both variants (two instances differ by a few % in speed by themselves: memory
    placement); a variant's block sets ``trainer.checkpoint`` to the manager or to None, and each
    block's ``fit()`` runs ``block`` more steps.
    """
    from disttrain.utils.gc import GarbageCollection

    world = env.world_size
    cfg = config(args, world, False, {"async_mode": "thread", "interval": args.interval})
    trainer = make_trainer(cfg, text, env, root / "steps")
    manager = trainer.checkpoint
    assert manager is not None

    def wait_only() -> None:
        """What a block's end costs: the save written and committed, the purge done. ``fit()`` ends with
        ``close()``, which also releases the stager's buffers and thread; a real job does that once, at its
        very end, so re-creating them every block would charge each save a job-start cost."""
        manager.wait()
        if manager._purger is not None:
            manager._purger.join()

    manager.close = wait_only  # type: ignore[method-assign]
    blocked_per_block: list[float] = []
    cpu_s: dict[bool, list[float]] = {False: [], True: []}

    def run(with_ckpt: bool) -> Callable[[int], None]:
        def go(n: int) -> None:
            trainer.checkpoint = manager if with_ckpt else None
            trainer.cfg.train.steps = trainer.step + n  # fit() runs until this step
            before = len(manager.blocked_s)
            c0 = time.process_time()  # this rank's CPU time, all its threads (the background save's too)
            trainer.fit()
            cpu_s[with_ckpt].append(time.process_time() - c0)
            if with_ckpt:
                blocked_per_block.append(sum(manager.blocked_s[before:]))

        return go

    block = args.interval * args.saves_per_block
    # Untimed: half an interval, then a warm-up block of one interval per variant (the first save in it),
    # so every timed block starts half-way between two saves and holds saves_per_block of them.
    # One job-wide GC context, as one fit() of a real job has: each block's fit() then only runs the
    # scheduled collections, not the entry collection of everything (~100 ms) per block.
    with GarbageCollection(cfg.train.gc_interval):
        run(False)(args.interval // 2)
        times = C.interleave(
            {"no checkpoint": run(False), f"async thread every {args.interval}": run(True)},
            steps_per_block=block,
            rounds=args.step_rounds,
            warmup=args.interval,
            before_block=dist.barrier,
        )
    del manager.close  # the real close(), once
    manager.close()
    return {
        "params": sum(p.numel() for p in trainer.model.module.parameters()),
        "block_steps": block,
        "times_s_per_step": times,
        "blocked_s_per_block": blocked_per_block[1:],  # the first is the warm-up block's
        "cpu_s_per_block": {k: cpu_s[v][-args.step_rounds :] for k, v in zip(times, (False, True), strict=True)},
        "saves_timed": len(manager.blocked_s) - 1,
        "failures": manager.failures,
    }


def worker(args: argparse.Namespace) -> None:
    C.one_thread()
    from disttrain.data.text import load_text_data
    from disttrain.dist.env import init_distributed

    env = init_distributed("cpu", threads=1)
    root = Path(args.root)
    out: dict[str, Any] = {}
    if not args.skip_saves:
        text = load_text_data(None, args.big_context, 0.1)
        out["saves"] = part_saves(args, text, env, root)
    if not args.skip_steps:
        text = load_text_data(None, args.context, 0.1)
        out["steps"] = part_steps(args, text, env, root)
    C.write_rank_result(args.out, env.rank, out)
    C.finish_worker()


# -- report -------------------------------------------------------------------------------------------
def mount_of(path: Path) -> str:
    """'device (fstype) on mountpoint' for the file system holding ``path``."""
    best = ("?", "?", "/")
    for line in Path("/proc/mounts").read_text().splitlines():
        dev, mnt, fstype = line.split()[:3]
        inside = str(path.resolve()).startswith(mnt.rstrip("/") + "/") or str(path.resolve()) == mnt
        if inside and len(mnt) >= len(best[2]):
            best = (dev, fstype, mnt)
    return f"{best[0]} ({best[1]}) on {best[2]}"


def slowest(ranks: list[dict[str, Any]], name: str, *keys: str) -> list[float]:
    """Per round, the largest value over ranks (the slowest rank sets the pace) of the sum of ``keys``."""
    per_rank = [r["saves"]["rounds"][name] for r in ranks]
    return [max(sum(rr[i].get(k, 0.0) for k in keys) for rr in per_rank) for i in range(len(per_rank[0]))]


def report_saves(ranks: list[dict[str, Any]], args: argparse.Namespace) -> dict[str, Any]:
    s0 = ranks[0]["saves"]
    nbytes = s0["checkpoint_bytes"]
    sync = slowest(ranks, "save off", "blocked_s")
    figures: dict[str, Any] = {
        "params": s0["params"],
        "strategy": s0["strategy"],
        "checkpoint_bytes": nbytes,
        "file_sizes": s0["file_sizes"],
    }
    rows = []
    ms = C.median(sync) * 1e3
    rows.append(["sync save (async_mode=off)", ms, C.median(sync) * 1e3, 1.0, "", ""])
    plain_step = slowest(ranks, "train step", "total_s")
    for mode in ("thread", "process"):
        name = f"save {mode}"
        blocked = slowest(ranks, name, "blocked_s", "staging_wait_s")  # save() + wait before the optimizer step
        in_save = slowest(ranks, name, "blocked_s")
        waited = slowest(ranks, name, "staging_wait_s")
        step = slowest(ranks, name, "step_s")
        total = slowest(ranks, name, "total_s")
        ratio = C.paired_ratio(blocked, sync)
        lo, hi = C.spread([b / s for b, s in zip(blocked, sync, strict=True)])
        # the copy runs on another thread of the same rank: on 2 cores for 2 ranks it takes CPU from the step
        slowed = [a - w - p for a, w, p in zip(step, waited, plain_step, strict=True)]  # the wait is counted above
        figures[f"blocked_over_sync_{mode}"] = {
            "ratio": ratio,
            "iqr": [lo, hi],
            "blocked_ms_median": C.median(blocked) * 1e3,
            "in_save_ms_median": C.median(in_save) * 1e3,
            "staging_wait_ms_median": C.median(waited) * 1e3,
            "step_after_save_minus_plain_step_ms_median": C.median(slowed) * 1e3,
            "step_after_save_minus_plain_step_over_sync": C.paired_ratio(slowed, sync),
            "until_committed_ms_median": C.median(total) * 1e3,
            "goal": GOAL_BLOCKED,
            "verdict": C.verdict(ratio, GOAL_BLOCKED, higher_is_better=False),
        }
        f = figures[f"blocked_over_sync_{mode}"]
        rows.append(
            [
                f"async {mode}",
                C.median(blocked) * 1e3,
                C.median(total) * 1e3,
                ratio,
                f"[{lo:.3f}, {hi:.3f}]",
                f"<= {GOAL_BLOCKED} {f['verdict']}",
            ]
        )
        rows.append(["  in save()", f["in_save_ms_median"], "", C.paired_ratio(in_save, sync), "", ""])
        rows.append(
            ["  waiting for the copy before the next optimizer step", f["staging_wait_ms_median"], "", "", "", ""]
        )
        rows.append(
            [
                "  (not blocked) next step's extra time: the copy shares the core",
                f["step_after_save_minus_plain_step_ms_median"],
                "",
                f["step_after_save_minus_plain_step_over_sync"],
                "",
                "",
            ]
        )
    raw = slowest(ranks, "dcp.save (no manager)", "total_s")
    crc = [r.get("crc32_s", 0.0) for r in s0["rounds"]["save off"]]
    figures["sync_save_ms_median"] = ms
    figures["raw_dcp_save_over_sync"] = C.paired_ratio(raw, sync)
    figures["crc32_over_sync"] = C.paired_ratio(crc, sync)
    rows.append(["  dcp.save alone (no manager)", C.median(raw) * 1e3, "", C.paired_ratio(raw, sync), "", ""])
    rows.append(
        [
            "  a CRC32 pass over the files (now in the writers)",
            C.median(crc) * 1e3,
            "",
            C.paired_ratio(crc, sync),
            "",
            "",
        ]
    )
    for reuse in ("fresh", "reused"):
        st = slowest(ranks, f"staging, {reuse} buffers", "total_s")
        figures[f"staging_{reuse}_buffers_over_sync"] = C.paired_ratio(st, sync)
        figures[f"staging_{reuse}_buffers_ms_median"] = C.median(st) * 1e3
        label = "  state_dict + staging copy, " + ("new buffers (DCP)" if reuse == "fresh" else "buffers reused")
        rows.append([label, C.median(st) * 1e3, "", C.paired_ratio(st, sync), "", ""])
    C.table(
        ["save", "loop blocked ms", "until committed ms", "ratio to sync", "IQR", "goal"],
        rows,
        title=(
            f"\n1. Training loop blocked per save: {args.nproc} ranks ({s0['strategy']}), GPT "
            f"{args.big_layers}x{args.big_width} = {s0['params'] / 1e6:.1f}M params + AdamW, "
            f"{nbytes / MB:.0f} MB per checkpoint; slowest rank per round; ratio = median over {args.rounds} "
            "rounds of blocked / sync save time of the same round;\nasync blocked = time in save() + time the "
            "next training step waits for the background copy before its optimizer step; until committed "
            "includes that step"
        ),
    )

    # throughput
    write_shares = slowest(ranks, "plain write (per rank)", "total_s")
    write_whole = slowest(ranks, "plain write (1 file)", "total_s")
    write_new = slowest(ranks, "plain write (per rank, new file)", "total_s")
    write_best = [min(a, b) for a, b in zip(write_shares, write_whole, strict=True)]
    read_shares = slowest(ranks, "plain read (per rank)", "total_s")
    read_one = slowest(ranks, "plain read (1 file)", "total_s")
    read_all_ranks = slowest(ranks, "plain read (every rank all)", "total_s")
    read_best = [min(a, b) for a, b in zip(read_shares, read_one, strict=True)]
    load_cold = slowest(ranks, "load (cold)", "total_s")
    load_warm = slowest(ranks, "load (warm)", "total_s")
    load_dcp = slowest(ranks, "load, DCP's reader (cold)", "total_s")
    raw_save = slowest(ranks, "dcp.save (no manager)", "total_s")
    save_ratio = C.paired_ratio(write_best, sync)  # (bytes/sync) / (bytes/plain) = plain / sync
    load_ratio = C.paired_ratio(read_best, load_cold)

    def mbps(ts: list[float]) -> float:
        return nbytes / MB / C.median(ts)

    figures["throughput"] = {
        "save_MBps": mbps(sync),
        "plain_write_per_rank_MBps": mbps(write_shares),
        "plain_write_one_file_MBps": mbps(write_whole),
        "save_over_plain_write": save_ratio,
        "save_over_plain_write_per_rank": C.paired_ratio(write_shares, sync),
        "plain_write_new_file_MBps": mbps(write_new),
        "save_over_plain_write_new_file": C.paired_ratio(write_new, sync),
        "load_cold_MBps": mbps(load_cold),
        "load_warm_MBps": mbps(load_warm),
        "plain_read_per_rank_cold_MBps": mbps(read_shares),
        "plain_read_one_file_cold_MBps": mbps(read_one),
        "plain_read_every_rank_all_cold_MBps": mbps(read_all_ranks),
        "load_over_plain_read_every_rank_all": C.paired_ratio(read_all_ranks, load_cold),
        "load_over_plain_read": load_ratio,
        "load_dcp_reader_cold_MBps": mbps(load_dcp),
        "load_dcp_reader_over_plain_read": C.paired_ratio(read_best, load_dcp),
        "raw_dcp_save_MBps": mbps(raw_save),
        "raw_dcp_save_over_plain_write": C.paired_ratio(write_best, raw_save),
        "goal": GOAL_THROUGHPUT,
        "verdict_save": C.verdict(save_ratio, GOAL_THROUGHPUT),
        "verdict_load": C.verdict(load_ratio, GOAL_THROUGHPUT),
    }
    t = figures["throughput"]
    C.table(
        ["", "checkpoint MB/s", "plain Python MB/s", "ratio", "goal"],
        [
            [
                "save (sync, incl. commit)",
                t["save_MBps"],
                f"{t['plain_write_per_rank_MBps']:.0f} per rank / {t['plain_write_one_file_MBps']:.0f} 1 file",
                save_ratio,
                f">= {GOAL_THROUGHPUT} {t['verdict_save']}",
            ],
            [
                "load (cold page cache)",
                t["load_cold_MBps"],
                f"{t['plain_read_per_rank_cold_MBps']:.0f} per rank / {t['plain_read_one_file_cold_MBps']:.0f} 1 file",
                load_ratio,
                f">= {GOAL_THROUGHPUT} {t['verdict_load']}",
            ],
            [
                "  (plain: each rank a new file each time, buffered)",
                "",
                f"{t['plain_write_new_file_MBps']:.0f} per rank",
                t["save_over_plain_write_new_file"],
                "",
            ],
            ["load (warm page cache)", t["load_warm_MBps"], "", "", ""],
            [
                "  dcp.save alone (DCP's writer, no manager)",
                t["raw_dcp_save_MBps"],
                "",
                t["raw_dcp_save_over_plain_write"],
                "",
            ],
            [
                "  load with DCP's reader (cold)",
                t["load_dcp_reader_cold_MBps"],
                "",
                t["load_dcp_reader_over_plain_read"],
                "",
            ],
            [
                "  (DDP: every rank needs all bytes)",
                "",
                f"{t['plain_read_every_rank_all_cold_MBps']:.0f} every rank all",
                t["load_over_plain_read_every_rank_all"],
                "",
            ],
        ],
        title=(
            f"\n2. Throughput: {nbytes / MB:.0f} MB of checkpoint files; plain Python = write + fsync the same "
            "bytes (each rank its share, concurrently; or rank 0 one file) and read them back cold; MB/s = "
            "checkpoint bytes / time of the slowest rank;\nratio = median over rounds of checkpoint speed / "
            "plain speed (the faster of the two plain variants) of the same round"
        ),
    )
    return figures


def report_steps(ranks: list[dict[str, Any]], args: argparse.Namespace) -> dict[str, Any]:
    names = list(ranks[0]["steps"]["times_s_per_step"])
    per_rank = [r["steps"]["times_s_per_step"] for r in ranks]
    times = {n: [max(pr[n][i] for pr in per_rank) for i in range(len(per_rank[0][n]))] for n in names}
    plain, ck = times[names[0]], times[names[1]]
    ratio = C.paired_ratio(ck, plain)
    overhead = ratio - 1
    lo, hi = C.spread([c / p - 1 for c, p in zip(ck, plain, strict=True)])
    s0 = ranks[0]["steps"]
    blocked = [max(r["steps"]["blocked_s_per_block"][i] for r in ranks) for i in range(len(plain))]
    verdict = C.verdict(overhead, GOAL_OVERHEAD, higher_is_better=False)
    steps = s0["block_steps"]
    # The part of the overhead that is the loop waiting in save() (the rest: the background write
    # competing with the ranks for the 2 cores): per round, blocked time of its saves / no-ckpt block time.
    blocked_share = C.median([blocked[r] / (plain[r] * steps) for r in range(len(plain))])
    # CPU time of both ranks (every thread) per block: far less sensitive to outside load than wall time.
    cpu = {n: [sum(r["steps"]["cpu_s_per_block"][n][i] for r in ranks) for i in range(len(plain))] for n in names}
    cpu_overhead = C.paired_ratio(cpu[names[1]], cpu[names[0]]) - 1
    clo, chi = C.spread([c / p - 1 for c, p in zip(cpu[names[1]], cpu[names[0]], strict=True)])
    C.table(
        ["variant", "ms/step (median)", "overhead", "IQR", "goal"],
        [
            [names[0], C.median(plain) * 1e3, "", "", ""],
            [
                names[1],
                C.median(ck) * 1e3,
                f"{overhead * 100:+.2f}%",
                f"[{lo * 100:+.2f}%, {hi * 100:+.2f}%]",
                f"<= {GOAL_OVERHEAD * 100:.0f}% {verdict}",
            ],
            ["  of which the loop blocked in save()", "", f"{blocked_share * 100:+.2f}%", "", ""],
            [
                "  CPU time of the ranks (all threads)",
                "",
                f"{cpu_overhead * 100:+.2f}%",
                f"[{clo * 100:+.2f}%, {chi * 100:+.2f}%]",
                "",
            ],
        ],
        title=(
            f"\n3. Step-time overhead: Trainer.fit(), {args.nproc} ranks, GPT {args.layers}x{args.width} ctx "
            f"{args.context} ({s0['params'] / 1e6:.1f}M params) micro-batch {args.micro_batch} bf16; "
            f"one Trainer, blocks of {s0['block_steps']} steps alternating with and without its CheckpointManager: "
            f"{args.saves_per_block} async save(s) per block (every {args.interval} steps)\n+ waiting for it to "
            "commit at the block's end; slowest rank per block; "
            f"overhead = median over {args.step_rounds} rounds of (ckpt block time / no-ckpt block time) - 1. "
            f"Loop blocked in save(): median {C.median(blocked) * 1e3:.1f} ms per block "
            f"({s0['saves_timed']} timed saves)"
        ),
    )
    return {
        "overhead": overhead,
        "iqr": [lo, hi],
        "ms_per_step": {n: C.median(times[n]) * 1e3 for n in names},
        "blocked_ms_per_block_median": C.median(blocked) * 1e3,
        "blocked_share_of_block_time": blocked_share,
        "cpu_time_overhead": cpu_overhead,
        "cpu_time_overhead_iqr": [clo, chi],
        "cpu_s_per_block": cpu,
        "failures": s0["failures"],
        "goal": GOAL_OVERHEAD,
        "verdict": verdict,
        "times_s_per_step": times,
    }


def launch_and_collect(nproc: int, args: list[str]) -> list[dict[str, Any]]:
    """``C.launch_and_collect``, but without the INFO lines DCP's background save process logs per save."""
    with tempfile.TemporaryDirectory(prefix="disttrain-bench-") as tmp:
        env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
        cmd = [str(C.DISTTRAIN), "launch", "-n", str(nproc), __file__, *args, "--out", tmp]
        proc = subprocess.Popen(cmd, env=env, cwd=C.ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        assert proc.stdout is not None
        for line in proc.stdout:
            if " - root - INFO - " not in line:
                print(line, end="", flush=True)
        if proc.wait() != 0:
            raise SystemExit(f"benchmark workers failed (exit {proc.returncode}): {' '.join(cmd)}")
        return [json.loads((Path(tmp) / f"rank{r}.json").read_text()) for r in range(nproc)]


def main(argv: list[str]) -> None:
    args = parse_args(argv)
    if C.is_worker():
        worker(args)
        return
    t_start = time.perf_counter()
    root = Path(args.root) if args.root else Path(tempfile.mkdtemp(prefix="disttrain-bench-ckpt-", dir="/tmp"))
    where = {"checkpoints": f"{root}: {mount_of(root)}", "repository": f"{C.ROOT}: {mount_of(C.ROOT)}"}
    m = C.machine()
    print(f"{m['date']}: {m['cpu']}, {m['cores']} cores, torch {m['torch']}, load average {m['load_avg_1m']:.2f}")
    print(f"checkpoints in {where['checkpoints']}; repository on {where['repository'].split(': ', 1)[1]}")
    try:
        ranks = launch_and_collect(args.nproc, [*argv, "--root", str(root)])
    finally:
        if not args.root:
            shutil.rmtree(root, ignore_errors=True)
    results: dict[str, Any] = {"disks": where}
    if "saves" in ranks[0]:
        results["saves"] = report_saves(ranks, args)
        results["raw_saves"] = [r["saves"]["rounds"] for r in ranks]
    if "steps" in ranks[0]:
        results["steps"] = report_steps(ranks, args)
    results["wall_s"] = time.perf_counter() - t_start
    print(f"\nwall time {results['wall_s']:.0f} s")
    config = {k: v for k, v in vars(args).items() if k not in ("out", "root")}
    C.write_results("bench_checkpoint", {"config": config, "results": results})


if __name__ == "__main__":
    main(sys.argv[1:])
