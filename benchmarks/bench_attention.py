"""The GPT's bf16 CPU attention in query chunks (``models.gpt.causal_attention_bmm``) against one chunk, side by side.

Per context length: attention forward + backward alone (48 heads of 64, as micro-batch 8 x 6 heads) at the
chunk counts around the rule, and one training step of the default-width GPT (6 x 384, tokens per step held at
2,048: micro-batch 2048 / context) with the rule's chunks against one chunk. bf16 (autocast for the step),
one thread, the allocator a job runs with (``utils.malloc.keep_large_buffers``); blocks of steps alternate
(``_common.interleave``), speed = paired median of one-chunk / chunked times.

    .venv/bin/python -m benchmarks.bench_attention [--contexts 256,512,1024,2048] [--rounds 6]
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F

from benchmarks import _common as C


def chunks_fixed(n: int) -> Callable[[int], int]:
    return lambda t: min(n, t)


def attention_run(t: int) -> Callable[[], None]:
    from disttrain.models import gpt

    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(48, t, 64, generator=g).bfloat16().requires_grad_() for _ in range(3))
    grad_out = torch.randn(48, t, 64, generator=g).bfloat16()
    return lambda: gpt.causal_attention_bmm(q, k, v, 0.0).backward(grad_out)


def step_run(t: int) -> Callable[[], None]:
    from disttrain.models.gpt import GPT, GPTConfig

    model = GPT(GPTConfig(vocab_size=65, n_layers=6, d_model=384, n_heads=6, context=t))
    opt = torch.optim.AdamW(model.parameters(), fused=True)
    idx = torch.randint(0, 65, (max(1, 2048 // t), t), generator=torch.Generator().manual_seed(0))

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
            gpt.causal_chunks = chunks_fixed(n)
            for _ in range(steps):
                run()

        return go

    try:
        return C.interleave({str(n): variant(n) for n in counts}, steps_per_block=2, rounds=rounds, warmup=1)
    finally:
        gpt.causal_chunks = rule


def main(argv: list[str]) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--contexts", default="256,512,1024,2048")
    p.add_argument("--rounds", type=int, default=6)
    args = p.parse_args(argv)
    C.one_thread()
    C.print_machine()
    from disttrain.models.gpt import causal_chunks
    from disttrain.utils.malloc import keep_large_buffers

    print(f"job allocator (keep_large_buffers): {keep_large_buffers()}")
    rows, data = [], {}
    for t in (int(x) for x in args.contexts.split(",")):
        rule = causal_chunks(t)
        counts = sorted({n for n in (2, 4, 8) if n <= t // 128} | {1, rule})  # chunks of 128 rows at least
        attn = compare(attention_run(t), counts, args.rounds)
        step = compare(step_run(t), sorted({1, rule}), max(2, args.rounds // 2))
        best = min(counts, key=lambda n: C.median(attn[str(n)]))
        for n in counts:
            speed = C.paired_ratio(attn["1"], attn[str(n)])
            mark = ("rule" if n == rule else "") + (" best" if n == best else "")
            rows.append([f"t={t}", n, C.median(attn[str(n)]) * 1e3, speed, mark.strip()])
        step_speed = C.paired_ratio(step["1"], step[str(rule)]) if rule != 1 else 1.0
        rows.append([f"t={t} step", rule, C.median(step[str(rule)]) * 1e3, step_speed, "rule vs 1 chunk"])
        data[str(t)] = {"rule": rule, "attention_s": attn, "step_s": step, "step_speed": step_speed}
    C.table(["context", "chunks", "ms", "speed vs 1 chunk", ""], rows, "bf16 causal attention by batched matmuls")
    C.write_results("bench_attention", data)


if __name__ == "__main__":
    main(sys.argv[1:])
