"""MFU of the default GPT in bf16 against the measured matmul peak; where the step time goes; cheap fixes.

Part 1, one process x one thread: ``Trainer.fit()`` on the default GPT (6 x 384, 6 heads, context 256,
micro-batch 8, bf16). MFU = model FLOP/s (``GPT.flops_per_token``) / the bf16 matmul peak that
``disttrain.train.metrics.measure_matmul_tflops`` measures, sampled between rounds in the same process.
A torch.profiler trace of a few steps gives the top ops by self CPU time and a breakdown by kind.
The same loop is then timed side by side with *what-if* variants patched onto the model at run time
(nothing in src/ changes):

* ``gelu-erf``: ``F.gelu(x)`` (exact erf form) instead of ``approximate="tanh"`` (slow tanh on this CPU);
* ``bmm-attn``: causal attention as ``baddbmm`` + softmax + ``bmm`` instead of SDPA's CPU flash kernel
  (whose backward is slow in bf16);
* ``fused-adamw``: ``AdamW(fused=True)`` instead of ``foreach=True``;
* ``all``: the three together.

Part 2, the default 2-rank job (DDP, global batch 16, micro-batch 8; one thread per rank): its MFU as
the Trainer reports it, the same with the gradient all-reduce switched off (``no_sync`` on every step:
the cost of communication), and with the three fixes. Goal: MFU >= 35% (part 1).

    .venv/bin/python benchmarks/bench_mfu.py [--rounds 8] [--skip-2rank]
"""

from __future__ import annotations

import argparse
import math
import sys
import types
from collections import defaultdict
from pathlib import Path
from typing import Any

import _common as C
import torch
import torch.distributed as dist
import torch.nn.functional as F

GOAL = 0.35
FIXES = ("gelu-erf", "bmm-attn", "fused-adamw")


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rounds", type=int, default=8, help="timed rounds (one step per variant each)")
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--profile-steps", type=int, default=3)
    p.add_argument("--rounds-2rank", type=int, default=6)
    p.add_argument("--skip-2rank", action="store_true")
    p.add_argument("--top", type=int, default=15, help="rows of the top-ops table")
    p.add_argument("--out", default=None, help=argparse.SUPPRESS)
    return p.parse_args(argv)


# -- what-if patches (applied to one model instance; src/ is untouched) ------------------------------------
def _mlp_gelu_erf(self: Any, x: torch.Tensor) -> torch.Tensor:
    return self.proj(F.gelu(self.fc(x)))


def _attn_bmm(self: Any, x: torch.Tensor) -> torch.Tensor:
    b, t, c = x.shape
    h = self.n_heads
    d = c // h
    q, k, v = self.qkv(x).view(b, t, 3, h, d).permute(2, 0, 3, 1, 4)
    q, k, v = (z.reshape(b * h, t, d) for z in (q, k, v))
    key = (t, q.dtype)
    cache = self.__dict__.setdefault("_causal_mask", {})
    if key not in cache:
        cache[key] = torch.full((t, t), float("-inf"), device=x.device).triu(1).to(q.dtype)
    scores = torch.baddbmm(cache[key].expand(b * h, t, t), q, k.transpose(1, 2), alpha=1.0 / math.sqrt(d))
    probs = torch.softmax(scores, dim=-1)
    if self.training and self.dropout > 0:
        probs = F.dropout(probs, self.dropout)
    y = torch.bmm(probs, v).view(b, h, t, d)
    return self.proj(y.transpose(1, 2).reshape(b, t, c))


def apply_fixes(trainer: Any, fixes: tuple[str, ...]) -> None:
    from disttrain.train.trainer import lr_lambda

    model = trainer.model.inner
    for block in getattr(model, "blocks", []):
        if "gelu-erf" in fixes:
            block.mlp.forward = types.MethodType(_mlp_gelu_erf, block.mlp)
        if "bmm-attn" in fixes:
            block.attn.forward = types.MethodType(_attn_bmm, block.attn)
    if "fused-adamw" in fixes:
        old = trainer.optimizer
        groups = [{"params": g["params"], "weight_decay": g["weight_decay"]} for g in old.param_groups]
        d = old.defaults
        trainer.optimizer = torch.optim.AdamW(groups, lr=d["lr"], betas=d["betas"], eps=d["eps"], fused=True)
        trainer.scheduler = torch.optim.lr_scheduler.LambdaLR(trainer.optimizer, lr_lambda(trainer.cfg))


# -- set-up ---------------------------------------------------------------------------------------------
def job_config(world: int, total: int, peak: float | None) -> Any:
    from disttrain.config import from_dict

    return from_dict(
        {
            "train": {
                "steps": total,
                "global_batch": 8 * world,
                "micro_batch": 8,
                "eval_interval": 0,
                "generate_chars": 0,
            },
            "parallel": {"strategy": "ddp" if world > 1 else "single", "device": "cpu"},
            "precision": {"dtype": "bf16"},
            "metrics": {"peak_tflops": peak, "progress": "off"},
        }
    )


def make_trainer(text: Any, env: Any, total: int, fixes: tuple[str, ...] = (), peak: float | None = 1.0) -> Any:
    from disttrain.job import build_model
    from disttrain.train.trainer import Trainer

    cfg = job_config(env.world_size, total, peak)
    model = build_model(cfg, text.tokenizer.vocab_size, on_meta=False)
    trainer = Trainer(model, text.train, cfg, env=env)
    apply_fixes(trainer, fixes)
    return trainer


def fit_runner(trainer: Any, first_loss: dict[str, float], name: str) -> Any:
    def run(n: int) -> None:
        trainer.cfg.train.steps = trainer.step + n
        res = trainer.fit()
        first_loss.setdefault(name, res.losses[0])

    return run


# -- profile --------------------------------------------------------------------------------------------
KINDS = [
    ("linear matmuls", ("aten::mm", "aten::addmm")),
    ("attention", ("flash_attention", "aten::bmm", "aten::baddbmm", "softmax")),
    ("gelu", ("gelu",)),
    ("layernorm", ("layer_norm",)),
    ("dtype casts / copies", ("aten::copy_", "aten::_to_copy", "aten::cat")),
    ("communication", ("allreduce", "all_reduce", "gloo", "c10d")),
]


def kind_of(event: Any) -> str:
    parent = event
    while parent is not None:
        if "Optimizer.step" in parent.name:
            return "optimizer (AdamW)"
        if parent.name in ("aten::cross_entropy_loss", "aten::nll_loss_backward", "aten::_log_softmax_backward_data"):
            return "cross-entropy (fp32)"
        if parent.name in ("aten::_foreach_norm", "aten::linalg_vector_norm"):
            return "grad-norm clip"
        parent = parent.cpu_parent
    for kind, keys in KINDS:
        if any(k in event.name for k in keys):
            return kind
    return "other (adds, autograd, embedding, ...)"


def profile_steps(trainer: Any, steps: int, top: int) -> dict[str, Any]:
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(steps):
            trainer.train_step()
    total = sum(e.self_cpu_time_total for e in prof.events())
    kinds: dict[str, float] = defaultdict(float)
    for e in prof.events():
        kinds[kind_of(e)] += e.self_cpu_time_total
    ops = sorted(prof.key_averages(), key=lambda a: a.self_cpu_time_total, reverse=True)[:top]
    return {
        "profiled_ms_per_step": total / steps / 1e3,
        "kinds": {k: {"ms_per_step": v / steps / 1e3, "share": v / total} for k, v in sorted(kinds.items(), key=lambda kv: -kv[1])},
        "top_ops": [
            {
                "op": a.key,
                "ms_per_step": a.self_cpu_time_total / steps / 1e3,
                "share": a.self_cpu_time_total / total,
                "calls_per_step": a.count / steps,
            }
            for a in ops
        ],
    }


# -- part 1: one process -------------------------------------------------------------------------------
def single_process(args: argparse.Namespace) -> dict[str, Any]:
    from disttrain.data.text import load_text_data
    from disttrain.dist.env import init_distributed
    from disttrain.train.metrics import measure_matmul_tflops

    env = init_distributed("cpu", threads=1)
    text = load_text_data(None, 256, 0.1)
    total = args.warmup + args.rounds + args.profile_steps + 2
    variants = {"baseline": (), **{f: (f,) for f in FIXES}, "all": FIXES}
    trainers = {name: make_trainer(text, env, total, fixes) for name, fixes in variants.items()}
    first_loss: dict[str, float] = {}
    peaks: list[float] = []
    cpu = torch.device("cpu")
    times = C.interleave(
        {name: fit_runner(tr, first_loss, name) for name, tr in trainers.items()},
        steps_per_block=1,
        rounds=args.rounds,
        warmup=args.warmup,
        between_rounds=lambda r: peaks.append(measure_matmul_tflops(cpu, torch.bfloat16)),
    )
    peak = C.median(peaks)
    flops_per_step = trainers["baseline"].flops_per_sample * 8
    profiles = {name: profile_steps(trainers[name], args.profile_steps, args.top) for name in ("baseline", "all")}
    results: dict[str, Any] = {"peak_tflops_measured": peak, "peak_samples": peaks, "flops_per_step": flops_per_step}
    rows = []
    for name in variants:
        t = C.median(times[name])
        mfu = flops_per_step / t / (peak * 1e12)
        speedup = C.paired_ratio(times["baseline"], times[name])
        results[name] = {
            "s_per_step_median": t,
            "mfu": mfu,
            "speedup_vs_baseline": speedup,
            "first_loss": first_loss[name],
            "times_s_per_step": times[name],
        }
        rows.append([name, t * 1e3, flops_per_step / t / 1e12, f"{mfu * 100:.1f}%", speedup, first_loss[name]])
    results["profiles"] = profiles
    C.table(
        ["variant", "ms/step", "TFLOP/s", "MFU", "speedup", "first loss"],
        rows,
        title=(
            f"Part 1: 1 process x 1 thread, default GPT, micro-batch 8, bf16; peak {peak:.3f} TFLOP/s "
            f"(measured bf16 matmul, median of {len(peaks)}); speedup = paired median vs baseline"
        ),
    )
    for name, prof in profiles.items():
        C.table(
            ["kind", "ms/step", "share"],
            [[k, v["ms_per_step"], f"{v['share'] * 100:.1f}%"] for k, v in prof["kinds"].items()],
            title=f"\nWhere the step goes ({name}; torch.profiler self CPU time, {prof['profiled_ms_per_step']:.0f} ms/step profiled)",
        )
    C.table(
        ["op", "ms/step", "share", "calls/step"],
        [
            [o["op"][:60], o["ms_per_step"], f"{o['share'] * 100:.1f}%", o["calls_per_step"]]
            for o in profiles["baseline"]["top_ops"]
        ],
        title=f"\nTop {args.top} ops by self CPU time (baseline)",
    )
    return results


# -- part 2: the default 2-rank job ---------------------------------------------------------------------
def worker(args: argparse.Namespace) -> None:
    C.one_thread()
    from disttrain.data.text import load_text_data
    from disttrain.dist.env import destroy_distributed, init_distributed
    from disttrain.train.metrics import measure_matmul_tflops

    env = init_distributed("cpu", threads=1)
    text = load_text_data(None, 256, 0.1)
    total = args.warmup + args.rounds_2rank + 2
    # peak=None: each Trainer measures the peak at start-up, as the real job does.
    trainers = {
        "ddp": make_trainer(text, env, total, peak=None),
        "ddp, no all-reduce": make_trainer(text, env, total, peak=None),
        "ddp + all fixes": make_trainer(text, env, total, FIXES, peak=None),
    }
    nosync = trainers["ddp, no all-reduce"]
    nosync.model.sync = lambda enabled: nosync.model.module.no_sync()
    first_loss: dict[str, float] = {}
    mfu_reported: dict[str, float] = {}

    def runner(name: str) -> Any:
        tr = trainers[name]

        def run(n: int) -> None:
            tr.cfg.train.steps = tr.step + n
            res = tr.fit()
            first_loss.setdefault(name, res.losses[0])
            mfu_reported[name] = res.mfu

        return run

    peaks: list[float] = []
    cpu = torch.device("cpu")

    def measure_peak(r: int) -> None:
        dist.barrier()
        peaks.append(measure_matmul_tflops(cpu, torch.bfloat16))

    times = C.interleave(
        {name: runner(name) for name in trainers},
        steps_per_block=1,
        rounds=args.rounds_2rank,
        warmup=args.warmup,
        before_block=dist.barrier,
        between_rounds=measure_peak,
    )
    out = {
        "times": times,
        "peaks": peaks,
        "trainer_peak": trainers["ddp"].peak,
        "mfu_reported": mfu_reported,
        "first_loss": first_loss,
        "flops_per_step_per_rank": trainers["ddp"].flops_per_sample * 8,
    }
    C.write_rank_result(args.out, env.rank, out)
    destroy_distributed()


def two_ranks(args: argparse.Namespace, argv: list[str]) -> dict[str, Any]:
    ranks = C.launch_and_collect(2, Path(__file__), argv)
    names = list(ranks[0]["times"])
    times = {n: [max(r["times"][n][i] for r in ranks) for i in range(len(ranks[0]["times"][n]))] for n in names}
    peak = C.median([p for r in ranks for p in r["peaks"]])
    flops = ranks[0]["flops_per_step_per_rank"]
    results: dict[str, Any] = {"peak_tflops_measured_per_rank": peak, "trainer_start_up_peak": ranks[0]["trainer_peak"]}
    rows = []
    for n in names:
        t = C.median(times[n])
        mfu = flops / t / (peak * 1e12)
        speedup = C.paired_ratio(times["ddp"], times[n])
        results[n] = {
            "s_per_step_median": t,
            "mfu": mfu,
            "mfu_reported_by_trainer": ranks[0]["mfu_reported"][n],
            "speedup_vs_ddp": speedup,
            "first_loss": ranks[0]["first_loss"][n],
            "times_s_per_step": times[n],
        }
        rows.append([n, t * 1e3, f"{mfu * 100:.1f}%", f"{ranks[0]['mfu_reported'][n] * 100:.1f}%", speedup])
    C.table(
        ["variant", "ms/step", "MFU", "MFU (Trainer's own)", "speedup"],
        rows,
        title=(
            f"\nPart 2: default job, DDP x 2 ranks x 1 thread, global batch 16, bf16; per-rank peak {peak:.3f} "
            f"TFLOP/s measured while both ranks run (Trainer measured {ranks[0]['trainer_peak']:.3f} at start-up)"
        ),
    )
    return results


def main(argv: list[str]) -> None:
    args = parse_args(argv)
    if C.is_worker():
        worker(args)
        return
    C.one_thread()
    out: dict[str, Any] = {"config": {k: v for k, v in vars(args).items() if k != "out"}}
    out["single_process"] = single_process(args)
    if not args.skip_2rank:
        out["two_ranks_ddp"] = two_ranks(args, argv)
    mfu = out["single_process"]["baseline"]["mfu"]
    mfu_all = out["single_process"]["all"]["mfu"]
    out["goal"] = GOAL
    out["verdict"] = C.verdict(mfu, GOAL)
    C.table(
        ["figure", "value", "goal", ""],
        [
            ["MFU, 1 process, as is", f"{mfu * 100:.1f}%", f">= {GOAL:.0%}", C.verdict(mfu, GOAL)],
            ["MFU, 1 process, with all 3 fixes", f"{mfu_all * 100:.1f}%", f">= {GOAL:.0%}", C.verdict(mfu_all, GOAL)],
        ],
        title="",
    )
    C.write_results("bench_mfu", out)


if __name__ == "__main__":
    main(sys.argv[1:])
