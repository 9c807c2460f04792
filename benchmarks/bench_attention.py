"""The GPT's bf16 CPU attention in query chunks (``models.gpt.causal_attention_bmm``) against one chunk: attention
forward + backward alone (48 heads of 64) at the chunk counts around the rule, and one training step of the
default-width GPT (2,048 tokens per step) with the rule's chunks against one; one thread, the job's allocator.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F

from benchmarks import harness as H

OPTIONS = {
    "contexts": ("256,512,1024,2048", "context lengths, comma-separated"),
    **H.options(rounds=6),
    "heads": (48, "attention alone: heads of 64 (micro-batch 8 x 6 heads)"),
    "step_tokens": (2048, "tokens of the training step compared (0: leave it out)"),
}
QUICK = {"contexts": "256,512", "rounds": 1, "heads": 8, "step_tokens": 0}  # (bf16 is slow where it is emulated)


def attention_run(t: int, heads: int) -> Callable[[], None]:
    from disttrain.models import gpt

    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(heads, t, 64, generator=g).bfloat16().requires_grad_() for _ in range(3))
    grad_out = torch.randn(heads, t, 64, generator=g).bfloat16()
    return lambda: gpt.causal_attention_bmm(q, k, v, 0.0).backward(grad_out)


def step_run(t: int, tokens: int) -> Callable[[], None]:
    from disttrain.models.gpt import GPT, GPTConfig

    model = GPT(GPTConfig(vocab_size=65, n_layers=6, d_model=384, n_heads=6, context=t))
    opt = torch.optim.AdamW(model.parameters(), fused=True)
    idx = torch.randint(0, 65, (max(1, tokens // t), t), generator=torch.Generator().manual_seed(0))

    def run() -> None:
        with torch.autocast("cpu", dtype=torch.bfloat16):
            logits = model(idx)
        F.cross_entropy(logits.float().flatten(0, 1), idx.flatten()).backward()
        opt.step()
        opt.zero_grad()

    return run


def compare(run: Callable[[], None], counts: list[int], rounds: int) -> dict[str, list[float]]:
    """Seconds per call of ``run`` with each chunk count in ``counts``, interleaved."""
    from disttrain.models import gpt

    rule = gpt.causal_chunks

    def variant(n: int) -> Callable[[int], Any]:
        def go(steps: int) -> None:
            gpt.causal_chunks = lambda t: min(n, t)
            for _ in range(steps):
                run()

        return go

    try:
        return H.interleave({str(n): variant(n) for n in counts}, steps_per_block=2, rounds=rounds, warmup=1)
    finally:
        gpt.causal_chunks = rule


def run(args: argparse.Namespace) -> dict[str, Any]:
    from disttrain.models.gpt import causal_chunks
    from disttrain.utils.malloc import keep_large_buffers

    H.one_thread()
    print(f"job allocator (keep_large_buffers): {keep_large_buffers()}")
    rows, data = [], {}
    for t in (int(x) for x in args.contexts.split(",")):
        rule = causal_chunks(t)
        counts = sorted({n for n in (2, 4, 8) if n <= t // 128} | {1, rule})  # chunks of 128 rows at least
        attn = compare(attention_run(t, args.heads), counts, args.rounds)
        best = min(counts, key=lambda n: H.median(attn[str(n)]))
        for n in counts:
            mark = ("rule" if n == rule else "") + (" best" if n == best else "")
            rows.append({"context": f"t={t}", "chunks": n, "ms": H.median(attn[str(n)]) * 1e3})
            rows[-1] |= {"speed vs 1 chunk": H.paired_ratio(attn["1"], attn[str(n)]), "": mark.strip()}
        data[str(t)] = {"rule": rule, "attention_s": attn}
        if args.step_tokens:
            step = compare(step_run(t, args.step_tokens), sorted({1, rule}), max(2, args.rounds // 2))
            step_speed = H.paired_ratio(step["1"], step[str(rule)]) if rule != 1 else 1.0
            rows.append({"context": f"t={t} step", "chunks": rule, "ms": H.median(step[str(rule)]) * 1e3})
            rows[-1] |= {"speed vs 1 chunk": step_speed, "": "rule vs 1 chunk"}
            data[str(t)] |= {"step_s": step, "step_speed": step_speed}
    H.table(rows, "bf16 causal attention by batched matmuls")
    return {"rows": rows, "contexts": data}


if __name__ == "__main__":
    H.main(__file__, __doc__, OPTIONS, QUICK, run)
