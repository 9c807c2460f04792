"""disttrain's Trainer vs a plain hand-written PyTorch loop: throughput ratio for DDP and for FSDP2.

Both train the same GPT (4 x 256, context 128; ``--model hf-gpt2``: a Hugging Face GPT2LMHeadModel of that shape)
with the same batch on 2 ranks in one launch. The plain loop (:class:`PlainLoop`) is what one writes from the
PyTorch docs: DDP with ``torch.autocast``, or ``fully_shard`` per block then the root with a
``MixedPrecisionPolicy``; fp32 cross-entropy, ``clip_grad_norm_``, AdamW, warmup + cosine LR; its AdamW
implementation and DDP's bucket size are disttrain's, so the ratio is the framework's cost. Goal: >= 0.97, the
median over ``--launches`` launches.
"""

from __future__ import annotations

import argparse
import math
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from benchmarks import harness as H
from disttrain.config import DTYPES

GOAL = H.Goal("disttrain / plain throughput", 0.97)
OPTIONS = {
    **H.options(launches=5, nproc=2, rounds=6, steps_per_block=2, warmup=3),
    **H.options(layers=4, width=256, heads=4, context=128, micro_batch=8),
    "strategies": ("ddp,fsdp", "comma-separated"),
    "dtype": ("bf16", "compute dtype (fp32 where bf16 is emulated)", ("bf16", "fp32")),
    "model": ("gpt", "the built-in GPT or a Hugging Face GPT-2 of that shape", ("gpt", "hf-gpt2")),
}
QUICK = {"launches": 1, **H.QUICK_BLOCKS, **H.QUICK_GPT}


# -- the plain loop -------------------------------------------------------------------------------------
def bench_model(args: argparse.Namespace, vocab: int) -> tuple[nn.Module, list[nn.Module]]:
    """The benchmarked model (the same weights for both variants) and its blocks (FSDP's units)."""
    torch.manual_seed(1234)
    if args.model == "hf-gpt2":
        from transformers import GPT2Config, GPT2LMHeadModel

        shape = {"n_positions": args.context, "n_embd": args.width, "n_layer": args.layers, "n_head": args.heads}
        hf = GPT2LMHeadModel(GPT2Config(vocab_size=vocab, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, **shape))
        return hf, list(hf.transformer.h)
    from disttrain.models.gpt import GPT, GPTConfig

    model = GPT(GPTConfig(vocab, args.layers, args.width, args.heads, args.context), seed=1234)
    return model, list(model.blocks)


class PlainLoop:
    """A hand-written training loop, no disttrain code in the step (the model class is shared); ``settings``: the
    AdamW implementation (``fused`` / ``foreach``) and DDP's ``bucket_cap_mb``."""

    def __init__(
        self, strategy: str, args: argparse.Namespace, data: Any, total: int, settings: dict[str, Any]
    ) -> None:
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
        from torch.nn.parallel import DistributedDataParallel as DDP

        self.ddp, self.dtype, self.micro = strategy == "ddp", args.dtype, args.micro_batch
        self.data, self.total = data, total
        model, blocks = bench_model(args, data.tokenizer.vocab_size)
        if self.ddp:
            self.model: nn.Module = DDP(model, bucket_cap_mb=settings["bucket_cap_mb"])
        else:
            mesh = init_device_mesh("cpu", (dist.get_world_size(),))
            mp = MixedPrecisionPolicy(param_dtype=DTYPES[args.dtype], reduce_dtype=torch.float32)
            for unit in [*blocks, model]:
                fully_shard(unit, mesh=mesh, mp_policy=mp)
            self.model = model
        emb = {id(m.weight) for m in model.modules() if isinstance(m, nn.Embedding)}
        decay = [p for p in self.model.parameters() if p.dim() >= 2 and id(p) not in emb]
        rest = [p for p in self.model.parameters() if not (p.dim() >= 2 and id(p) not in emb)]
        groups = [{"params": decay, "weight_decay": 0.1}, {"params": rest, "weight_decay": 0.0}]
        opts = {"fused": settings["fused"], "foreach": settings["foreach"]}
        self.opt = torch.optim.AdamW(groups, lr=3e-3, betas=(0.9, 0.95), **opts)
        self.gen = torch.Generator().manual_seed(1234 + dist.get_rank())
        self.step_no = 0

    def lr(self, step: int, peak: float = 3e-3, warm: int = 30, floor: float = 0.1) -> float:
        if step < warm:
            return peak * (step + 1) / warm
        progress = min((step - warm) / max(self.total - warm - 1, 1), 1.0)
        return peak * (floor + (1 - floor) * 0.5 * (1 + math.cos(math.pi * progress)))

    def batch(self) -> tuple[torch.Tensor, torch.Tensor]:
        idx = torch.randint(len(self.data.train), (self.micro,), generator=self.gen).tolist()
        xs, ys = zip(*(self.data.train[i] for i in idx), strict=True)
        return torch.stack(xs), torch.stack(ys)

    def run(self, n: int) -> None:
        for _ in range(n):
            for g in self.opt.param_groups:
                g["lr"] = self.lr(self.step_no)
            x, y = self.batch()
            if self.ddp and self.dtype != "fp32":
                with torch.autocast("cpu", dtype=DTYPES[self.dtype]):
                    out = self.model(x)
            else:
                out = self.model(x)
            logits = out if isinstance(out, torch.Tensor) else out.logits
            loss = F.cross_entropy(logits.float().view(-1, logits.shape[-1]), y.view(-1))
            loss.backward()
            torch.nn.utils.clip_grad_norm_(self.model.parameters(), 1.0)
            self.opt.step()
            self.opt.zero_grad(set_to_none=True)
            loss.item()
            self.step_no += 1


def timed_pair(trainer: Any, loops: dict[str, PlainLoop], args: argparse.Namespace) -> dict[str, list[float]]:
    """``Trainer.fit()`` and the plain loop(s) in blocks, interleaved, inside one collector context: it stands for
    the one a whole fit() opens (one full collection at its start), so a block does not pay that start-up again."""
    from disttrain.utils.gc import GarbageCollection

    variants = {"disttrain": lambda n: H.fit_for(trainer, n), **{k: loop.run for k, loop in loops.items()}}
    with GarbageCollection(trainer.cfg.train.gc_interval):
        times = H.interleave(variants, **H.blocks(args), before_block=dist.barrier)
    return H.slowest_rank(times)


def worker(args: argparse.Namespace) -> dict[str, Any]:
    env, data = H.init_ranks(), H.text(args.context)
    total = args.warmup + args.rounds * args.steps_per_block
    out = {}
    for strategy in args.strategies.split(","):
        shape = H.gpt_of(args)
        sections: dict[str, Any] = {"parallel": {"strategy": strategy}, "precision": {"dtype": args.dtype}}
        cfg = H.job(shape, world=env.world_size, micro_batch=args.micro_batch, steps=total, **sections)
        model = None if args.model == "gpt" else bench_model(args, data.tokenizer.vocab_size)[0]
        trainer = H.trainer(cfg, data, env, model=model)  # a HF model: the plain loop's, on CPU (parallel.init auto)
        d = trainer.optimizer.defaults
        settings = {"fused": d.get("fused"), "foreach": d.get("foreach"), "bucket_cap_mb": cfg.parallel.ddp_bucket_mb}
        out[strategy] = timed_pair(trainer, {"plain": PlainLoop(strategy, args, data, total, settings)}, args)
        del trainer
    return out


def strategy_row(strategy: str, runs: list[dict[str, list[float]]]) -> dict[str, Any]:
    """One strategy over every launch: the median of the launches' paired ratios, the step times."""
    per_launch = sorted(H.paired_ratio(t["plain"], t["disttrain"]) for t in runs)
    return {
        "strategy": strategy,
        "plain ms/step": H.median([x for t in runs for x in t["plain"]]) * 1e3,
        "disttrain ms/step": H.median([x for t in runs for x in t["disttrain"]]) * 1e3,
        "ratio": H.median(per_launch),
        "per launch": " ".join(f"{r:.3f}" for r in per_launch),
    }


def run(args: argparse.Namespace) -> dict[str, Any]:
    launches = []
    for i in range(args.launches):
        print(f"launch {i + 1}/{args.launches} ...", flush=True)
        launches.append(H.ranks(args.nproc, __file__, args.argv)[0])
    rows = [strategy_row(s, [launch[s] for launch in launches]) for s in launches[0]]
    model = f"{args.model} {args.layers}x{args.width} ctx {args.context}, micro-batch {args.micro_batch}, {args.dtype}"
    H.table(rows, f"Trainer vs plain PyTorch loop: {args.nproc} ranks, {model}; median of {args.launches} launches")
    goals = [GOAL.check(r["ratio"]) for r in rows]
    name = "bench_overhead" if args.model == "gpt" else f"bench_overhead_{args.model.replace('-', '_')}"
    return {"name": name, "rows": rows, "goals": goals, "times_s_per_step": launches}


if __name__ == "__main__":
    H.main(__file__, __doc__, OPTIONS, QUICK, run, worker)
