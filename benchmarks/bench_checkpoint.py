"""Checkpointing cost: the training loop's time blocked per save, save/load throughput against plain file I/O of
the same bytes, step-time overhead of periodic async saves. One launch of ``--nproc`` ranks (strategy ``auto``: DDP
for 2), checkpoints in a fresh folder in /tmp (or ``--root``; its disk printed).

1. **Blocked time per save.** A GPT of 17.9M parameters (10 x 384) after one AdamW step (216 MB per save):
   ``CheckpointManager.save`` with ``async_mode`` off / thread / process; blocked = ``save()`` itself plus the next
   step's wait for the background copy, against the sync save. Goal <= 0.10.
2. **Throughput.** Checkpoint bytes / sync save time and / cold ``load`` time, against plain Python writing (+
   ``fsync``) the same bytes, each rank its share (also into a new file each time), and reading them back cold
   (each rank its share; every rank all, as DDP's load must). Goal >= 0.50.
3. **Step-time overhead.** ``Trainer.fit()`` (GPT 2 x 128, context 256) with an async-thread ``CheckpointManager``
   saving every ``--interval`` steps and without; blocks of one interval start half-way between two saves and end
   when the save has committed. Goal <= 0.02. The ranks' CPU time per block gives the CPU a save costs.
"""

from __future__ import annotations

import argparse
import functools
import itertools
import os
import shutil
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from benchmarks import harness as H
from disttrain.checkpoint.layout import write_synced

GOALS = {
    "blocked": H.Goal("loop blocked per async save / sync save", 0.10, higher_is_better=False),
    "throughput": H.Goal("checkpoint speed / plain file speed", 0.50),
    "overhead": H.Goal("step-time overhead of an async save every interval", 0.02, higher_is_better=False),
}
OPTIONS = {
    **H.options(nproc=2, rounds=5),  # parts 1-2: one save of each variant per round
    "big_layers": (10, "parts 1-2: GPT blocks"),
    "big_width": (384, "parts 1-2: GPT width"),
    "big_context": (256, "parts 1-2: context"),
    "step_rounds": (6, "timed rounds of part 3 (one block per variant)"),
    "interval": (50, "part 3: save every N steps (a block)"),
    **H.options(layers=2, width=128, heads=4, context=256, micro_batch=8),  # part 3's
    "skip_saves": (False, "skip parts 1-2"),
    "skip_steps": (False, "skip part 3"),
    "root": (None, "checkpoint folder (default: a fresh one in /tmp, removed at the end)"),
}
QUICK = {"rounds": 1, "big_layers": 2, "big_width": 192, "step_rounds": 1, "interval": 10}
MB = 1e6
Timings = dict[str, float]  # what one call of a variant measured on this rank


def config(args: argparse.Namespace, world: int, big: bool, **checkpoint: Any) -> Any:
    """Parts 1-2 (``big``): the ``--big-*`` GPT, micro-batch 1; part 3: the ``--layers ...`` GPT."""
    if big:
        model, micro = H.gpt(args.big_layers, args.big_width, 6, args.big_context), 1
    else:
        model, micro = H.gpt_of(args), args.micro_batch
    ckpt = {"resume": "never", "save_final": "none", **checkpoint}
    return H.job(model, world=world, micro_batch=micro, checkpoint=ckpt)


def manager(cfg: Any, folder: Path, env: Any) -> Any:
    from disttrain.checkpoint import CheckpointManager
    from disttrain.parallel.strategies import resolve_name

    strategy = resolve_name(cfg.parallel.strategy, env.world_size)
    return CheckpointManager(folder, cfg.checkpoint, rank=env.rank, world_size=env.world_size, strategy=strategy)


# -- parts 1-2 on the ranks: the saves, the loads and plain files of the same bytes ----------------------
def drop_cache(paths: list[Path]) -> None:
    """Evict these (fsynced, clean) files from the page cache, so the next read comes from the disk."""
    for p in paths:
        with open(p, "rb") as f:
            os.posix_fadvise(f.fileno(), 0, 0, os.POSIX_FADV_DONTNEED)


def timed(fn: Callable[[], Any]) -> Timings:
    """``fn()`` timed on this rank between two barriers (not timed)."""
    dist.barrier()
    t0 = time.perf_counter()
    fn()
    dt = time.perf_counter() - t0
    dist.barrier()
    return {"total_s": dt}


def cold_read(path: Path, buf: Any) -> Timings:
    """``path`` read into ``buf`` from the disk (out of the page cache first), timed."""
    drop_cache([path])

    def read() -> None:
        with open(path, "rb", buffering=0) as f:
            assert f.readinto(buf) == len(buf), path

    return timed(read)


def plain_files(share: int, total: int, rank: int, folder: Path) -> dict[str, Callable[[], Timings]]:
    """The checkpoint's bytes (random ones, as many) written + fsynced and read back cold with plain Python:
    each rank its share; into a new file each time, the one before last deleted after it (like keep_latest=2:
    buffered writes into page-cache pages the guest may not have touched lately); every rank the whole."""
    folder.mkdir(parents=True, exist_ok=True)
    gen = torch.Generator().manual_seed(rank)
    buf = torch.randint(0, 256, (max(share, total),), dtype=torch.uint8, generator=gen).numpy()
    mine, whole, fresh = folder / f"rank{rank}.bin", folder / "whole.bin", [folder / f"{rank}-{i}" for i in range(3)]
    writes = itertools.count()
    if rank == 0:
        write_synced(whole, buf[:total])

    def new_file() -> Timings:
        i = next(writes)
        out = timed(lambda: write_synced(fresh[i % 3], buf[:share]))
        fresh[(i + 2) % 3].unlink(missing_ok=True)
        return out

    return {
        "plain write (per rank)": lambda: timed(lambda: write_synced(mine, buf[:share])),
        "plain write (per rank, new file)": new_file,
        "plain read (per rank)": functools.partial(cold_read, mine, buf[:share]),
        "plain read (every rank all)": functools.partial(cold_read, whole, buf[:total]),
    }


def part_saves(args: argparse.Namespace, data: Any, env: Any, root: Path) -> dict[str, Any]:
    """Parts 1 and 2: the big GPT's state after one AdamW step saved sync / thread / process and loaded cold,
    against plain writes and reads of the same bytes."""
    trainer = H.trainer(config(args, env.world_size, big=True), data, env)
    trainer.train_step()  # AdamW's moments exist from the first step on
    modes = ("off", "thread", "process")
    managers = {m: manager(config(args, env.world_size, True, async_mode=m), root / m, env) for m in modes}
    steps = itertools.count(1)  # the step number each save is written under

    def save(m: Any) -> Timings:
        """One save; async: then one training step, as the Trainer runs it (its optimizer step waits for the
        background copy of the state), then wait until written and committed."""
        dist.barrier()
        t0 = time.perf_counter()
        m.save(next(steps), trainer.state())
        out = {"blocked_s": m.blocked_s[-1]}
        if m is not managers["off"]:
            waits, trainer.checkpoint = len(m.staging_wait_s), m
            trainer.train_step()
            out["staging_wait_s"], trainer.checkpoint = sum(m.staging_wait_s[waits:]), None
        m.wait()  # async: until written and committed (rank 0 commits)
        out["total_s"] = time.perf_counter() - t0
        dist.barrier()
        if m._purger is not None:  # the keep-k purge runs in the background: not into the next variant
            m._purger.join()
        return out

    def load() -> Timings:
        info = managers["off"].latest()
        if env.rank == 0:
            drop_cache([p for p in info.path.rglob("*") if p.is_file()])
        return timed(lambda: managers["off"].load(trainer.state(), info))

    save(managers["off"])  # untimed: the sizes of what each rank writes, for the plain-Python baseline
    first = root / "off" / "step-00000001"
    total = sum(p.stat().st_size for p in first.rglob("*") if p.is_file())
    share = sum(p.stat().st_size for p in first.glob(f"__{env.rank}_*.distcp"))
    variants: dict[str, Callable[[], Timings]] = {f"save {k}": functools.partial(save, m) for k, m in managers.items()}
    variants["load (cold)"] = load
    rounds = H.side_by_side(variants | plain_files(share, total, env.rank, root / "plain"), args.rounds, warmup=1)
    for m in managers.values():
        m.close()
    params = sum(p.numel() for p in trainer.model.module.parameters())
    return {"params": params, "strategy": trainer.dims.strategy, "bytes": total, "rounds": rounds}


# -- part 3 on the ranks: Trainer.fit() with and without async saves -------------------------------------
class Blocks:
    """One Trainer for both variants (two instances differ by a few % in speed by themselves: memory
    placement); a block sets ``trainer.checkpoint`` to the manager or to None and runs ``fit()`` for ``n`` more
    steps. Records the blocked time of the checkpointed blocks and every block's CPU time (all threads)."""

    def __init__(self, trainer: Any) -> None:
        self.trainer, self.manager = trainer, trainer.checkpoint
        self.blocked_per_block: list[float] = []
        self.cpu_s: dict[bool, list[float]] = {False: [], True: []}

    def wait_only(self) -> None:
        """A block's end: the save written and committed, the purge done. (``fit()`` ends with ``close()``, which
        also releases the stager's buffers and thread: a real job does that once, at its very end.)"""
        self.manager.wait()
        if self.manager._purger is not None:
            self.manager._purger.join()

    def run(self, with_ckpt: bool) -> Callable[[int], None]:
        def go(n: int) -> None:
            self.trainer.checkpoint = self.manager if with_ckpt else None
            before, c0 = len(self.manager.blocked_s), time.process_time()
            H.fit_for(self.trainer, n)
            self.cpu_s[with_ckpt].append(time.process_time() - c0)
            if with_ckpt:
                self.blocked_per_block.append(sum(self.manager.blocked_s[before:]))

        return go


def part_steps(args: argparse.Namespace, data: Any, env: Any, root: Path) -> dict[str, Any]:
    """Part 3: Trainer.fit() with async saves every ``interval`` steps vs without checkpoints (see ``Blocks``)."""
    from disttrain.utils.gc import GarbageCollection

    cfg = config(args, env.world_size, False, async_mode="thread", interval=args.interval)
    blocks = Blocks(H.trainer(cfg, data, env, checkpoint=manager(cfg, root / "steps", env)))
    blocks.manager.close = blocks.wait_only  # type: ignore[method-assign]
    # Untimed: half an interval, then a warm-up block per variant (the first save in it): every timed block
    # starts half-way between two saves. One job-wide GC context, as one fit() of a real job has.
    with GarbageCollection(cfg.train.gc_interval):
        blocks.run(False)(args.interval // 2)
        variants = {"no checkpoint": blocks.run(False), f"async thread every {args.interval}": blocks.run(True)}
        times = H.interleave(
            variants,
            steps_per_block=args.interval,
            rounds=args.step_rounds,
            warmup=args.interval,
            before_block=dist.barrier,
        )
    del blocks.manager.close  # the real close(), once
    blocks.manager.close()
    return {
        "params": sum(p.numel() for p in blocks.trainer.model.module.parameters()),
        "times_s_per_step": times,
        "cpu_s_per_block": [blocks.cpu_s[v][-args.step_rounds :] for v in (False, True)],
        "failures": blocks.manager.failures,
        "blocked_s_per_block": blocks.blocked_per_block[1:],  # the first is the warm-up block's
    }


def worker(args: argparse.Namespace) -> dict[str, Any]:
    env, root, out = H.init_ranks(), Path(args.root), {}
    if not args.skip_saves:
        out["saves"] = part_saves(args, H.text(args.big_context), env, root)
    if not args.skip_steps:
        out["steps"] = part_steps(args, H.text(args.context), env, root)
    return out


# -- the parent: tables and figures ---------------------------------------------------------------------
def slowest(ranks: list[dict[str, Any]], name: str, *keys: str) -> list[float]:
    """Per round, the largest value over ranks (the slowest rank sets the pace) of the sum of ``keys``."""
    per_rank = [r["saves"]["rounds"][name] for r in ranks]
    return [max(sum(rr[i].get(k, 0.0) for k in keys) for rr in per_rank) for i in range(len(per_rank[0]))]


def blocked_rows(ranks: list[dict[str, Any]], sync: list[float]) -> list[dict[str, Any]]:
    """Part 1: each async mode's blocked time against the sync save, and what it is made of."""
    rows = [{"save": "sync save (async_mode=off)", "ms": H.median(sync) * 1e3, "ratio": 1.0}]
    for mode in ("thread", "process"):
        name = f"save {mode}"
        blocked = slowest(ranks, name, "blocked_s", "staging_wait_s")  # save() + wait before the optimizer step
        rows.append({"save": f"async {mode}", "ms": H.median(blocked) * 1e3, **H.ratio(blocked, sync)})
        rows[-1]["until committed ms"] = H.median(slowest(ranks, name, "total_s")) * 1e3
        rows.append({"save": "  in save()", "ms": H.median(slowest(ranks, name, "blocked_s")) * 1e3})
        waited = H.median(slowest(ranks, name, "staging_wait_s")) * 1e3
        rows.append({"save": "  waiting for the copy before the next optimizer step", "ms": waited})
    return rows


THROUGHPUT = {  # row: (checkpoint variant, the plain variant it is set against)
    "save (sync, incl. commit)": ("save off", "plain write (per rank)"),
    "  against a new file per rank each time, buffered": ("save off", "plain write (per rank, new file)"),
    "load (cold page cache)": ("load (cold)", "plain read (per rank)"),
    "  against every rank reading all (as DDP's load must)": ("load (cold)", "plain read (every rank all)"),
}


def report_saves(ranks: list[dict[str, Any]], args: argparse.Namespace) -> dict[str, Any]:
    s0, sync = ranks[0]["saves"], slowest(ranks, "save off", "blocked_s")
    blocked, speeds = blocked_rows(ranks, sync), []
    for label, (ours, plain) in THROUGHPUT.items():
        mine = slowest(ranks, ours, "blocked_s" if ours == "save off" else "total_s")
        theirs = slowest(ranks, plain, "total_s")
        speeds.append({"": label, "checkpoint MB/s": s0["bytes"] / MB / H.median(mine)})
        speeds[-1] |= {"plain MB/s": s0["bytes"] / MB / H.median(theirs), **H.ratio(theirs, mine)}
    model = f"GPT {args.big_layers}x{args.big_width} = {s0['params'] / 1e6:.1f}M params + AdamW"
    H.table(blocked, f"\n1. Loop blocked per save: {args.nproc} ranks ({s0['strategy']}), {model}")
    H.table(speeds, f"\n2. Throughput of {s0['bytes'] / MB:.0f} MB against plain files; MB/s of the slowest rank")
    goals = [GOALS["blocked"].check(r["ratio"]) for r in blocked if r["save"].startswith("async")]
    goals += [GOALS["throughput"].check(speeds[i]["ratio"]) for i in (0, 2)]
    return {"blocked": blocked, "throughput": speeds, "goals": goals, "raw": [r["saves"] for r in ranks]}


def report_steps(ranks: list[dict[str, Any]], args: argparse.Namespace) -> dict[str, Any]:
    """Part 3: checkpointed vs plain blocks, slowest rank per block, paired over rounds."""
    times = H.slowest_per_round([r["steps"]["times_s_per_step"] for r in ranks])
    (plain_name, plain), (ckpt_name, ckpt) = times.items()
    blocked = [max(r["steps"]["blocked_s_per_block"][i] for r in ranks) for i in range(len(plain))]
    # CPU time of the ranks (every thread) per block: far less sensitive to outside load than wall time
    cpu = [[sum(r["steps"]["cpu_s_per_block"][v][i] for r in ranks) for i in range(len(plain))] for v in (0, 1)]
    per_save = [(c - p) / len(ranks) * 1e3 for p, c in zip(*cpu, strict=True)]
    lo, hi = H.spread([c / p - 1 for c, p in zip(ckpt, plain, strict=True)])
    in_save = H.median([b / (p * args.interval) for b, p in zip(blocked, plain, strict=True)])
    rows: list[dict[str, Any]] = [
        {"variant": plain_name, "ms/step": H.median(plain) * 1e3},
        {"variant": ckpt_name, "ms/step": H.median(ckpt) * 1e3, "overhead": H.paired_ratio(ckpt, plain) - 1},
        {"variant": "  of which the loop blocked in save()", "overhead": in_save},
        {"variant": "  CPU time of the ranks (all threads)", "overhead": H.paired_ratio(cpu[1], cpu[0]) - 1},
        {"variant": "  CPU of a save, per rank", "ms per save": H.median(per_save)},
    ]
    rows[1]["IQR"] = f"{lo:+.2%} to {hi:+.2%}"
    model = f"GPT {args.layers}x{args.width} ctx {args.context}, micro-batch {args.micro_batch}"
    H.table(rows, f"\n3. Step-time overhead: {args.nproc} ranks, {model}, blocks of {args.interval} steps")
    goal = GOALS["overhead"].check(rows[1]["overhead"])
    return {"rows": rows, "goals": [goal], "failures": ranks[0]["steps"]["failures"], "times_s_per_step": times}


def run(args: argparse.Namespace) -> dict[str, Any]:
    root = Path(args.root or tempfile.mkdtemp(prefix="disttrain-bench-ckpt-", dir="/tmp"))
    disks = {
        p: H.command(["df", "--output=source,fstype,target", p]).stdout.split()[-3:] for p in (str(root), str(H.ROOT))
    }
    print(f"checkpoints in {root}: {' '.join(disks[str(root)])}; the repository's disk: {' '.join(disks[str(H.ROOT)])}")
    try:  # the DCP save process logs an INFO line per save: left out
        argv = [*args.argv, "--root", str(root)]
        ranks = H.ranks(args.nproc, __file__, argv, echo=lambda x: " - root - INFO - " not in x)
    finally:
        if not args.root:
            shutil.rmtree(root, ignore_errors=True)
    results: dict[str, Any] = {"disks": disks}
    if not args.skip_saves:
        results["saves"] = report_saves(ranks, args)
    if not args.skip_steps:
        results["steps"] = report_steps(ranks, args)
    return results


if __name__ == "__main__":
    H.main(__file__, __doc__, OPTIONS, QUICK, run, worker)
