"""MFU of the default GPT against the measured matmul peak; where the step time goes; what-ifs (``--parts``).

Part 1 (``single``), one process x one thread: ``Trainer.fit()`` on the default GPT (6 x 384, context 256,
micro-batch 8) in ``--dtype``; MFU = model FLOP/s / the matmul peak in that dtype, measured after every round. A
torch.profiler trace breaks the step down by kind of op. Side by side, variants that force one implementation
choice (:func:`apply_variant`), so that the benchmark keeps telling whether each choice src/ makes is still the
faster one here: ``attention: SDPA`` (src uses ``baddbmm`` + ``bmm`` for bf16 where the CPU has AMX or
AVX512-BF16); ``all three``, the code before cbd42a5 (SDPA, tanh GELU, ``AdamW(foreach=True)``); ``GEMMs only``,
the model's matmuls alone (the MFU ceiling); ``--compile``: ``compile: blocks`` and ``compile: model``, the first
step's extra time the compile time (a fresh inductor cache each). Goal: MFU >= 35%.

Part 2 (``ddp``), the default 2-rank job (DDP, global batch 16): its MFU as the Trainer computes it (against the
peak it measures at start-up) and against the peak measured after every round, with and without the gradient
all-reduce (``no_sync`` on every step: the cost of communication).

Part 3 (``precision``), one process: Trainers in bf16 and fp32, the same seed and batches; the throughput ratio
and the final losses of the short run. Goal: bf16 >= 2.5x fp32. ``--before`` adds both with the choices of the
code before cbd42a5 forced back, to reproduce the ratio measured then.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
import types
from collections import defaultdict
from collections.abc import Callable
from typing import Any
from unittest import mock

import torch
import torch.distributed as dist
import torch.nn.functional as F

from benchmarks import harness as H

GOALS = {"mfu": H.Goal("MFU of one process, as is", 0.35), "precision": H.Goal("bf16 / fp32 throughput", 2.5)}
OPTIONS = {
    "parts": ("single,ddp,precision", "which parts, comma-separated (1: single, 2: ddp, 3: precision)"),
    **H.options(rounds=12, steps_per_block=2, warmup=2),  # parts 1-2: one step of each variant per round
    "dtype": ("auto", "auto: what precision auto picks on this CPU", ("auto", "fp32", "bf16")),
    "profile_steps": (3, "steps under torch.profiler"),
    "rounds_2rank": (6, "part 2's timed rounds"),
    "compile": (False, "part 1: add parallel.compile = blocks and = model variants"),
    "skip_before": (False, "part 1: leave out the SDPA and code-before-cbd42a5 variants"),
    "micro_batch": (8, "part 3: micro-batch"),
    "loss_window": (4, "part 3: final loss = mean of the last N step losses"),
    "before": (False, "part 3: add variants with the choices before cbd42a5"),
}
QUICK = {**H.QUICK_BLOCKS, "profile_steps": 1, "rounds_2rank": 1, "skip_before": True, "micro_batch": 2}
QUICK |= {"loss_window": 1}
BEFORE = ("attention: SDPA", "GELU: tanh", "AdamW: foreach")  # the code before cbd42a5
COMPILE_MODES = {"compile: blocks": "blocks", "compile: model": "model"}


# -- what-if variants -----------------------------------------------------------------------------------
def _mlp_gelu_tanh(self: Any, x: torch.Tensor) -> torch.Tensor:
    return self.proj(F.gelu(self.fc(x), approximate="tanh"))


def _attn_sdpa(self: Any, x: torch.Tensor) -> torch.Tensor:
    b, t, c = x.shape
    q, k, v = self.qkv(x).view(b, t, 3, self.n_heads, c // self.n_heads).permute(2, 0, 3, 1, 4)
    y = F.scaled_dot_product_attention(q, k, v, is_causal=True, dropout_p=self.dropout if self.training else 0.0)
    return self.proj(y.transpose(1, 2).reshape(b, t, c))


def apply_variant(trainer: Any, choices: tuple[str, ...]) -> None:
    """Force the given implementation choices (of :data:`BEFORE`) on this trainer's model and optimizer."""
    from disttrain.train.optim import lr_lambda

    patches = {"GELU: tanh": ("mlp", _mlp_gelu_tanh), "attention: SDPA": ("attn", _attn_sdpa)}
    for block in getattr(trainer.model.inner, "blocks", []):
        for part, forward in (patches[c] for c in choices if c in patches):
            getattr(block, part).forward = types.MethodType(forward, getattr(block, part))
    if "AdamW: foreach" in choices:
        old, d = trainer.optimizer, trainer.optimizer.defaults
        groups = [{"params": g["params"], "weight_decay": g["weight_decay"]} for g in old.param_groups]
        trainer.optimizer = torch.optim.AdamW(groups, lr=d["lr"], betas=d["betas"], eps=d["eps"], foreach=True)
        trainer.scheduler = torch.optim.lr_scheduler.LambdaLR(trainer.optimizer, lr_lambda(trainer.cfg))


def make_trainer(data: Any, env: Any, total: int, choices: tuple[str, ...] = (), **settings: Any) -> Any:
    """The default GPT's Trainer (DDP on several ranks), micro-batch 8, with ``choices`` forced on it;
    ``settings``: ``dtype``, ``compile``, ``peak`` (None: measured at start-up, as the real job does)."""
    parallel = {"strategy": "ddp" if env.world_size > 1 else "single", "compile": settings.get("compile", "off")}
    sections: dict[str, Any] = {"parallel": parallel, "precision": {"dtype": settings["dtype"]}}
    cfg = H.job(world=env.world_size, steps=total, metrics={"peak_tflops": settings.get("peak", 1.0)}, **sections)
    trainer = H.trainer(cfg, data, env)
    apply_variant(trainer, choices)
    return trainer


class GemmsOnly:
    """The default GPT's matmuls and nothing else: per block the 4 linear layers (forward + the two backward
    GEMMs) and the attention bmm's (q k^T, p v, forward and backward), the head; micro-batch 8."""

    def __init__(self, vocab: int, dtype: torch.dtype, b: int = 8, t: int = 256, c: int = 384, h: int = 6) -> None:
        layers, n, d = 6, b * t, c // h
        shapes = [(c, 3 * c), (c, c), (c, 4 * c), (4 * c, c)] * layers + [(c, vocab)]

        def rand(*shape: int, grad: bool = True) -> torch.Tensor:
            return torch.randn(*shape, dtype=dtype, requires_grad=grad)

        self.linears = [(rand(n, i), rand(o, i), rand(n, o, grad=False)) for i, o in shapes]
        self.attn = [(rand(b * h, t, d), rand(b * h, t, d), rand(b * h, t, d)) for _ in range(layers)]

    def run(self, n: int) -> None:
        for _ in range(n):
            for x, w, g in self.linears:
                F.linear(x, w).backward(g)
            for q, k, v in self.attn:
                torch.bmm(torch.bmm(q, k.transpose(1, 2)), v).backward(v)
            for t in (t for group in (*self.linears, *self.attn) for t in group):
                t.grad = None


def first_steps(runners: dict[str, Callable[[int], Any]]) -> dict[str, float]:
    """Each variant's first step, timed alone (the compile variants compile in it, each in a fresh inductor cache
    folder, so none reuses another's kernels from disk)."""
    out = {}
    for name, run in runners.items():
        with tempfile.TemporaryDirectory() as tmp, mock.patch.dict(os.environ, TORCHINDUCTOR_CACHE_DIR=tmp):
            t0 = time.perf_counter()
            run(1)
            out[name] = time.perf_counter() - t0
    return out


def round_mfu(flops: float, times: list[float], peaks: list[float]) -> float:
    """Median over rounds of (flops / step time) / peak, each round against the peak measured right after it,
    so a burst of load from other processes slows both and cancels out."""
    return H.median([flops / t / (pk * 1e12) for t, pk in zip(times, peaks, strict=True)])


def measured_peaks(dtype: str, barrier: bool = False) -> tuple[list[float], Callable[[int], None]]:
    """A list, and a ``between_rounds`` that appends the matmul peak measured then (after a barrier: both ranks
    busy) to it."""
    from disttrain.config import DTYPES
    from disttrain.train.metrics import measure_matmul_tflops

    peaks: list[float] = []

    def measure(r: int) -> None:
        if barrier:
            dist.barrier()
        peaks.append(measure_matmul_tflops(torch.device("cpu"), DTYPES[dtype]))

    return peaks, measure


def fit_runner(trainer: Any, into: dict[str, list[Any]], name: str) -> Callable[[int], None]:
    """``fit_for`` the trainer, keeping its results in ``into[name]``."""
    return lambda n: into.setdefault(name, []).append(H.fit_for(trainer, n))


# -- where the step goes --------------------------------------------------------------------------------
KINDS = [
    ("linear matmuls", ("aten::mm", "aten::addmm")),
    ("attention", ("flash_attention", "aten::bmm", "aten::baddbmm", "softmax")),
    ("gelu", ("gelu",)),
    ("layernorm", ("layer_norm",)),
    ("dtype casts / copies", ("aten::copy_", "aten::_to_copy", "aten::cat")),
    ("communication", ("allreduce", "all_reduce", "gloo", "c10d")),
]
PARENTS = {  # an event under one of these is counted as its kind (Optimizer.step: any optimizer's)
    "aten::cross_entropy_loss": "cross-entropy (fp32)",
    "aten::nll_loss_backward": "cross-entropy (fp32)",
    "aten::_log_softmax_backward_data": "cross-entropy (fp32)",
    "aten::_foreach_norm": "grad-norm clip",
    "aten::linalg_vector_norm": "grad-norm clip",
}


def kind_of(event: Any) -> str:
    parent = event
    while parent is not None:
        if "Optimizer.step" in parent.name:
            return "optimizer (AdamW)"
        if parent.name in PARENTS:
            return PARENTS[parent.name]
        parent = parent.cpu_parent
    return next((kind for kind, keys in KINDS if any(k in event.name for k in keys)), "other (adds, autograd, ...)")


def profile_steps(trainer: Any, steps: int) -> dict[str, Any]:
    """torch.profiler over ``steps`` training steps: self CPU time by kind of op, printed."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(steps):
            trainer.train_step()
    kinds: dict[str, float] = defaultdict(float)
    for e in prof.events():
        kinds[kind_of(e)] += e.self_cpu_time_total
    total = sum(kinds.values())
    rows = [{"kind": k, "ms/step": v / steps / 1e3, "share": f"{v / total:.1%}"} for k, v in kinds.items()]
    H.table(sorted(rows, key=lambda r: -r["ms/step"]), f"\nWhere the step goes ({total / steps / 1e3:.0f} ms profiled)")
    return {"profiled_ms_per_step": total / steps / 1e3, "kinds": rows}


# -- part 1: one process --------------------------------------------------------------------------------
def single_process(args: argparse.Namespace) -> dict[str, Any]:
    """Every variant (and the GEMMs alone) one step per round, interleaved, the peak measured after each round."""
    from disttrain.config import DTYPES

    data, env, total = H.text(256), H.init_ranks(), args.warmup + args.rounds + args.profile_steps + 3
    variants: dict[str, tuple[str, ...]] = {"as is": ()}
    if not args.skip_before:
        variants |= {"attention: SDPA": ("attention: SDPA",), "all three": BEFORE}
    trainers = {n: make_trainer(data, env, total, c, dtype=args.dtype) for n, c in variants.items()}
    if args.compile:
        trainers |= {n: make_trainer(data, env, total, dtype=args.dtype, compile=m) for n, m in COMPILE_MODES.items()}
    first: dict[str, list[Any]] = {}
    runners = {n: fit_runner(t, first, n) for n, t in trainers.items()}
    runners["GEMMs only"] = GemmsOnly(data.tokenizer.vocab_size, DTYPES[args.dtype]).run
    first_s = first_steps(runners)
    peaks, measure = measured_peaks(args.dtype)
    times = H.interleave(
        runners, steps_per_block=1, rounds=args.rounds, warmup=max(args.warmup - 1, 0), between_rounds=measure
    )
    flops = trainers["as is"].flops_per_sample * 8
    rows: list[dict[str, Any]] = [
        {"variant": n, "ms/step": H.median(t) * 1e3, "MFU": round_mfu(flops, t, peaks)}
        | H.ratio(times["as is"], t)
        | {"1st step +s": first_s[n] - H.median(t), "first loss": first[n][0].losses[0] if n in first else "-"}
        for n, t in times.items()
    ]
    peak = f"matmul peak {H.median(peaks):.3f} TFLOP/s; ratio: as is / variant; 1st step +s: first - median step"
    H.table(rows, f"Part 1: 1 process x 1 thread, default GPT, micro-batch 8, {args.dtype}; {peak}")
    shown = [n for n in ("as is", "compile: blocks") if n in trainers]
    profiles = {n: profile_steps(trainers[n], args.profile_steps) for n in shown}
    mfu = {r["variant"]: r["MFU"] for r in rows}
    print(f"MFU ceiling, the GEMMs alone: {mfu['GEMMs only']:.1%}")
    out = {"dtype": args.dtype, "peaks": peaks, "flops_per_step": flops, "rows": rows, "profiles": profiles}
    return out | {"times_s_per_step": times, "goals": [GOALS["mfu"].check(mfu["as is"])]}


# -- part 2: the default 2-rank job ---------------------------------------------------------------------
def worker(args: argparse.Namespace) -> dict[str, Any]:
    env, data, total = H.init_ranks(), H.text(256), args.warmup + args.rounds_2rank + 2
    trainers = {n: make_trainer(data, env, total, peak=None, dtype=args.dtype) for n in ("ddp", "ddp, no all-reduce")}
    nosync = trainers["ddp, no all-reduce"]
    nosync.model.sync = lambda enabled: nosync.model.module.no_sync()
    results: dict[str, list[Any]] = {}
    peaks, measure = measured_peaks(args.dtype, barrier=True)
    runners = {n: fit_runner(t, results, n) for n, t in trainers.items()}
    blocks = {"steps_per_block": 1, "rounds": args.rounds_2rank, "warmup": args.warmup}
    times = H.interleave(runners, **blocks, before_block=dist.barrier, between_rounds=measure)
    flops = trainers["ddp"].flops_per_sample * 8
    out = {"times": times, "peaks": peaks, "trainer_peak": trainers["ddp"].peak, "flops_per_step_per_rank": flops}
    return out | {"mfu_reported": {n: r[-1].mfu for n, r in results.items()}}


def two_ranks(args: argparse.Namespace) -> dict[str, Any]:
    ranks = H.ranks(2, __file__, [*args.argv, "--dtype", args.dtype])
    times = H.slowest_per_round([r["times"] for r in ranks])
    peaks = [min(p) for p in zip(*(r["peaks"] for r in ranks), strict=True)]
    start_peak, flops = ranks[0]["trainer_peak"], ranks[0]["flops_per_step_per_rank"]
    rows = [
        {"variant": n, "ms/step": H.median(t) * 1e3, "MFU": round_mfu(flops, t, peaks)}
        | {"MFU vs start-up peak": flops / H.median(t) / (start_peak * 1e12), "speed": H.paired_ratio(times["ddp"], t)}
        for n, t in times.items()
    ]
    peak = f"per-rank peak {H.median(peaks):.3f} TFLOP/s after each round (at start-up: {start_peak:.3f})"
    H.table(rows, f"\nPart 2: default job, DDP x 2 ranks x 1 thread, global batch 16, {args.dtype}; {peak}")
    print(f"MFU, the default 2-rank DDP job (the Trainer's way): {rows[0]['MFU vs start-up peak']:.1%}")
    return {"rows": rows, "peaks": peaks, "trainer_start_up_peak": start_peak, "times_s_per_step": times}


# -- part 3: bf16 against fp32 --------------------------------------------------------------------------
def precision(args: argparse.Namespace) -> dict[str, Any]:
    """bf16 and fp32 Trainers (and, ``--before``, both with the choices before cbd42a5), blocks interleaved."""
    env, data = H.init_ranks(), H.text(256)
    total = args.warmup + args.rounds * args.steps_per_block
    names = ["fp32", "bf16"] + (["fp32, before", "bf16, before"] if args.before else [])
    losses: dict[str, list[float]] = {n: [] for n in names}

    def runner(name: str) -> Callable[[int], None]:
        sections: dict[str, Any] = {"precision": {"dtype": name[:4]}, "optim": {"warmup_steps": 5}}
        sections["parallel"] = {"strategy": "single"}
        trainer = H.trainer(H.job(micro_batch=args.micro_batch, steps=total, **sections), data, env)
        apply_variant(trainer, BEFORE if "before" in name else ())
        return lambda n: losses[name].extend(H.fit_for(trainer, n).losses)

    times = H.interleave({n: runner(n) for n in names}, **H.blocks(args))
    w = min(args.loss_window, total)
    final = {n: sum(losses[n][-w:]) / w for n in names}
    rows = [
        {"variant": n, "ms/step": H.median(times[n]) * 1e3, "tokens/s": args.micro_batch * 256 / H.median(times[n])}
        | {f"final loss (last {w})": final[n], "first loss": losses[n][0]}
        for n in names
    ]
    H.table(rows, f"\nPart 3: bf16 vs fp32, 1 process x 1 thread, default GPT, micro-batch {args.micro_batch}")
    figures = []
    for suffix in ("", ", before")[: 1 + args.before]:
        label = "as is" if not suffix else "code before cbd42a5 (SDPA, tanh GELU, foreach AdamW)"
        bf16, fp32 = f"bf16{suffix}", f"fp32{suffix}"
        figures.append({"figure": f"bf16 / fp32 throughput, {label}", **H.ratio(times[fp32], times[bf16])})
        figures[-1]["final loss bf16 - fp32"] = final[bf16] - final[fp32]
    H.table(figures)
    goals = [GOALS["precision"].check(figures[0]["ratio"])]
    return {"rows": rows, "figures": figures, "goals": goals, "losses": losses, "times_s_per_step": times}


def run(args: argparse.Namespace) -> dict[str, Any]:
    H.one_thread()
    args.dtype = H.dtype(args.dtype)
    return H.parts(args, __file__, {"single": single_process, "ddp": two_ranks, "precision": precision})


if __name__ == "__main__":
    H.main(__file__, __doc__, OPTIONS, QUICK, run, worker)
