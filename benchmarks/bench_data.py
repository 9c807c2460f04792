"""Data (``--parts``, default both): ``disttrain data prepare``'s throughput, and a 4 GB prepared corpus costing no
more memory or start-up than a 40 MB one, the loader never setting the pace of the default model.

``prepare``: ``disttrain data prepare`` (its own process, every core) vs the loop a user writes (:data:`PLAIN`),
   both whole processes calling the same byte-level BPE (``bpe:VOCAB``, trained once by ``data prepare``) on
   ``--mb`` MB of generated ``.jsonl``; MB/s and tokens/s; goal: plain time / prepare time >= 1.7.
``scale``: two prepared folders of random ids (``bytes`` tokenizer) written directly with the shards module,
   ``--big-gb`` and ``--small-mb``, each trained on by ``disttrain run`` (the default model, 2 ranks): peak RSS per
   rank and time from the launch to the first step; goals: big / small <= 1.10 (RSS) and <= 1.2 (time). Then rank
   0's loader alone over the big folder against the trainer's tokens/s per rank (goal >= 20x), and one job each on
   ``--raw-mb`` of ``.jsonl`` tokenized on the fly (``bytes``, a BPE): its ``data:`` line.
"""

from __future__ import annotations

import argparse
import itertools
import json
import random
import re
import shutil
import sys
import time
import zlib
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks import harness as H
from disttrain.data.shards import FORMAT, INDEX, Shard, dtype_for, shard_name, write_json
from disttrain.data.tokenizers import bytes_tokenizer
from disttrain.testing.launch import DISTTRAIN

GOALS = {
    "prepare": H.Goal("plain loop time / data prepare time", 1.7),
    "rss": H.Goal("peak RSS, big / small corpus", 1.10, higher_is_better=False),
    "start": H.Goal("time to step 1, big / small corpus", 1.2, higher_is_better=False),
    "loader": H.Goal("loader / trainer tokens/s per rank", 20),
}
OPTIONS = {
    **H.options(rounds=5, steps=6),
    "parts": ("prepare,scale", "which parts, comma-separated"),
    "vocab": (8192, "the BPE's vocabulary"),
    "mb": (60, "prepare: MB of generated .jsonl"),
    "big_gb": (4.0, "scale: the big prepared folder, GB"),
    "small_mb": (40, "scale: the small prepared folder, MB"),
    "raw_mb": (20, "scale: generated .jsonl for the on-the-fly jobs, MB"),
}
QUICK = {"mb": 2, "big_gb": 0.05, "small_mb": 10, "raw_mb": 1, "rounds": 1, "steps": 3, "vocab": 512}
SHARD_TOKENS = 1 << 26
PLAIN = """
import json, sys
import numpy as np
from tokenizers import Tokenizer
tok = Tokenizer.from_file(sys.argv[1])
eot = tok.token_to_id("<|endoftext|>")
ids = []
for name in sys.argv[3:]:
    with open(name) as f:
        for line in f:
            ids.extend(tok.encode(json.loads(line)["text"]).ids + [eot])
np.array(ids, dtype=np.uint16).tofile(sys.argv[2])
print(len(ids))
"""
WORDS = [w for line in (H.ROOT / "README.md").read_text().split() for w in [line.strip("`*|#()[]")] if w.isalpha()]


def make_corpus(folder: Path, mb: float) -> list[Path]:
    """4 .jsonl files of about ``mb`` MB in all: documents of 20-600 words drawn from the README's words."""
    rng = random.Random(0)
    files = [folder / f"part{i}.jsonl" for i in range(4)]
    for path in files:
        with open(path, "w") as f:
            size = 0
            while size < mb * 2**20 / len(files):
                line = json.dumps({"text": " ".join(rng.choices(WORDS, k=rng.randint(20, 600)))}) + "\n"
                size += f.write(line)
    return files


def train_bpe(corpus: Path, vocab: int, out: Path) -> Path:
    """A byte-level BPE of ``vocab`` ids trained by ``data prepare`` on ``corpus``: its tokenizer.json."""
    H.command([str(DISTTRAIN), "data", "prepare", str(corpus), "--tokenizer", f"bpe:{vocab}", "--out", str(out)])
    return out / "tokenizer.json"


@H.in_tmp
def run_prepare(args: argparse.Namespace, work: Path) -> dict[str, Any]:
    files = [str(f) for f in make_corpus(work, args.mb)]
    tok, out = str(train_bpe(Path(files[0]), args.vocab, work / "trained")), work / "prepared"

    def prepare() -> H.Ran:
        options = ["--tokenizer", tok, "--out", str(out), "--val-fraction", "0"]
        ran = H.command([str(DISTTRAIN), "data", "prepare", *files, *options])
        shutil.rmtree(out)  # each round writes afresh
        return ran

    def plain() -> H.Ran:
        ran = H.command([sys.executable, "-c", PLAIN, tok, str(work / "plain.bin"), *files])
        (work / "plain.bin").unlink()
        return ran

    runs = H.side_by_side({"prepare": prepare, "plain": plain}, args.rounds)
    size = sum(Path(f).stat().st_size for f in files)
    times = {n: [r.wall_s for r in rs] for n, rs in runs.items()}
    tokens = int(runs["plain"][0].stdout.split()[-1])
    med = {n: H.median(ts) for n, ts in times.items()}
    rows = [
        {"variant": n, "s (median)": t, "MB/s": size / t / 1e6, "M tokens/s": tokens / t / 1e6} for n, t in med.items()
    ]
    H.table(rows, f"{size / 1e6:.0f} MB, {tokens:,} tokens")
    goals = [GOALS["prepare"].check(H.paired_ratio(times["plain"], times["prepare"]))]
    return {"bytes": size, "tokens": tokens, "rows": rows, "goals": goals, "times": times}


def write_prepared(folder: Path, total_bytes: int, seed: int = 0) -> Path:
    """A prepared folder of ``total_bytes`` of random uint16 ids (bytes tokenizer), written directly."""
    folder.mkdir(parents=True)
    tok = bytes_tokenizer()
    tok.save(folder)
    rng, shards, left = np.random.default_rng(seed), [], total_bytes // 2
    for unit in itertools.count():
        if left <= 0:
            break
        n = min(SHARD_TOKENS, left)
        for split, count in (("val", 1 << 16), ("train", n)):
            data = rng.integers(0, 256, count, dtype=np.uint16).astype("<u2").tobytes()
            (folder / shard_name(split, unit)).write_bytes(data)
            shards.append(Shard(shard_name(split, unit), split, count, 1, zlib.crc32(data)))
        left -= n
    tokenizer = {"spec": "bytes", "sha256": tok.hash, "eot_id": tok.eot_id, "file": "tokenizer.json"}
    index = {"format": FORMAT, "dtype": dtype_for(tok.vocab_size), "vocab_size": tok.vocab_size, "tokenizer": tokenizer}
    write_json(folder / INDEX, index | {"shards": [s.__dict__ for s in shards]})
    return folder


def run_job(data: Path, root: Path, name: str, steps: int, *extra: str) -> dict[str, Any]:
    """The default model on 2 ranks for ``steps`` steps: time to the first step, peak RSS per rank, tokens/s."""
    args = f"--train.steps {steps} --parallel.nproc 2 --metrics.log-interval 1 --train.eval-interval 0"
    args += " --train.eval-batches 1 --train.generate-chars 0"
    t0 = time.time()
    ran = H.disttrain("run", "--data.path", str(data), *args.split(), *extra, root=root, name=name, timeout=600)
    recs = [r for r in H.records(root / name / "metrics.jsonl") if "loss" in r]
    pace = re.search(r"^data: .*$", ran.stdout, re.M)
    return {"first_step_s": recs[0]["time"] - t0, "rss": max(recs[-1]["peak_memory_bytes"])} | {
        "tokens_per_s": H.median([r["tokens_per_s"] for r in recs[1:]]),
        "pace": pace.group(0) if pace else "",
    }


def loader_tokens_per_s(folder: Path, context: int = 256, micro_batch: int = 8, steps: int = 200) -> float:
    """Rank 0 of 2's loader alone over a prepared folder: tokens of its micro-batches per second."""
    from disttrain.data.loader import GlobalBatchLoader
    from disttrain.data.prepared import load_prepared

    loader = GlobalBatchLoader(load_prepared(folder, context).train, micro_batch, 1, 0, 2, seed=1)
    loader.next_step()
    t0 = time.perf_counter()
    for _ in range(steps):
        loader.next_step()
    return steps * micro_batch * context / (time.perf_counter() - t0)


def scale(args: argparse.Namespace, work: Path) -> tuple[dict[str, list[dict[str, Any]]], float]:
    t0 = time.perf_counter()
    folders = {"big": write_prepared(work / "big", int(args.big_gb * 2**30))}
    folders["small"] = write_prepared(work / "small", args.small_mb * 2**20)
    print(f"wrote {args.big_gb} GB + {args.small_mb} MB of shards in {time.perf_counter() - t0:.0f}s", flush=True)
    count = itertools.count()
    jobs = {n: lambda n=n, f=f: run_job(f, work / "runs", f"{n}{next(count)}", args.steps) for n, f in folders.items()}
    runs = H.side_by_side(jobs, args.rounds)
    loader = loader_tokens_per_s(folders["big"])
    shutil.rmtree(folders["big"])
    return runs, loader


def on_the_fly(args: argparse.Namespace, work: Path) -> dict[str, dict[str, Any]]:
    (work / "raw").mkdir()
    files = make_corpus(work / "raw", args.raw_mb)
    toks = {"bytes": "bytes", f"bpe:{args.vocab}": str(train_bpe(files[0], args.vocab, work / "bpe"))}
    return {
        n: run_job(work / "raw", work / "runs", f"raw-{n[:3]}", args.steps, "--data.tokenizer", t)
        for n, t in toks.items()
    }


@H.in_tmp
def run_scale(args: argparse.Namespace, work: Path) -> dict[str, Any]:
    runs, loader = scale(args, work)
    raw = on_the_fly(args, work)
    med = {
        n: {k: H.median([r[k] for r in rs]) for k in ("first_step_s", "rss", "tokens_per_s")} for n, rs in runs.items()
    }
    rows = [
        {"corpus": n, "peak RSS MiB/rank": m["rss"] / 2**20, "s to step 1": m["first_step_s"]}
        | {"trainer tokens/s": m["tokens_per_s"]}
        for n, m in med.items()
    ]
    H.table(rows, f"{args.big_gb} GB vs {args.small_mb} MB")
    # paired: big / small of the same round (a noisy round hits both), then the median over rounds
    ratios = {k: H.paired_ratio(*([r[k] for r in runs[n]] for n in ("big", "small"))) for k in ("rss", "first_step_s")}
    trainer_rank = med["small"]["tokens_per_s"] / 2
    print(f"loader {loader:,.0f} tokens/s per rank vs trainer {trainer_rank:,.0f}")
    for name, r in raw.items():
        print(f"on the fly, {name}: {r['pace']}")
    goals = [GOALS["rss"].check(ratios["rss"]), GOALS["start"].check(ratios["first_step_s"])]
    goals.append(GOALS["loader"].check(loader / trainer_rank))
    return {"rows": rows, "goals": goals, "loader_tokens_per_s": loader, "runs": runs, "raw": raw}


def run(args: argparse.Namespace) -> dict[str, Any]:
    return H.parts(args, __file__, {"prepare": run_prepare, "scale": run_scale})


if __name__ == "__main__":
    H.main(__file__, __doc__, OPTIONS, QUICK, run)
