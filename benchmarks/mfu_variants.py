"""The pieces of bench_mfu.py (bench_precision.py uses the variants too): what-if variants of a Trainer
(implementation choices forced onto one model instance and optimizer at run time; src/ is untouched), the
default GPT's GEMMs alone, the CPU clock, compile timing and the torch.profiler breakdown of a step."""

from __future__ import annotations

import os
import tempfile
import time
import types
from collections import defaultdict
from typing import Any

import torch
import torch.nn.functional as F

from benchmarks import _common as C


def _mlp_gelu_tanh(self: Any, x: torch.Tensor) -> torch.Tensor:
    return self.proj(F.gelu(self.fc(x), approximate="tanh"))


def _attn_sdpa(self: Any, x: torch.Tensor) -> torch.Tensor:
    b, t, c = x.shape
    q, k, v = self.qkv(x).view(b, t, 3, self.n_heads, c // self.n_heads).permute(2, 0, 3, 1, 4)
    y = F.scaled_dot_product_attention(q, k, v, is_causal=True, dropout_p=self.dropout if self.training else 0.0)
    return self.proj(y.transpose(1, 2).reshape(b, t, c))


def _attn_bmm(self: Any, x: torch.Tensor) -> torch.Tensor:
    """The model's batched-matmul path (``models.gpt.causal_attention_bmm``, src's choice for bf16 on CPUs with
    AMX or AVX512-BF16), forced whatever the dtype and CPU."""
    from disttrain.models.gpt import causal_attention_bmm

    b, t, c = x.shape
    h, d = self.n_heads, c // self.n_heads
    q, k, v = (z.reshape(b * h, t, d) for z in self.qkv(x).view(b, t, 3, h, d).permute(2, 0, 3, 1, 4))
    y = causal_attention_bmm(q, k, v, self.dropout if self.training else 0.0).view(b, h, t, d)
    return self.proj(y.transpose(1, 2).reshape(b, t, c))


BEFORE = ("attention: SDPA", "GELU: tanh", "AdamW: foreach")  # the code before cbd42a5


def apply_variant(trainer: Any, choices: tuple[str, ...]) -> None:
    """Force the given implementation choices on this trainer's model and optimizer."""
    from disttrain.train.optim import lr_lambda

    model = trainer.model.inner
    for block in getattr(model, "blocks", []):
        if "GELU: tanh" in choices:
            block.mlp.forward = types.MethodType(_mlp_gelu_tanh, block.mlp)
        if "attention: SDPA" in choices:
            block.attn.forward = types.MethodType(_attn_sdpa, block.attn)
        if "attention: bmm" in choices:
            block.attn.forward = types.MethodType(_attn_bmm, block.attn)
    if "AdamW: foreach" in choices or "AdamW: fused" in choices:
        old = trainer.optimizer
        groups = [{"params": g["params"], "weight_decay": g["weight_decay"]} for g in old.param_groups]
        d = old.defaults
        fused = "AdamW: fused" in choices
        trainer.optimizer = torch.optim.AdamW(
            groups, lr=d["lr"], betas=d["betas"], eps=d["eps"], foreach=None if fused else True, fused=fused or None
        )
        trainer.scheduler = torch.optim.lr_scheduler.LambdaLR(trainer.optimizer, lr_lambda(trainer.cfg))


class GemmsOnly:
    """The default GPT's matmuls and nothing else: per block the 4 linear layers (forward + the two backward
    GEMMs) and the attention bmm's (q k^T, p v, forward and backward), the head; in ``dtype`` (bf16 unless
    told), micro-batch 8."""

    def __init__(
        self,
        vocab: int,
        b: int = 8,
        t: int = 256,
        c: int = 384,
        h: int = 6,
        layers: int = 6,
        dtype: torch.dtype = torch.bfloat16,
    ) -> None:
        bf = dtype
        n = b * t
        shapes = [(c, 3 * c), (c, c), (c, 4 * c), (4 * c, c)] * layers + [(c, vocab)]
        self.linears = [
            (
                torch.randn(n, i, dtype=bf, requires_grad=True),
                torch.randn(o, i, dtype=bf, requires_grad=True),
                torch.randn(n, o, dtype=bf),
            )
            for i, o in shapes
        ]
        d = c // h
        self.attn = [
            (
                torch.randn(b * h, t, d, dtype=bf, requires_grad=True),
                torch.randn(b * h, t, d, dtype=bf, requires_grad=True),
                torch.randn(b * h, t, d, dtype=bf, requires_grad=True),
            )
            for _ in range(layers)
        ]

    def run(self, n: int) -> None:
        for _ in range(n):
            for x, w, g in self.linears:
                F.linear(x, w).backward(g)
            for q, k, v in self.attn:
                p = torch.bmm(q, k.transpose(1, 2))
                torch.bmm(p, v).backward(v)
            for x, w, _ in self.linears:
                x.grad = w.grad = None
            for q, k, v in self.attn:
                q.grad = k.grad = v.grad = None


# -- clocks and compile time ---------------------------------------------------------------------------
def on_cpu_clock(runners: dict[str, Any], cpu: dict[str, list[float]]) -> dict[str, Any]:
    """The runners, each also appending its CPU seconds per step (this thread's: one intra-op thread) to
    ``cpu[name]``: time the step computed, not time it waited for a core that another process held."""

    def clocked(name: str, run: Any) -> Any:
        def timed(n: int) -> None:
            t0 = time.thread_time()
            run(n)
            cpu.setdefault(name, []).append((time.thread_time() - t0) / n)

        return timed

    return {name: clocked(name, run) for name, run in runners.items()}


def cpu_peak_tflops(dtype: torch.dtype, n: int = 1024, reps: int = 6) -> float:
    """The square-matmul peak on the CPU clock (see on_cpu_clock)."""
    a, b = torch.randn(n, n).to(dtype), torch.randn(n, n).to(dtype)
    a @ b
    t0 = time.thread_time()
    for _ in range(reps):
        a @ b
    return 2 * n**3 * reps / (time.thread_time() - t0) / 1e12


COMPILE_MODES = {"compile: blocks": "blocks", "compile: model": "model"}


def first_steps(runners: dict[str, Any], cold: bool) -> dict[str, float]:
    """Each variant's first step, timed alone (the compile variants compile in it); with ``cold``, in a fresh
    inductor cache folder per variant, so none reuses another's kernels from disk."""

    out = {}
    before = os.environ.get("TORCHINDUCTOR_CACHE_DIR")
    for name, run in runners.items():
        with tempfile.TemporaryDirectory(prefix="disttrain-inductor-") as tmp:
            if cold and name in COMPILE_MODES:
                os.environ["TORCHINDUCTOR_CACHE_DIR"] = tmp
            t0 = time.perf_counter()
            run(1)
            out[name] = time.perf_counter() - t0
            if before is None:
                os.environ.pop("TORCHINDUCTOR_CACHE_DIR", None)
            else:
                os.environ["TORCHINDUCTOR_CACHE_DIR"] = before
    return out


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
    by_time = sorted(kinds.items(), key=lambda kv: -kv[1])
    return {
        "profiled_ms_per_step": total / steps / 1e3,
        "kinds": {k: {"ms_per_step": v / steps / 1e3, "share": v / total} for k, v in by_time},
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


def print_profiles(profiles: dict[str, Any], top: int) -> None:
    for name, prof in profiles.items():
        C.table(
            ["kind", "ms/step", "share"],
            [[k, v["ms_per_step"], f"{v['share'] * 100:.1f}%"] for k, v in prof["kinds"].items()],
            title=(
                f"\nWhere the step goes ({name}; torch.profiler self CPU time, "
                f"{prof['profiled_ms_per_step']:.0f} ms/step profiled)"
            ),
        )
    C.table(
        ["op", "ms/step", "share", "calls/step"],
        [
            [o["op"][:60], o["ms_per_step"], f"{o['share'] * 100:.1f}%", o["calls_per_step"]]
            for o in profiles["as is"]["top_ops"]
        ],
        title=f"\nTop {top} ops by self CPU time (as is)",
    )
