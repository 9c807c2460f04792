"""``disttrain data prepare`` throughput vs a user's plain single-process loop calling the same tokenizer.

A corpus of ``--mb`` MB of generated multi-document ``.jsonl`` (4 files) and a byte-level BPE trained on it
(``bpe:VOCAB`` through ``data prepare``) are made once; then ``--rounds`` rounds, the order alternating, of
``disttrain data prepare FILES --tokenizer tokenizer.json --out DIR`` (its own process, every core) and of the
loop a user writes (:data:`PLAIN`: encode line by line, ``np.array(ids, uint16).tofile``), both timed as whole
processes. Figures: MB/s and tokens/s of each; the paired ratio plain time / prepare time (goal >= 1.7).

    .venv/bin/python -m benchmarks.bench_prepare [--mb 60] [--rounds 5] [--vocab 8192]
"""

from __future__ import annotations

import argparse
import itertools
import json
import random
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any

from benchmarks import harness as H
from disttrain.testing.launch import DISTTRAIN

GOAL = H.Goal("plain loop time / data prepare time", 1.7)
OPTIONS = {"mb": (60, "MB of generated .jsonl"), "rounds": (5, "rounds of the two"), "vocab": (8192, "BPE vocabulary")}
QUICK = {"mb": 2, "rounds": 1, "vocab": 512}
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


def run(args: argparse.Namespace) -> dict[str, Any]:
    work = Path(tempfile.mkdtemp(prefix="bench-prepare-"))
    try:
        files = [str(f) for f in make_corpus(work, args.mb)]
        tok = str(train_bpe(Path(files[0]), args.vocab, work / "trained"))
        fresh = itertools.count()

        def prepare() -> H.Ran:
            out = work / f"prepare{next(fresh)}"
            options = ["--tokenizer", tok, "--out", str(out), "--val-fraction", "0"]
            ran = H.command([str(DISTTRAIN), "data", "prepare", *files, *options])
            shutil.rmtree(out)
            return ran

        def plain() -> H.Ran:
            out = work / "plain.bin"
            ran = H.command([sys.executable, "-c", PLAIN, tok, str(out), *files])
            out.unlink()
            return ran

        runs = H.side_by_side({"prepare": prepare, "plain": plain}, args.rounds)
        size = sum(Path(f).stat().st_size for f in files)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    times = {n: [r.wall_s for r in rs] for n, rs in runs.items()}
    tokens = int(runs["plain"][0].stdout.split()[-1])
    med = {n: H.median(ts) for n, ts in times.items()}
    rows = [
        {"variant": n, "s (median)": t, "MB/s": size / t / 1e6, "M tokens/s": tokens / t / 1e6} for n, t in med.items()
    ]
    H.table(rows, f"{size / 1e6:.0f} MB, {tokens:,} tokens")
    goals = [GOAL.check(H.paired_ratio(times["plain"], times["prepare"]))]
    return {"name": "prepare", "bytes": size, "tokens": tokens, "rows": rows, "goals": goals, "times": times}


if __name__ == "__main__":
    H.main(__file__, __doc__, OPTIONS, QUICK, run)
