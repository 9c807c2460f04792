"""``disttrain data prepare|verify``: arguments for turning a corpus into token shards and checking them."""

from __future__ import annotations

import argparse
from pathlib import Path

PREPARE = (
    "Tokenize a corpus once into token shards (uint16/uint32 .bin files, index.json, tokenizer.json) that "
    "`disttrain run --data.path DIR` trains on. Every core; a re-run continues where a killed one stopped."
)


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="disttrain data", description="Prepare a corpus into token shards; check them.")
    sub = p.add_subparsers(dest="action", required=True, metavar="prepare|verify")
    pre = sub.add_parser("prepare", help="tokenize text / .jsonl / .parquet (.gz) into shards", description=PREPARE)
    pre.add_argument("inputs", nargs="+", metavar="INPUT", help="text, .jsonl, .parquet files (.gz too) or folders")
    pre.add_argument(
        "--tokenizer",
        required=True,
        metavar="T",
        help="a tokenizer.json, a folder saved by save_pretrained, bytes, chars, or bpe:VOCAB (trained on the corpus)",
    )
    pre.add_argument("--out", required=True, type=Path, metavar="DIR", help="the folder the shards go to")
    pre.add_argument("--text-field", default="text", help="jsonl field / parquet column of the text (default: text)")
    pre.add_argument("--val-fraction", type=float, default=0.01, help="documents held out (default: 0.01)")
    pre.add_argument(
        "--shard-tokens", type=int, default=1 << 26, help="tokens per shard, at most about (default: 2^26)"
    )
    pre.add_argument("--workers", type=int, default=0, help="worker processes (default: one per core)")
    ver = sub.add_parser("verify", help="every shard there, of its size and CRC32 (exit 1 if not)")
    ver.add_argument("folder", type=Path, metavar="DIR", help="a folder made by `disttrain data prepare`")
    ver.add_argument("--json", action="store_true", help="machine-readable output")
    a = p.parse_args(argv)
    from disttrain.jobs import data as job

    if a.action == "verify":
        return job.verify(a.folder, a.json)
    cfg = job.PrepareConfig(
        tuple(a.inputs), a.tokenizer, str(a.out), a.text_field, a.val_fraction, a.shard_tokens, a.workers
    )
    return job.prepare(cfg)
