"""``disttrain ckpt ls|inspect|verify|export``: arguments for the checkpoint tools."""

from __future__ import annotations

import argparse
from pathlib import Path


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="disttrain ckpt", description="Look into, check and convert checkpoints.")
    sub = p.add_subparsers(dest="action", required=True, metavar="ls|inspect|verify|export")
    where = "a run folder, its checkpoints folder, or one step-N folder"
    ls = sub.add_parser("ls", help="steps, sizes, complete or not, world size and strategy")
    ls.add_argument("path", type=Path, metavar="RUN_OR_FOLDER", help=where)
    ls.add_argument("--json", action="store_true", help="machine-readable output")
    pick = f"{where} (a folder means its newest complete checkpoint)"
    ins = sub.add_parser("inspect", help="keys, shapes, dtypes, per-rank shard sizes")
    ver = sub.add_parser("verify", help="every tensor readable, checksums match (exit 1 if not)")
    exp = sub.add_parser("export", help="one file of model weights, loadable without a process group")
    for s in (ins, ver, exp):
        s.add_argument("path", type=Path, metavar="RUN_OR_FOLDER", help=pick)
        s.add_argument("--step", type=int, default=None, help="this step instead of the newest")
    for s in (ins, ver):
        s.add_argument("--json", action="store_true", help="machine-readable output")
    ins.add_argument("--prefix", default="", help="only keys starting with this (e.g. app.model.)")
    ver.add_argument("--all", action="store_true", help="every checkpoint in the folder")
    exp.add_argument(
        "--format",
        choices=("torch", "safetensors", "hf"),
        default=None,
        help="default: safetensors; hf: a folder from_pretrained loads (model.safetensors, config.json and the "
        "run's tokenizer files)",
    )
    exp.add_argument("--config-from", type=Path, default=None, help="hf: copy config.json etc. from this folder")
    exp.add_argument("--dtype", choices=("fp32", "bf16", "fp16"), default="fp32")
    exp.add_argument(
        "--out", type=Path, default=None, help="default: model.<pt|safetensors>, or the folder hf/, in the run folder"
    )
    a = p.parse_args(argv)
    from disttrain.checkpoint import tools as ckpt_tools

    if a.action == "ls":
        return ckpt_tools.ls(a.path, a.json)
    if a.action == "inspect":
        return ckpt_tools.inspect(a.path, a.step, a.json, a.prefix)
    if a.action == "verify":
        return ckpt_tools.verify(a.path, a.step, a.json, a.all)
    return ckpt_tools.export(a.path, a.step, a.format, a.dtype, a.out, a.config_from)
