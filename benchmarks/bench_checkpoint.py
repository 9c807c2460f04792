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

    .venv/bin/python -m benchmarks.bench_checkpoint [--rounds 5] [--step-rounds 8] [--skip-saves|--skip-steps]
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks import _common as C
from benchmarks.ckpt_report import mount_of, report_saves, report_steps
from benchmarks.ckpt_saves import part_saves
from benchmarks.ckpt_steps import part_steps
from disttrain.testing.launch import finish_worker, is_worker, launch_and_collect, write_rank_result


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
    C.add_gpt_args(p, layers=2, width=128, heads=4, context=256, micro_batch=8)
    p.add_argument("--skip-saves", action="store_true", help="skip parts 1-2")
    p.add_argument("--skip-steps", action="store_true", help="skip part 3")
    p.add_argument("--root", default=None, help="checkpoint folder (default: a fresh one in /tmp)")
    p.add_argument("--out", default=None, help=argparse.SUPPRESS)  # set for the workers
    return p.parse_args(argv)


def worker(args: argparse.Namespace) -> None:
    C.one_thread()
    from disttrain.data.text import load_text_data
    from disttrain.parallel.env import init_distributed

    env = init_distributed("cpu", threads=1)
    root = Path(args.root)
    out: dict[str, Any] = {}
    if not args.skip_saves:
        text = load_text_data(None, args.big_context, 0.1)
        out["saves"] = part_saves(args, text, env, root)
    if not args.skip_steps:
        text = load_text_data(None, args.context, 0.1)
        out["steps"] = part_steps(args, text, env, root)
    write_rank_result(args.out, env.rank, out)
    finish_worker()


def without_save_logs(line: str) -> bool:
    """Every line but the INFO lines DCP's background save process logs per save."""
    return " - root - INFO - " not in line


def main(argv: list[str]) -> None:
    args = parse_args(argv)
    if is_worker():
        worker(args)
        return
    t_start = time.perf_counter()
    root = Path(args.root) if args.root else Path(tempfile.mkdtemp(prefix="disttrain-bench-ckpt-", dir="/tmp"))
    where = {"checkpoints": f"{root}: {mount_of(root)}", "repository": f"{C.ROOT}: {mount_of(C.ROOT)}"}
    C.print_machine()
    print(f"checkpoints in {where['checkpoints']}; repository on {where['repository'].split(': ', 1)[1]}")
    try:
        ranks = launch_and_collect(args.nproc, Path(__file__), [*argv, "--root", str(root)], echo=without_save_logs)
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
