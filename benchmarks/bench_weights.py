"""Peak host memory of starting FSDP(2) from pretrained weights: disttrain's ``--model.weights`` (meta build,
each rank reads only its slices of the safetensors file) vs every rank building the model and loading the
whole file (``load_file`` + ``load_state_dict``, then ``fully_shard``), as a hand-written start does.

A Hugging Face GPT-2 (8 blocks, width 512 by default: ~100 MB in fp32) is saved with ``save_pretrained``;
each variant starts in fresh processes (peak RSS is a high-water mark), alternating, ``--launches`` times.
The figure is the peak RSS (VmHWM, reset after imports) above the RSS after imports, the larger of the two ranks.
Goal: disttrain / whole-file <= 0.6.

    .venv/bin/python -m benchmarks.bench_weights [--launches 3] [--layers 8] [--width 512]
"""

from __future__ import annotations

import argparse
import resource
import sys
import tempfile
from pathlib import Path
from typing import Any

import torch

from benchmarks import _common as C
from disttrain.testing.launch import finish_worker, is_worker, launch_and_collect, write_rank_result

GOAL = 0.6
VOCAB = 128


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--launches", type=int, default=3, help="fresh launches per variant (median over them)")
    p.add_argument("--layers", type=int, default=8)
    p.add_argument("--width", type=int, default=512)
    p.add_argument("--variant", choices=("disttrain", "whole"), default=None, help=argparse.SUPPRESS)
    p.add_argument("--weights", default=None, help=argparse.SUPPRESS)
    p.add_argument("--out", default=None, help=argparse.SUPPRESS)
    return p.parse_args(argv)


def hf_config(args: argparse.Namespace) -> Any:
    from transformers import GPT2Config

    return GPT2Config(vocab_size=VOCAB, n_positions=128, n_embd=args.width, n_layer=args.layers, n_head=8)


def rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * resource.getpagesize()


def reset_peak() -> None:
    """Start the process's peak-RSS mark (VmHWM) again from its current RSS (Linux: clear_refs 5)."""
    Path("/proc/self/clear_refs").write_text("5")


def peak_bytes() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError("no VmHWM in /proc/self/status")


def start_disttrain(args: argparse.Namespace) -> torch.nn.Module:
    """What ``disttrain run --model.weights`` does: meta build, shards initialised, each rank's slices read."""
    from transformers import GPT2LMHeadModel

    from disttrain.checkpoint.pretrained import load_pretrained
    from disttrain.config import ParallelConfig
    from disttrain.parallel.strategy import parallelize

    with torch.device("meta"):
        model = GPT2LMHeadModel(hf_config(args))
    parallelize(model, ParallelConfig(strategy="fsdp", init="meta"), device=torch.device("cpu"))
    load_pretrained(model, args.weights)
    return model


def start_whole(args: argparse.Namespace) -> torch.nn.Module:
    """The hand-written start: the full model and the full file on every rank, then sharded."""
    from safetensors.torch import load_file
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    from transformers import GPT2LMHeadModel

    model = GPT2LMHeadModel(hf_config(args))
    model.load_state_dict(load_file(str(Path(args.weights) / "model.safetensors")), strict=False)
    mesh = init_device_mesh("cpu", (2,))
    for block in model.transformer.h:
        fully_shard(block, mesh=mesh)
    fully_shard(model, mesh=mesh)
    return model


def worker(args: argparse.Namespace) -> None:
    C.one_thread()
    import torch.distributed as dist
    import transformers  # noqa: F401  (imported before the baseline: its own memory is not the figure)

    from disttrain.parallel.env import init_distributed

    env = init_distributed("cpu", threads=1)
    base = rss_bytes()
    reset_peak()  # import-time peaks are not the figure
    model = start_disttrain(args) if args.variant == "disttrain" else start_whole(args)
    peak = peak_bytes()
    local = sum(p.to_local().numel() * 4 for p in model.parameters())  # type: ignore[attr-defined]
    dist.barrier()
    write_rank_result(args.out, env.rank, {"peak_above_start": peak - base, "shard_bytes": local})
    finish_worker()


def main(argv: list[str]) -> None:
    args = parse_args(argv)
    if is_worker():
        worker(args)
        return
    from transformers import GPT2LMHeadModel

    with tempfile.TemporaryDirectory(prefix="disttrain-weights-") as tmp:
        torch.manual_seed(0)
        full = GPT2LMHeadModel(hf_config(args))
        full.save_pretrained(tmp)
        size = sum(p.numel() * 4 for p in full.parameters())
        del full
        peaks: dict[str, list[float]] = {"disttrain": [], "whole": []}
        for i in range(args.launches):
            for variant in peaks:
                print(f"launch {i + 1}/{args.launches}: {variant} ...", flush=True)
                ranks = launch_and_collect(
                    2, Path(__file__), [*argv, "--variant", variant, "--weights", tmp], echo=True
                )
                peaks[variant].append(max(r["peak_above_start"] for r in ranks))
    dt, whole = C.median(peaks["disttrain"]), C.median(peaks["whole"])
    ratio = dt / whole
    rows = [
        ["whole file on every rank", whole / 2**20, size / 2**20, 1.0, "", ""],
        ["disttrain --model.weights", dt / 2**20, size / 2**20, ratio, f"<= {GOAL}", ""],
    ]
    rows[1][-1] = C.verdict(ratio, GOAL, higher_is_better=False)
    title = (
        f"Starting FSDP(2) from a {size / 2**20:.0f} MiB safetensors file (HF GPT-2 {args.layers}x{args.width}), "
        f"median over {args.launches} launches"
    )
    headers = ["variant", "peak RSS above start (MiB, max over 2 ranks)", "model (MiB, fp32)", "ratio", "goal", ""]
    C.table(headers, rows, title=title)
    C.write_results("bench_weights", {"config": vars(args), "model_bytes": size, "peaks": peaks, "ratio": ratio})


if __name__ == "__main__":
    main(sys.argv[1:])
