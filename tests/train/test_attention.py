"""The GPT's CPU attention by batched matmuls in query chunks: same results as SDPA's causal attention."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from disttrain.models import gpt
from disttrain.models.gpt import GPT, GPTConfig, causal_attention_bmm, causal_chunks

pytestmark = pytest.mark.timeout(60)


def _qkv(t: int, dtype: torch.dtype, seed: int = 0) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(6, t, 16, generator=g).to(dtype).requires_grad_() for _ in range(3)]


def _forward_backward(fn, q, k, v) -> list[torch.Tensor]:  # type: ignore[no-untyped-def]
    y = fn(q, k, v)
    y.backward(torch.linspace(-1, 1, y.numel()).view_as(y).to(y.dtype))
    return [y.detach().float()] + [z.grad.float() for z in (q, k, v)]


def _sdpa(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    return F.scaled_dot_product_attention(q, k, v, is_causal=True)


def test_chunk_counts_follow_the_measured_rule() -> None:
    assert [causal_chunks(t) for t in (1, 256, 511, 512, 1023, 1024, 1536, 2048)] == [1, 1, 1, 2, 2, 2, 3, 4]


@pytest.mark.parametrize("t", [1, 7, 300, 520, 1100])
def test_chunked_attention_equals_sdpa_in_fp32(t: int) -> None:
    mine = _forward_backward(lambda q, k, v: causal_attention_bmm(q, k, v, 0.0), *_qkv(t, torch.float32))
    ref = _forward_backward(_sdpa, *_qkv(t, torch.float32))
    for a, b, name in zip(mine, ref, ("out", "dq", "dk", "dv"), strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5, msg=lambda m, n=name: f"{n} at t={t}: {m}")


def test_chunked_attention_matches_one_chunk_in_bf16(monkeypatch: pytest.MonkeyPatch) -> None:
    chunked = _forward_backward(lambda q, k, v: causal_attention_bmm(q, k, v, 0.0), *_qkv(512, torch.bfloat16))
    monkeypatch.setattr(gpt, "causal_chunks", lambda t: 1)
    whole = _forward_backward(lambda q, k, v: causal_attention_bmm(q, k, v, 0.0), *_qkv(512, torch.bfloat16))
    ref = _forward_backward(_sdpa, *_qkv(512, torch.float32))
    for a, b, r in zip(chunked, whole, ref, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-2, atol=1e-2)  # same math; only the GEMMs' blocking differs
        torch.testing.assert_close(a, r, rtol=3e-2, atol=3e-2)  # and bf16 of the fp32 answer


def test_the_model_gives_the_same_loss_by_either_attention_path() -> None:
    cfg = GPTConfig(vocab_size=50, n_layers=2, d_model=32, n_heads=4, context=520)
    model = GPT(cfg)
    idx = torch.randint(0, 50, (2, 520), generator=torch.Generator().manual_seed(1))
    losses = []
    for bmm in (True, False):
        for m in model.modules():
            if hasattr(m, "bmm_on_cpu"):
                m.bmm_on_cpu = bmm
        with torch.autocast("cpu", dtype=torch.bfloat16):
            logits = model(idx)
        losses.append(F.cross_entropy(logits.float().flatten(0, 1), idx.flatten()).item())
    assert losses[0] == pytest.approx(losses[1], rel=1e-2)
