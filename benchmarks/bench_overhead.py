"""disttrain's Trainer vs a plain hand-written PyTorch loop: throughput ratio for DDP and for FSDP2.

Both variants train the same GPT (4 blocks, width 256, context 128 by default; ``--model hf-gpt2``: a Hugging
Face GPT2LMHeadModel of that shape, built from a config, which returns an output object) in bf16 on the same batch
size, on 2 ranks (gloo, one thread each), inside one launch: blocks of steps alternate between the two so
the machine's noise hits both alike. The plain loop is what one writes by hand from the PyTorch docs:

* DDP: ``DistributedDataParallel(model, bucket_cap_mb=25)``, ``torch.autocast(bf16)`` around the forward;
* FSDP2: ``fully_shard`` each block then the root, ``MixedPrecisionPolicy(param_dtype=bf16, reduce_dtype=fp32)``;

then fp32 cross-entropy, backward, ``clip_grad_norm_(1.0)``, AdamW (decay on matrices only; ``fused`` or
``foreach`` as disttrain picked it), warmup + cosine LR, ``loss.item()``. Settings are mirrored so the
ratio is the framework's cost, not a difference of settings. disttrain runs ``Trainer.fit()`` (metrics
every 10 steps, console off, ``metrics.peak_tflops`` set so no matmul is timed at start-up).
Goal: disttrain / plain >= 0.97.

The whole comparison is launched ``--launches`` times (fresh processes): the ratio from one launch is off
by a few % in a way its rounds don't show (an A/A control, ``--aa``, shows it), so the figure is the
median over launches.

    .venv/bin/python -m benchmarks.bench_overhead [--launches 5] [--rounds 6] [--steps-per-block 2] [--aa]
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from benchmarks import _common as C
from disttrain.config import DTYPES
from disttrain.testing.launch import finish_worker, is_worker, launch_and_collect, write_rank_result

GOAL = 0.97


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--launches", type=int, default=5, help="fresh launches (median over them)")
    p.add_argument("--rounds", type=int, default=6, help="timed blocks per variant and launch")
    p.add_argument("--steps-per-block", type=int, default=2)
    p.add_argument("--warmup", type=int, default=3, help="untimed steps per variant first")
    p.add_argument("--micro-batch", type=int, default=8)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--width", type=int, default=256)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--context", type=int, default=128)
    p.add_argument("--nproc", type=int, default=2)
    p.add_argument("--strategies", default="ddp,fsdp")
    p.add_argument("--dtype", choices=("bf16", "fp32"), default="bf16", help="fp32 where bf16 is emulated")
    p.add_argument("--model", choices=("gpt", "hf-gpt2"), default="gpt", help="the built-in GPT or HF GPT-2")
    p.add_argument("--aa", action="store_true", help="add an A/A control: a second, identical plain loop")
    p.add_argument("--out", default=None, help=argparse.SUPPRESS)  # set for the workers
    return p.parse_args(argv)


# -- the plain loop -------------------------------------------------------------------------------------
def bench_model(args: argparse.Namespace, vocab: int) -> tuple[nn.Module, list[nn.Module]]:
    """The benchmarked model (the same weights for both variants) and its blocks (FSDP's units)."""
    torch.manual_seed(1234)
    if args.model == "hf-gpt2":
        from transformers import GPT2Config, GPT2LMHeadModel

        cfg = GPT2Config(
            vocab_size=vocab,
            n_positions=args.context,
            n_embd=args.width,
            n_layer=args.layers,
            n_head=args.heads,
            resid_pdrop=0.0,
            embd_pdrop=0.0,
            attn_pdrop=0.0,
        )
        hf = GPT2LMHeadModel(cfg)
        return hf, list(hf.transformer.h)
    from disttrain.models.gpt import GPT, GPTConfig

    gpt = GPT(GPTConfig(vocab, args.layers, args.width, args.heads, args.context), seed=1234)
    return gpt, list(gpt.blocks)


class PlainLoop:
    """A hand-written training loop, no disttrain code in the step (the model class is shared).

    ``settings`` mirrors what disttrain chose, so the ratio is the framework's cost and not a difference
    in settings: the AdamW implementation (``fused`` / ``foreach``) and DDP's ``bucket_cap_mb``.
    """

    def __init__(
        self, strategy: str, args: argparse.Namespace, vocab: int, data: Any, total_steps: int, settings: dict[str, Any]
    ) -> None:
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
        from torch.nn.parallel import DistributedDataParallel as DDP

        self.rank, self.world = dist.get_rank(), dist.get_world_size()
        self.strategy = strategy
        model, blocks = bench_model(args, vocab)
        if strategy == "ddp":
            self.model: nn.Module = DDP(model, bucket_cap_mb=settings["bucket_cap_mb"])
        else:
            mesh = init_device_mesh("cpu", (self.world,))
            mp = MixedPrecisionPolicy(param_dtype=DTYPES[args.dtype], reduce_dtype=torch.float32)
            for block in blocks:
                fully_shard(block, mesh=mesh, mp_policy=mp)
            fully_shard(model, mesh=mesh, mp_policy=mp)
            self.model = model
        emb = {id(m.weight) for m in model.modules() if isinstance(m, nn.Embedding)}
        decay = [p for p in self.model.parameters() if p.dim() >= 2 and id(p) not in emb]
        rest = [p for p in self.model.parameters() if not (p.dim() >= 2 and id(p) not in emb)]
        self.opt = torch.optim.AdamW(
            [{"params": decay, "weight_decay": 0.1}, {"params": rest, "weight_decay": 0.0}],
            lr=3e-3,
            betas=(0.9, 0.95),
            fused=settings["fused"],
            foreach=settings["foreach"],
        )
        self.data = data
        self.micro = args.micro_batch
        self.dtype = args.dtype
        self.gen = torch.Generator().manual_seed(1234 + self.rank)
        self.total = total_steps
        self.step_no = 0

    def lr(self, step: int, peak: float = 3e-3, warm: int = 30, floor: float = 0.1) -> float:
        if step < warm:
            return peak * (step + 1) / warm
        progress = min((step - warm) / max(self.total - warm - 1, 1), 1.0)
        return peak * (floor + (1 - floor) * 0.5 * (1 + math.cos(math.pi * progress)))

    def batch(self) -> tuple[torch.Tensor, torch.Tensor]:
        idx = torch.randint(len(self.data), (self.micro,), generator=self.gen).tolist()
        xs, ys = zip(*(self.data[i] for i in idx), strict=True)
        return torch.stack(xs), torch.stack(ys)

    def run(self, n: int) -> None:
        for _ in range(n):
            for g in self.opt.param_groups:
                g["lr"] = self.lr(self.step_no)
            x, y = self.batch()
            if self.strategy == "ddp" and self.dtype != "fp32":
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


# -- disttrain -----------------------------------------------------------------------------------------
def make_trainer(strategy: str, args: argparse.Namespace, text: Any, env: Any, total_steps: int) -> Any:
    from disttrain.build import build_model
    from disttrain.config import from_dict
    from disttrain.train.trainer import Trainer

    cfg = from_dict(
        {
            "model": C.gpt_shape(args),
            "train": {
                "steps": total_steps,
                "global_batch": args.micro_batch * env.world_size,
                "micro_batch": args.micro_batch,
                "eval_interval": 0,
                "generate_chars": 0,
            },
            "parallel": {"strategy": strategy, "device": "cpu"},
            "precision": {"dtype": args.dtype},
            "metrics": {"peak_tflops": 1.0, "progress": "off"},
        }
    )
    if args.model == "gpt":
        model = build_model(cfg, text.tokenizer.vocab_size, on_meta=strategy == "fsdp")
    else:
        model = bench_model(args, text.tokenizer.vocab_size)[0]  # the plain loop's, on CPU (parallel.init auto)
    return Trainer(model, text.train, cfg, env=env)


def worker(args: argparse.Namespace) -> None:
    C.one_thread()
    from disttrain.data.text import load_text_data
    from disttrain.parallel.env import init_distributed
    from disttrain.utils.gc import GarbageCollection

    env = init_distributed("cpu", threads=1)
    text = load_text_data(None, args.context, 0.1)
    total = args.warmup + args.rounds * args.steps_per_block
    out: dict[str, Any] = {}
    for strategy in args.strategies.split(","):
        trainer = make_trainer(strategy, args, text, env, total)
        settings = {
            "fused": trainer.optimizer.defaults.get("fused"),
            "foreach": trainer.optimizer.defaults.get("foreach"),
            "bucket_cap_mb": trainer.cfg.parallel.ddp_bucket_mb,
        }
        plain = PlainLoop(strategy, args, text.tokenizer.vocab_size, text.train, total, settings)

        def run_trainer(n: int, trainer: Any = trainer) -> None:
            trainer.cfg.train.steps = trainer.step + n  # fit() runs until this step
            trainer.fit()

        variants = {"disttrain": run_trainer, "plain": plain.run}
        if args.aa:
            copy = PlainLoop(strategy, args, text.tokenizer.vocab_size, text.train, total, settings)
            variants["plain (copy)"] = copy.run
        # fit() runs block by block here: the outer collector context stands for the one a whole fit() opens
        # (one full collection at its start), so a block does not pay that start-up again; both variants run in it
        with GarbageCollection(trainer.cfg.train.gc_interval):
            times = C.interleave(
                variants,
                steps_per_block=args.steps_per_block,
                rounds=args.rounds,
                warmup=args.warmup,
                before_block=dist.barrier,
            )
        out[strategy] = C.slowest_rank(times)
        del trainer, plain
    write_rank_result(args.out, env.rank, out)
    finish_worker()


def main(argv: list[str]) -> None:
    args = parse_args(argv)
    if is_worker():
        worker(args)
        return
    # Each launch is a fresh pair of processes: ratios differ between launches by a few % more than the
    # rounds inside one launch suggest (memory placement, which cores), so the figure is the median over
    # launches of each launch's paired median.
    launches = []
    for i in range(args.launches):
        print(f"launch {i + 1}/{args.launches} ...", flush=True)
        launches.append(launch_and_collect(args.nproc, Path(__file__), argv, echo=True)[0])
    rows, figures = [], {}
    for strategy in launches[0]:
        runs = [run[strategy] for run in launches]
        per_launch = [C.paired_ratio(t["plain"], t["disttrain"]) for t in runs]
        ratio = C.median(per_launch)
        pooled = [p / d for t in runs for p, d in zip(t["plain"], t["disttrain"], strict=True)]
        plain_ms = C.median([x for t in runs for x in t["plain"]]) * 1e3
        dt_ms = C.median([x for t in runs for x in t["disttrain"]]) * 1e3
        aa = [C.paired_ratio(t["plain"], t["plain (copy)"]) for t in runs] if "plain (copy)" in runs[0] else []
        figures[strategy] = {
            "throughput_ratio_disttrain_over_plain": ratio,
            "per_launch_ratios": per_launch,
            "pooled_paired_median": C.median(pooled),
            "pooled_quartiles": list(C.spread(pooled)),
            "a_a_control_per_launch": aa,
            "plain_ms_per_step_median": plain_ms,
            "disttrain_ms_per_step_median": dt_ms,
            "goal": GOAL,
            "verdict": C.verdict(ratio, GOAL),
            "times_s_per_step": runs,
        }
        rows.append(
            [
                strategy,
                plain_ms,
                dt_ms,
                ratio,
                " ".join(f"{r:.3f}" for r in sorted(per_launch)),
                f">= {GOAL}",
                C.verdict(ratio, GOAL),
            ]
        )
        if aa:
            rows.append([f"  A/A control ({strategy})", "", "", C.median(aa), " ".join(f"{r:.3f}" for r in sorted(aa))])
            rows[-1] += ["", ""]
    C.table(
        ["strategy", "plain ms/step", "disttrain ms/step", "ratio", "per launch (sorted)", "goal", ""],
        rows,
        title=(
            f"Trainer vs plain PyTorch loop: {args.nproc} ranks, GPT {args.layers}x{args.width} ctx {args.context}, "
            f"micro-batch {args.micro_batch}, {args.dtype}, model {args.model}; ratio = disttrain throughput / plain: "
            f"median over {args.launches} launches of the paired median of {args.rounds} rounds x "
            f"{args.steps_per_block} steps"
        ),
    )
    config = {k: v for k, v in vars(args).items() if k != "out"}
    name = "bench_overhead" if args.model == "gpt" else f"bench_overhead_{args.model.replace('-', '_')}"
    C.write_results(name, {"config": config, "results": figures})


if __name__ == "__main__":
    main(sys.argv[1:])
