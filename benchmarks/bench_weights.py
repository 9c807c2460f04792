"""Peak host memory of starting FSDP(2) from pretrained weights: ``--model.weights`` (meta build, each rank reads
only its slices of the safetensors file) vs every rank loading the whole file, then ``fully_shard``. A Hugging
Face GPT-2 (8 x 512); each variant in fresh processes, alternating; the peak RSS above the RSS after imports, the
larger of the two ranks. Goal: disttrain / whole file <= 0.6.
"""

from __future__ import annotations

import argparse
import functools
import resource
import tempfile
from pathlib import Path
from typing import Any

import torch

from benchmarks import harness as H

GOAL = H.Goal("peak RSS, disttrain --model.weights / whole file", 0.6, higher_is_better=False)
OPTIONS = {
    **H.options(launches=3, layers=8, width=512),  # of a Hugging Face GPT-2
    "variant": (None, None, ("disttrain", "whole")),  # the workers'
    "weights": (None, None),
}
QUICK = {"launches": 1, "layers": 2, "width": 128}
VOCAB = 128


def hf_config(args: argparse.Namespace) -> Any:
    from transformers import GPT2Config

    return GPT2Config(vocab_size=VOCAB, n_positions=128, n_embd=args.width, n_layer=args.layers, n_head=8)


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
    from disttrain.parallel.parallelize import parallelize

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
    for unit in [*model.transformer.h, model]:
        fully_shard(unit, mesh=mesh)
    return model


def worker(args: argparse.Namespace) -> dict[str, Any]:
    import torch.distributed as dist
    import transformers  # noqa: F401  (imported before the baseline: its own memory is not the figure)

    H.init_ranks()
    with open("/proc/self/statm") as f:
        base = int(f.read().split()[1]) * resource.getpagesize()
    Path("/proc/self/clear_refs").write_text("5")  # the peak-RSS mark (VmHWM) starts again from here
    start_disttrain(args) if args.variant == "disttrain" else start_whole(args)
    peak = peak_bytes()
    dist.barrier()
    return {"peak_above_start": peak - base}


def run(args: argparse.Namespace) -> dict[str, Any]:
    from transformers import GPT2LMHeadModel

    with tempfile.TemporaryDirectory(prefix="disttrain-weights-") as tmp:
        torch.manual_seed(0)
        full = GPT2LMHeadModel(hf_config(args))
        full.save_pretrained(tmp)
        size = sum(p.numel() * 4 for p in full.parameters())
        del full

        def start(variant: str) -> float:
            ranks = H.ranks(2, __file__, [*args.argv, "--variant", variant, "--weights", tmp])
            return max(r["peak_above_start"] for r in ranks)

        peaks = H.side_by_side({v: functools.partial(start, v) for v in ("disttrain", "whole")}, args.launches)
    dt, whole = H.median(peaks["disttrain"]), H.median(peaks["whole"])
    rows = [{"variant": "whole file on every rank", "peak RSS above start MiB (the larger rank)": whole / 2**20}]
    rows.append({"variant": "disttrain --model.weights", "peak RSS above start MiB (the larger rank)": dt / 2**20})
    rows[1]["ratio"] = dt / whole
    title = f"Starting FSDP(2) from a {size / 2**20:.0f} MiB safetensors file (HF GPT-2 {args.layers}x{args.width})"
    H.table(rows, f"{title}, median over {args.launches} launches")
    return {"model_bytes": size, "rows": rows, "peaks": peaks, "goals": [GOAL.check(dt / whole)]}


if __name__ == "__main__":
    H.main(__file__, __doc__, OPTIONS, QUICK, run, worker)
