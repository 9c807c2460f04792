"""What-if variants of a Trainer (bench_mfu.py, bench_precision.py): implementation choices forced onto one
model instance and optimizer at run time (src/ is untouched), and the default GPT's GEMMs alone."""

from __future__ import annotations

import types
from typing import Any

import torch
import torch.nn.functional as F


def _mlp_gelu_tanh(self: Any, x: torch.Tensor) -> torch.Tensor:
    return self.proj(F.gelu(self.fc(x), approximate="tanh"))


def _attn_sdpa(self: Any, x: torch.Tensor) -> torch.Tensor:
    b, t, c = x.shape
    q, k, v = self.qkv(x).view(b, t, 3, self.n_heads, c // self.n_heads).permute(2, 0, 3, 1, 4)
    y = F.scaled_dot_product_attention(q, k, v, is_causal=True, dropout_p=self.dropout if self.training else 0.0)
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
    if "AdamW: foreach" in choices or "AdamW: fused" in choices:
        old = trainer.optimizer
        groups = [{"params": g["params"], "weight_decay": g["weight_decay"]} for g in old.param_groups]
        d = old.defaults
        fused = "AdamW: fused" in choices
        trainer.optimizer = torch.optim.AdamW(
            groups, lr=d["lr"], betas=d["betas"], eps=d["eps"], foreach=None if fused else True, fused=fused or None
        )
        trainer.scheduler = torch.optim.lr_scheduler.LambdaLR(trainer.optimizer, lr_lambda(trainer.cfg))
    if "compile" in choices:
        trainer.model.inner.compile()


class GemmsOnly:
    """The default GPT's matmuls and nothing else: per block the 4 linear layers (forward + the two backward
    GEMMs) and the attention bmm's (q k^T, p v, forward and backward), the head; bf16, micro-batch 8."""

    def __init__(self, vocab: int, b: int = 8, t: int = 256, c: int = 384, h: int = 6, layers: int = 6) -> None:
        bf = torch.bfloat16
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
