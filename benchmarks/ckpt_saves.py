"""Parts 1 and 2 of bench_checkpoint.py, on every rank: ~212 MB of state saved sync / thread / process and
loaded, against plain writes and reads of the same bytes (``part_saves``)."""

from __future__ import annotations

import argparse
import os
import shutil
import time
import zlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from benchmarks import _common as C
from benchmarks.ckpt_setup import config, make_trainer

Timings = dict[str, float]  # what one call of a variant measured on this rank
Variant = Callable[[], Timings]


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


# -- rounds -------------------------------------------------------------------------------------------
def rounds_of(variants: dict[str, Variant], rounds: int, warmup: int) -> dict[str, list[Timings]]:
    """Each variant once per round (order rotating), after ``warmup`` untimed calls of each; every call
    returns its own timings (this rank's), which are collected per round."""
    recorded: dict[str, list[Timings]] = {n: [] for n in variants}

    def runner(name: str) -> Callable[[int], None]:
        def run(n: int) -> None:
            for _ in range(n):
                recorded[name].append(variants[name]())

        return run

    C.interleave(
        {n: runner(n) for n in variants}, steps_per_block=1, rounds=rounds, warmup=warmup, before_block=dist.barrier
    )
    return {n: r[warmup:] for n, r in recorded.items()}


def timed_barrier(fn: Callable[[], Any]) -> Timings:
    """``fn()`` timed on this rank, then a barrier (not timed)."""
    t0 = time.perf_counter()
    fn()
    dt = time.perf_counter() - t0
    dist.barrier()
    return {"total_s": dt}


# -- the plain-Python baseline ------------------------------------------------------------------------
class PlainFiles:
    """The checkpoint's bytes (random ones, as many) written + fsynced and read back cold with plain Python:
    each rank its share of the checkpoint, or rank 0 the whole of it in one file."""

    def __init__(self, sizes: dict[str, int], rank: int, folder: Path) -> None:
        self.rank = rank
        self.total = sum(sizes.values())
        self.share = sizes.get(f"__{rank}_0.distcp", 0)
        if rank == 0:
            folder.mkdir(parents=True, exist_ok=True)
        dist.barrier()
        gen = torch.Generator().manual_seed(rank)
        self.data = torch.randint(0, 256, (max(self.share, self.total),), dtype=torch.uint8, generator=gen)
        self.buf = self.data.numpy()
        self.folder = folder
        self.mine = folder / f"rank{rank}.bin"
        self.whole = folder / "whole.bin"
        self.fresh: list[Path] = []

    def write_shares(self) -> Timings:
        return timed_barrier(lambda: write_fsync(self.mine, self.buf[: self.share]))

    def write_new_file(self) -> Timings:
        """Each rank its share to a new file each time, the one before last deleted (like keep_latest=2):
        buffered writes into page-cache pages the guest may not have touched lately (see docs)."""
        path = self.folder / f"rank{self.rank}-{len(self.fresh)}.bin"
        t0 = time.perf_counter()
        write_fsync(path, self.buf[: self.share])
        dt = time.perf_counter() - t0
        self.fresh.append(path)
        if len(self.fresh) > 2:
            self.fresh[-3].unlink()
        dist.barrier()
        return {"total_s": dt}

    def write_whole(self) -> Timings:
        dt = 0.0
        if self.rank == 0:
            t0 = time.perf_counter()
            write_fsync(self.whole, self.buf[: self.total])
            dt = time.perf_counter() - t0
        dist.barrier()
        return {"total_s": dt}

    def read(self, which: str) -> Variant:
        """Read back cold: each rank its share; rank 0 the one whole file; every rank the whole file."""
        path, size = (self.mine, self.share) if which == "shares" else (self.whole, self.total)
        reads = which != "one" or self.rank == 0

        def run() -> Timings:
            if which == "shares" or self.rank == 0:
                drop_cache([path])
            dist.barrier()
            dt = 0.0
            if reads:
                t0 = time.perf_counter()
                got = read_all(path, self.buf[:size])
                dt = time.perf_counter() - t0
                assert got == size, (got, size)
            dist.barrier()
            return {"total_s": dt}

        return run


# -- the checkpoint variants --------------------------------------------------------------------------
class SaveBench:
    """The big GPT's trainer after one AdamW step, a CheckpointManager per ``async_mode``, a method per variant."""

    def __init__(self, args: argparse.Namespace, text: Any, env: Any, root: Path) -> None:
        from disttrain.checkpoint import CheckpointManager

        self.rank, world = env.rank, env.world_size
        self.root = root
        self.trainer = make_trainer(config(args, world, big=True), text, env)
        self.trainer.train_step()  # AdamW's moments exist from the first step on
        self.n_params = sum(p.numel() for p in self.trainer.model.module.parameters())
        self.managers = {
            mode: CheckpointManager(
                root / mode,
                config(args, world, True, {"async_mode": mode}).checkpoint,
                rank=self.rank,
                world_size=world,
                strategy=self.trainer.dims.strategy,
            )
            for mode in ("off", "thread", "process")
        }
        self.saves = 0  # the step number the next save is written under, minus one

    def save(self, mode: str) -> Timings:
        """One save; async: then one training step, as the Trainer runs it (its optimizer step waits for the
        background copy of the state: ``wait_for_staging``), then wait until written and committed."""
        m, trainer = self.managers[mode], self.trainer
        self.saves += 1
        t0 = time.perf_counter()
        m.save(self.saves, trainer.state())
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
        if mode == "off" and self.rank == 0:  # what rank 0's commit spends on CRC32s (files still cached)
            t1 = time.perf_counter()
            crc32_folder(self.root / mode / f"step-{self.saves:08d}")
            out["crc32_s"] = time.perf_counter() - t1
        dist.barrier()
        return out

    def newest_sizes(self) -> dict[str, int]:
        """Bytes of each file of the newest sync checkpoint."""
        newest = self.root / "off" / f"step-{self.saves:08d}"
        return {str(p.relative_to(newest)): p.stat().st_size for p in files_under(newest)}

    def _latest_sync(self, cold: bool) -> Any:
        """The newest sync checkpoint, its files evicted from the page cache (``cold``) or read once (warm)."""
        info = self.managers["off"].latest()
        assert info is not None
        if self.rank == 0:
            drop_cache(files_under(info.path)) if cold else [p.read_bytes() for p in files_under(info.path)]
        dist.barrier()
        return info

    def load(self, cold: bool) -> Variant:
        def run() -> Timings:
            info = self._latest_sync(cold)
            return timed_barrier(lambda: self.managers["off"].load(self.trainer.state(), info))

        return run

    def train_step(self) -> Timings:
        """A training step with no save around it: what the step after an async save is compared with."""
        return timed_barrier(self.trainer.train_step)

    def load_dcp_reader(self) -> Timings:
        """DCP's own FileSystemReader (torch.load per tensor), cold: what the manager's reader replaces."""
        import torch.distributed.checkpoint as dcp
        from torch.distributed.checkpoint import FileSystemReader

        info = self._latest_sync(cold=True)
        return timed_barrier(lambda: dcp.load(self.trainer.state(), storage_reader=FileSystemReader(info.path)))

    def raw_dcp_save(self) -> Timings:
        import torch.distributed.checkpoint as dcp

        self.saves += 1
        folder = self.root / "raw" / f"{self.saves}"
        out = timed_barrier(lambda: dcp.save(self.trainer.state(), checkpoint_id=folder))
        if self.rank == 0:
            shutil.rmtree(folder, ignore_errors=True)
        dist.barrier()
        return out

    def stage(self, reuse: bool, kept: Any) -> Variant:
        """What async_save's staging costs the loop: DCP's default (a stager, so fresh buffers, per save)
        vs one stager (``kept``) kept across saves (its storage cache reuses the buffers)."""
        from torch.distributed.checkpoint.staging import DefaultStager, StagingOptions
        from torch.distributed.checkpoint.state_dict_saver import _stateful_to_state_dict

        def run() -> Timings:
            t0 = time.perf_counter()
            sd = _stateful_to_state_dict(self.trainer.state())
            stager = kept if reuse else DefaultStager(StagingOptions(False, False, False, False))
            staged = stager.stage(sd)
            if not reuse:
                stager.close()
            dt = time.perf_counter() - t0
            del staged
            dist.barrier()
            return {"total_s": dt}

        return run

    def variants(self, plain: PlainFiles) -> dict[str, Variant]:
        """Every variant of parts 1-2, in the order a round runs them (rotated each round)."""
        from torch.distributed.checkpoint.staging import DefaultStager, StagingOptions

        kept = DefaultStager(StagingOptions(False, False, False, False))
        return {
            "save off": lambda: self.save("off"),
            "save thread": lambda: self.save("thread"),
            "save process": lambda: self.save("process"),
            "dcp.save (no manager)": self.raw_dcp_save,
            "staging, fresh buffers": self.stage(False, kept),
            "staging, reused buffers": self.stage(True, kept),
            "plain write (per rank)": plain.write_shares,
            "plain write (1 file)": plain.write_whole,
            "plain write (per rank, new file)": plain.write_new_file,
            "load (cold)": self.load(cold=True),
            "load, DCP's reader (cold)": self.load_dcp_reader,
            "train step": self.train_step,
            "plain read (per rank)": plain.read("shares"),
            "plain read (1 file)": plain.read("one"),
            "plain read (every rank all)": plain.read("all"),
            "load (warm)": self.load(cold=False),
        }


def part_saves(args: argparse.Namespace, text: Any, env: Any, root: Path) -> dict[str, Any]:
    """Parts 1 and 2: ~212 MB of state saved sync / thread / process, loaded, vs plain writes and reads."""
    bench = SaveBench(args, text, env, root)
    # One untimed sync save: the sizes of what each rank writes, for the plain-Python baseline.
    bench.save("off")
    sizes = bench.newest_sizes()
    plain = PlainFiles(sizes, env.rank, root / "plain")
    results = rounds_of(bench.variants(plain), args.rounds, warmup=1)
    for m in bench.managers.values():
        m.close()
    return {
        "params": bench.n_params,
        "strategy": bench.trainer.dims.strategy,
        "checkpoint_bytes": plain.total,
        "file_sizes": sizes,
        "share_bytes": plain.share,
        "rounds": results,
    }
