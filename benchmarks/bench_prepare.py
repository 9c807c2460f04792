"""``disttrain data prepare`` throughput vs a user's plain single-process loop calling the same tokenizer.

A corpus of ``--mb`` MB of generated multi-document ``.jsonl`` (4 files) is made once in a temporary folder, and
a byte-level BPE tokenizer is trained on it once (``bpe:VOCAB`` through ``data prepare``, whose tokenizer.json
both sides then load). Then, ``--repeats`` rounds, order alternating:

- **prepare**: ``disttrain data prepare FILES --tokenizer tokenizer.json --out DIR`` as a user runs it (its own
  process, every core), into a fresh folder;
- **plain loop**: its own process running what a user writes::

      ids = []
      for line in f: ids.extend(tok.encode(json.loads(line)["text"]).ids + [eot])
      np.array(ids, dtype=np.uint16).tofile(out)

Both are timed as whole processes (start-up included). Figures: MB/s of input and tokens/s of each, medians,
and the median paired ratio plain time / prepare time (goal >= 1.7 on 2 cores).

    .venv/bin/python -m benchmarks.bench_prepare [--mb 60] [--repeats 5] [--vocab 8192]
"""

from __future__ import annotations

import argparse
import json
import random
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchmarks._common import ROOT, median, paired_ratio, print_machine, table, verdict, write_results

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

WORDS = [w for line in (ROOT / "README.md").read_text().split() for w in [line.strip("`*|#()[]")] if w.isalpha()]


def make_corpus(folder: Path, mb: int) -> list[Path]:
    """4 .jsonl files of about ``mb`` MB in all: documents of 20-600 words drawn from the README's words."""
    rng = random.Random(0)
    files = [folder / f"part{i}.jsonl" for i in range(4)]
    per_file = mb * 2**20 // len(files)
    for path in files:
        with open(path, "w") as f:
            size = 0
            while size < per_file:
                line = json.dumps({"text": " ".join(rng.choices(WORDS, k=rng.randint(20, 600)))}) + "\n"
                f.write(line)
                size += len(line)
    return files


def cli() -> list[str]:
    return [sys.executable, "-c", "from disttrain.cli import main; main()"]


def timed(cmd: list[str]) -> tuple[float, str]:
    t = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(cmd[:6])} failed:\n{proc.stderr[-2000:]}")
    return time.perf_counter() - t, proc.stdout


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--mb", type=int, default=60)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--vocab", type=int, default=8192)
    a = p.parse_args()
    print_machine()
    work = Path(tempfile.mkdtemp(prefix="bench-prepare-"))
    try:
        files = make_corpus(work, a.mb)
        size = sum(f.stat().st_size for f in files)
        trained = work / "trained"
        timed([*cli(), "data", "prepare", str(files[0]), "--tokenizer", f"bpe:{a.vocab}", "--out", str(trained)])
        tok = str(trained / "tokenizer.json")
        times: dict[str, list[float]] = {"prepare": [], "plain": []}
        tokens = 0
        for r in range(a.repeats):
            for name in ("prepare", "plain") if r % 2 == 0 else ("plain", "prepare"):
                out = work / f"{name}{r}"
                if name == "prepare":
                    cmd = [*cli(), "data", "prepare", *map(str, files), "--tokenizer", tok, "--out", str(out)]
                    dt, _ = timed([*cmd, "--val-fraction", "0"])
                else:
                    dt, printed = timed([sys.executable, "-c", PLAIN, tok, str(out), *map(str, files)])
                    tokens = int(printed.split()[-1])
                times[name].append(dt)
                if out.is_dir():
                    shutil.rmtree(out)
                out.unlink(missing_ok=True)
        ratio = paired_ratio(times["plain"], times["prepare"])
        rows = [
            [name, f"{median(ts):.2f}", f"{size / median(ts) / 1e6:.1f}", f"{tokens / median(ts) / 1e6:.2f}"]
            for name, ts in times.items()
        ]
        table(["variant", "s (median)", "MB/s", "M tokens/s"], rows, f"{size / 1e6:.0f} MB, {tokens:,} tokens")
        print(f"prepare vs plain loop: {ratio:.2f}x {verdict(ratio, 1.7)}")
        write_results("prepare", {"bytes": size, "tokens": tokens, "times": times, "ratio": ratio, "vocab": a.vocab})
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
