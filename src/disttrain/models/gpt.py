"""The default model: a small GPT (pre-norm transformer decoder). Plain nn.Module, no distributed code.

Initialisation is *per parameter name*: each parameter is drawn from its own generator seeded by
(seed, name). The same weights therefore come out whether the model is built whole on one process, or
built on the meta device and materialised shard by shard under FSDP at any world size
(see :func:`disttrain.parallel.meta_init.materialize`).
"""

from __future__ import annotations

import itertools
import math
import zlib
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from disttrain.utils.peak import cpu_has_fast_bf16


@dataclass(frozen=True)
class GPTConfig:
    vocab_size: int
    n_layers: int = 6
    d_model: int = 384
    n_heads: int = 6
    context: int = 256
    dropout: float = 0.0


def causal_chunks(t: int) -> int:
    """Query chunks for :func:`causal_attention_bmm`: none below t = 512, then 2, then rows of 512.

    Measured by ``benchmarks/bench_attention.py`` (bf16, AMD EPYC AVX512-BF16, one thread, the job's allocator;
    figures in docs/performance.md): against one chunk, attention is 1.15x faster at t = 512 in 2 chunks, 1.20x
    at 1024 in 2 (4: 1.21x), 1.35x at 2048 in 4, and a training step 1.06-1.18x. At t = 256 the step is not
    measurably faster: the slicing in the backward costs what the skipped blocks save.
    """
    return 1 if t < 512 else max(2, t // 512)


def causal_attention_bmm(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, dropout_p: float) -> torch.Tensor:
    """Causal softmax attention of ``(batch x heads, t, head_dim)`` tensors by batched matmuls.

    The queries go in chunks; chunk i only meets the keys up to its own last position, so the matmuls and
    the softmax skip the blocks above the diagonal that the mask would zero (2 chunks: 3/4 of the work;
    4: 5/8). Each row's softmax sees exactly the keys it saw unchunked, so the result
    is the same math as one masked ``baddbmm`` over all keys.
    """
    t, d = q.shape[1], q.shape[2]
    n = causal_chunks(t)
    edges = [round(i * t / n) for i in range(n + 1)]
    mask = torch.full((t, t), float("-inf"), device=q.device, dtype=q.dtype).triu(1)
    ys = []
    for lo, hi in itertools.pairwise(edges):
        scores = torch.baddbmm(
            mask[lo:hi, :hi].expand(q.shape[0], hi - lo, hi),
            q[:, lo:hi],
            k[:, :hi].transpose(1, 2),
            alpha=1.0 / math.sqrt(d),
        )
        ys.append(torch.bmm(F.dropout(torch.softmax(scores, dim=-1), dropout_p), v[:, :hi]))
    return ys[0] if n == 1 else torch.cat(ys, dim=1)


class Attention(nn.Module):
    def __init__(self, cfg: GPTConfig) -> None:
        super().__init__()
        self.n_heads = cfg.n_heads
        self.qkv = nn.Linear(cfg.d_model, 3 * cfg.d_model)
        self.proj = nn.Linear(cfg.d_model, cfg.d_model)
        self.dropout = cfg.dropout
        self.bmm_on_cpu = cpu_has_fast_bf16()  # low-precision attention by batched matmuls (see forward)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, c = x.shape
        d = c // self.n_heads
        # qkv's rows are head-major (head, q|k|v, head_dim): a contiguous slice of them is whole heads, so under
        # tensor parallelism a rank's column shard holds its heads' q, k and v, and h is its local head count
        q, k, v = self.qkv(x).view(b, t, -1, 3, d).permute(3, 0, 2, 1, 4)
        h = q.shape[1]
        p = self.dropout if self.training else 0.0
        if x.device.type != "cpu" or q.dtype == torch.float32 or not self.bmm_on_cpu:
            # fp32 on CPU: SDPA's flash kernel (it skips the masked half) is ~1.28x faster than the matmuls
            # below (attention forward + backward, AMD EPYC AVX2); emulated bf16: ~2x. With AVX512-BF16 the bmm path
            # below is 1.13x faster per bf16 step (benchmarks/bench_mfu.py; docs/performance.md).
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True, dropout_p=p)
        else:
            # bf16 on a CPU with AMX or AVX512-BF16: batched matmuls beat SDPA's flash kernel (~1.17x, 1.13x per step).
            q, k, v = (z.reshape(b * h, t, d) for z in (q, k, v))
            y = causal_attention_bmm(q, k, v, p).view(b, h, t, d)
        return self.proj(y.transpose(1, 2).reshape(b, t, h * d))


class MLP(nn.Module):
    def __init__(self, cfg: GPTConfig) -> None:
        super().__init__()
        self.fc = nn.Linear(cfg.d_model, 4 * cfg.d_model)
        self.proj = nn.Linear(4 * cfg.d_model, cfg.d_model)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.proj(F.gelu(self.fc(x)))  # the erf form: faster than tanh on CPU


class Block(nn.Module):
    """One transformer block: the unit FSDP shards."""

    def __init__(self, cfg: GPTConfig) -> None:
        super().__init__()
        self.ln1 = nn.LayerNorm(cfg.d_model)
        self.attn = Attention(cfg)
        self.ln2 = nn.LayerNorm(cfg.d_model)
        self.mlp = MLP(cfg)
        self.drop = nn.Dropout(cfg.dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.drop(self.attn(self.ln1(x)))
        return x + self.drop(self.mlp(self.ln2(x)))


class GPT(nn.Module):
    """Character-level GPT; ``forward(idx) -> logits`` of shape (batch, time, vocab)."""

    def __init__(self, cfg: GPTConfig, seed: int = 0) -> None:
        super().__init__()
        self.cfg = cfg
        self.init_seed = seed
        self.tok_emb = nn.Embedding(cfg.vocab_size, cfg.d_model)
        self.pos_emb = nn.Embedding(cfg.context, cfg.d_model)
        self.drop = nn.Dropout(cfg.dropout)
        self.blocks = nn.ModuleList(Block(cfg) for _ in range(cfg.n_layers))
        self.ln_f = nn.LayerNorm(cfg.d_model)
        self.head = nn.Linear(cfg.d_model, cfg.vocab_size, bias=False)
        if not any(p.is_meta for p in self.parameters()):
            with torch.no_grad():
                for name, p in self.named_parameters():
                    self.init_param(name, p)

    def get_input_embeddings(self) -> nn.Embedding:
        """The token embedding (the name Hugging Face models answer to)."""
        return self.tok_emb

    def init_param(self, name: str, tensor: torch.Tensor) -> None:
        """Fill ``tensor`` (the *full* parameter ``name``) deterministically from (seed, name)."""
        gen = torch.Generator().manual_seed(self.init_seed * 1_000_003 + zlib.crc32(name.encode()))
        if name.endswith("bias"):
            tensor.zero_()
        elif ".ln" in name or name.startswith("ln_"):
            tensor.fill_(1.0)
        else:
            std = 0.02
            if name.endswith("proj.weight"):  # residual projections (GPT-2 scaling)
                std = 0.02 / math.sqrt(2 * self.cfg.n_layers)
            tensor.copy_(torch.randn(tensor.shape, generator=gen) * std)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        """Token ids -> logits; a pipeline stage without the embeddings takes hidden states instead, and one
        without the head returns them (:mod:`disttrain.parallel.pipeline` cuts the model so)."""
        t = idx.shape[1]
        if t > self.cfg.context:
            raise ValueError(f"sequence length {t} exceeds the model's context {self.cfg.context}")
        x = idx
        if self.tok_emb is not None:
            pos = torch.arange(t, device=idx.device)
            x = self.drop(self.tok_emb(idx) + self.pos_emb(pos))
        for block in self.blocks:
            x = block(x)
        return x if self.head is None else self.head(self.ln_f(x))

    def flops_per_token(self) -> float:
        """Training FLOPs per token: 6 x matmul params + attention (12 x layers x width x context)."""
        c = self.cfg
        matmul_params = sum(p.numel() for n, p in self.named_parameters() if n.endswith("weight") and p.dim() == 2)
        matmul_params -= (c.context + c.vocab_size) * c.d_model  # embeddings are lookups, not matmuls
        return 6.0 * matmul_params + 12.0 * c.n_layers * c.d_model * c.context

    @torch.no_grad()
    def generate(self, idx: torch.Tensor, n: int, temperature: float = 0.8, seed: int = 0) -> torch.Tensor:
        """Sample ``n`` tokens after ``idx`` (batch, time)."""
        gen = torch.Generator(device=idx.device).manual_seed(seed)
        for _ in range(n):
            logits = self(idx[:, -self.cfg.context :])[:, -1].float() / temperature
            nxt = torch.multinomial(torch.softmax(logits, dim=-1), 1, generator=gen)
            idx = torch.cat([idx, nxt], dim=1)
        return idx
