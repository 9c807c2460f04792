"""Where the CPU of an async checkpoint save goes, per thread, while training runs (diagnostic for part 3 of
bench_checkpoint.py, whose state and settings it uses: 2 ranks, the 0.5M-parameter GPT, a save every 50 steps).

Each phase is timed with ``time.thread_time()`` on the thread that runs it: ``save()`` on the training thread,
the staging copy on the stager's thread, DCP's upload (planning, collectives, writing) and the commit on the
upload thread, the keep-k purge on its own thread. Medians per rank over ``--blocks`` saves, after one untimed.

    .venv/bin/python -m benchmarks.profile_save_cpu [--blocks 8]
"""

from __future__ import annotations

import argparse
import sys
import time
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any

from benchmarks import _common as C
from benchmarks import bench_checkpoint as B
from benchmarks.ckpt_setup import config, make_trainer
from disttrain.testing.launch import finish_worker, is_worker, launch_and_collect, write_rank_result

PHASES = {  # label -> (module, owner attribute path, method)
    "save() (training thread)": ("disttrain.checkpoint", "CheckpointManager", "save"),
    "staging copy": ("disttrain.checkpoint.staging", "DeferredStager", "_stage"),
    "upload: plan + write": ("torch.distributed.checkpoint._async_thread_executor", None, "save_wrapper"),
    "  of which writing the shard": ("disttrain.checkpoint.writer", "ChecksummingWriter", "write_data"),
    "commit (rank 0)": ("disttrain.checkpoint", "CheckpointManager", "_finish"),
    "purge": ("disttrain.checkpoint", "CheckpointManager", "purge"),
}


def instrument(cpu: dict[str, list[float]]) -> None:
    """Wrap each phase's function so that it records its thread's CPU time into ``cpu[label]``."""
    import importlib

    for label, (module, owner, name) in PHASES.items():
        target: Any = importlib.import_module(module)
        if owner is not None:
            target = getattr(target, owner)
        setattr(target, name, timed(getattr(target, name), cpu[label]))


def timed(fn: Callable[..., Any], into: list[float]) -> Callable[..., Any]:
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        t0 = time.thread_time()
        try:
            return fn(*args, **kwargs)
        finally:
            into.append(time.thread_time() - t0)

    return wrapper


def worker(args: argparse.Namespace) -> None:
    C.one_thread()
    from disttrain.data.text import load_text_data
    from disttrain.parallel.env import init_distributed
    from disttrain.utils.gc import GarbageCollection

    cpu: dict[str, list[float]] = defaultdict(list)
    instrument(cpu)
    env = init_distributed("cpu", threads=1)
    bench_args = B.parse_args([])
    text = load_text_data(None, bench_args.context, 0.1)
    cfg = config(bench_args, env.world_size, False, {"async_mode": "thread", "interval": bench_args.interval})
    trainer = make_trainer(cfg, text, env, Path(args.root) / "ckpt")
    manager = trainer.checkpoint
    assert manager is not None
    real_close = manager.close
    manager.close = manager.wait  # type: ignore[method-assign]  # between fit() calls: keep the stager
    interval = bench_args.interval
    with GarbageCollection(cfg.train.gc_interval):
        trainer.cfg.train.steps = interval + interval // 2  # one untimed save, then half-way to the next
        trainer.fit()
        for timings in cpu.values():  # in place: the wrappers hold these lists
            timings.clear()
        c0, w0 = time.process_time(), time.perf_counter()
        trainer.cfg.train.steps += args.blocks * interval
        trainer.fit()
        process_cpu, wall = time.process_time() - c0, time.perf_counter() - w0
    manager.close = real_close  # type: ignore[method-assign]
    manager.close()
    out = {label: C.median(v) * 1e3 for label, v in cpu.items() if v}
    out["saves"] = len(cpu["save() (training thread)"])
    out["process CPU per interval"] = process_cpu / args.blocks * 1e3
    out["wall per interval"] = wall / args.blocks * 1e3
    write_rank_result(args.out, env.rank, out)
    finish_worker()


def main(argv: list[str]) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--blocks", type=int, default=8, help="timed intervals of 50 steps, one save each")
    p.add_argument("--root", default=None, help=argparse.SUPPRESS)
    p.add_argument("--out", default=None, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if is_worker():
        worker(args)
        return
    import tempfile

    with tempfile.TemporaryDirectory(prefix="disttrain-prof-", dir="/tmp") as root:
        ranks = launch_and_collect(2, Path(__file__), [*argv, "--root", root], echo=True)
    labels = [k for k in PHASES if any(k in r for r in ranks)]
    rows = [[label, *(r.get(label, 0.0) for r in ranks)] for label in labels]
    per_save = [sum(r.get(k, 0.0) for k in PHASES if not k.startswith(" ")) for r in ranks]
    rows.append(["total per save", *per_save])
    shares = [100 * s / r["process CPU per interval"] for s, r in zip(per_save, ranks, strict=True)]
    rows.append(["  % of the rank's CPU time per interval", *shares])
    C.table(["phase (CPU ms, median per save)", "rank 0", "rank 1"], rows, title=f"{ranks[0]['saves']} saves per rank")
    C.write_results("profile_save_cpu", {"ranks": ranks})


if __name__ == "__main__":
    main(sys.argv[1:])
