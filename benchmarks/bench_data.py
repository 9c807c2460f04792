"""Data at scale: a 4 GB prepared corpus costs no more memory or start-up than a 40 MB one, and the loader never
sets the pace of the default model (prepared shards; the on-the-fly path's ratio recorded).

1. **RSS and start-up**: two prepared folders (``bytes`` tokenizer, 257 ids, uint16) are *written directly* with
   the shards module (random ids, CRC32 and ``index.json``; ``data prepare`` of 4 GB would take most of an hour on
   2 cores): ``--big-gb`` (4) and ``--small-mb`` (40). ``--repeats`` rounds, order alternating, of the default
   model (6 x 384, context 256) on 2 ranks for ``--steps`` steps, each as a user runs it (``disttrain run``, its
   own process). Figures: peak RSS per rank (the larger of the two ranks) and time from the launch to the first
   step's metrics record, medians; goals: the median paired ratio big / small (same round) <= 1.10 (RSS) and
   <= 1.2 (time).
2. **Loader vs trainer**: the trainer's tokens/s from the small jobs (global, median of the steps after the
   first); the loader's per rank, timed alone (``GlobalBatchLoader.next_step`` of rank 0 of 2 over the big
   folder: random windows through memory maps). Goal: loader / trainer >= 20. The on-the-fly path: one job each
   on ``--raw-mb`` of generated ``.jsonl`` with ``bytes`` and a byte-level BPE (``bpe:8192`` trained by
   ``data prepare``), its ``data:`` line (the workers' tokens/s per rank vs the model's) recorded.

    .venv/bin/python -m benchmarks.bench_data [--big-gb 4] [--small-mb 40] [--repeats 5] [--steps 6]

The generated folders live in a temporary folder and are removed at the end.
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import subprocess
import sys
import tempfile
import time
import zlib
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks._common import median, paired_ratio, print_machine, table, verdict, write_results
from benchmarks.bench_prepare import cli, make_corpus
from disttrain.data.shards import FORMAT, INDEX, Shard, dtype_for, shard_name, write_json
from disttrain.data.tokenizers import bytes_tokenizer

SHARD_TOKENS = 1 << 26


def write_prepared(folder: Path, total_bytes: int, seed: int = 0) -> Path:
    """A prepared folder of ``total_bytes`` of random uint16 ids (bytes tokenizer), written directly."""
    folder.mkdir(parents=True)
    tok = bytes_tokenizer()
    tok.save(folder)
    rng = np.random.default_rng(seed)
    shards: list[Shard] = []
    left = total_bytes // 2
    unit = 0
    while left > 0:
        n = min(SHARD_TOKENS, left)
        for split, count in (("val", 1 << 16), ("train", n)):
            ids = rng.integers(0, 256, count, dtype=np.uint16)
            data = ids.astype("<u2").tobytes()
            (folder / shard_name(split, unit)).write_bytes(data)
            shards.append(Shard(shard_name(split, unit), split, count, 1, zlib.crc32(data)))
        left -= n
        unit += 1
    index = {
        "format": FORMAT,
        "dtype": dtype_for(tok.vocab_size),
        "vocab_size": tok.vocab_size,
        "tokenizer": {"spec": "bytes", "sha256": tok.hash, "eot_id": tok.eot_id, "file": "tokenizer.json"},
        "shards": [s.__dict__ for s in shards],
    }
    write_json(folder / INDEX, index)
    return folder


def run_job(data: Path, root: Path, name: str, steps: int, *extra: str) -> dict[str, Any]:
    """The default model on 2 ranks for ``steps`` steps: time to the first step, peak RSS per rank, tokens/s."""
    args = ["run", "--data.path", str(data), "--train.steps", str(steps), "--parallel.nproc", "2"]
    args += ["--metrics.log-interval", "1", "--train.eval-interval", "0", "--train.eval-batches", "1"]
    args += ["--train.generate-chars", "0", "--run.root", str(root), "--run.name", name, *extra]
    t0 = time.time()
    proc = subprocess.run([*cli(), *args], capture_output=True, text=True, timeout=600)
    if proc.returncode != 0:
        raise SystemExit(f"{name}: exit {proc.returncode}\n{proc.stderr[-2000:]}")
    records = [json.loads(line) for line in (root / name / "metrics.jsonl").read_text().splitlines()]
    steps_ = [r for r in records if "loss" in r]
    pace = re.search(r"^data: .*$", proc.stdout, re.M)
    return {
        "first_step_s": steps_[0]["time"] - t0,
        "rss": max(steps_[-1]["peak_memory_bytes"]),
        "tokens_per_s": median([r["tokens_per_s"] for r in steps_[1:]]),
        "pace": pace.group(0) if pace else "",
    }


def loader_tokens_per_s(folder: Path, context: int = 256, micro_batch: int = 8, steps: int = 200) -> float:
    """Rank 0 of 2's loader alone over a prepared folder: tokens of its micro-batches per second."""
    from disttrain.data.loader import GlobalBatchLoader
    from disttrain.data.prepared import load_prepared

    data = load_prepared(folder, context)
    loader = GlobalBatchLoader(data.train, micro_batch, 1, 0, 2, seed=1)
    loader.next_step()
    t0 = time.perf_counter()
    for _ in range(steps):
        loader.next_step()
    return steps * micro_batch * context / (time.perf_counter() - t0)


def scale(a: argparse.Namespace, work: Path) -> tuple[dict[str, list[dict[str, Any]]], float]:
    t0 = time.perf_counter()
    folders = {
        "big": write_prepared(work / "big", int(a.big_gb * 2**30)),
        "small": write_prepared(work / "small", a.small_mb * 2**20),
    }
    written = time.perf_counter() - t0
    print(f"wrote {a.big_gb} GB + {a.small_mb} MB of shards in {written:.0f}s", flush=True)
    runs: dict[str, list[dict[str, Any]]] = {"big": [], "small": []}
    for r in range(a.repeats):
        for name in ("big", "small") if r % 2 == 0 else ("small", "big"):
            runs[name].append(run_job(folders[name], work / "runs", f"{name}{r}", a.steps))
    loader = loader_tokens_per_s(folders["big"])
    shutil.rmtree(folders["big"])
    return runs, loader


def on_the_fly(a: argparse.Namespace, work: Path) -> dict[str, dict[str, Any]]:
    (work / "raw").mkdir()
    files = make_corpus(work / "raw", a.raw_mb)
    trained = work / "bpe"
    subprocess.run(
        [*cli(), "data", "prepare", str(files[0]), "--tokenizer", "bpe:8192", "--out", str(trained)],
        capture_output=True,
        check=True,
    )
    out = {}
    for name, tok in (("bytes", "bytes"), ("bpe:8192", str(trained / "tokenizer.json"))):
        out[name] = run_job(work / "raw", work / "runs", f"raw-{name[:3]}", a.steps, "--data.tokenizer", tok)
    return out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--big-gb", type=float, default=4.0)
    p.add_argument("--small-mb", type=int, default=40)
    p.add_argument("--raw-mb", type=int, default=20)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--steps", type=int, default=6)
    a = p.parse_args()
    print_machine()
    work = Path(tempfile.mkdtemp(prefix="bench-data-"))
    try:
        runs, loader = scale(a, work)
        raw = on_the_fly(a, work)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    med = {
        n: {k: median([r[k] for r in rs]) for k in ("first_step_s", "rss", "tokens_per_s")} for n, rs in runs.items()
    }
    # paired: big / small of the same round (a noisy round hits both), then the median over rounds
    rss_ratio = paired_ratio([r["rss"] for r in runs["big"]], [r["rss"] for r in runs["small"]])
    start_ratio = paired_ratio([r["first_step_s"] for r in runs["big"]], [r["first_step_s"] for r in runs["small"]])
    rows = [
        [n, f"{m['rss'] / 2**20:.0f}", f"{m['first_step_s']:.1f}", f"{m['tokens_per_s']:,.0f}"] for n, m in med.items()
    ]
    table(["corpus", "peak RSS MiB/rank", "s to step 1", "trainer tokens/s"], rows, f"{a.big_gb} GB vs {a.small_mb} MB")
    print(f"RSS big/small {rss_ratio:.3f} {verdict(rss_ratio, 1.10, higher_is_better=False)}")
    print(f"start big/small {start_ratio:.3f} {verdict(start_ratio, 1.2, higher_is_better=False)}")
    trainer_rank = med["small"]["tokens_per_s"] / 2
    ratio = loader / trainer_rank
    print(f"loader {loader:,.0f} tokens/s per rank vs trainer {trainer_rank:,.0f}: {ratio:.0f}x {verdict(ratio, 20)}")
    for name, r in raw.items():
        print(f"on the fly, {name}: {r['pace']}")
    write_results(
        "data",
        {
            "runs": runs,
            "medians": med,
            "rss_ratio": rss_ratio,
            "start_ratio": start_ratio,
            "loader_tokens_per_s": loader,
            "loader_ratio": ratio,
            "raw": raw,
            "args": vars(a),
        },
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
