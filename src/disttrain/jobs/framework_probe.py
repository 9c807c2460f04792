"""The framework costs the step-time plan needs, measured on this machine by ``disttrain doctor`` (and by the
first plan on a machine with no figures): the time one dispatched operator costs in forward and backward (what
a small model's step is made of), and FSDP2's fixed cost per unit pass (pre/post hooks, copy-in/copy-out,
DTensor views). Both used to be constants measured on one CPU; they differ several-fold between machines.

:func:`op_seconds` runs in one process; :func:`fsdp_probe` on every rank of a process group, its raw times
turned into a cost per pass by :func:`unit_overhead` once the link is fitted (the probe's collectives are taken
out with the link's own ring times).
May import: ``disttrain.models``, ``disttrain.plan``.
"""

from __future__ import annotations

import statistics
import time
from typing import Any

import torch
from torch import nn

from disttrain.plan.machine import LinkFit

PROBE_BLOCKS = 16
"""Units in the FSDP probe: enough that their fixed cost dwarfs the noise of one step."""
PROBE_WIDTH = 16
"""Width of a probe block: small, so that the hooks, not the FLOPs or the bytes, set the step."""


def _tiny_gpt() -> tuple[nn.Module, torch.Tensor, torch.Tensor]:
    from disttrain.models.gpt import GPT, GPTConfig

    cfg = GPTConfig(vocab_size=32, n_layers=2, d_model=16, n_heads=2, context=8)
    gen = torch.Generator().manual_seed(0)
    x = torch.randint(0, 32, (1, 8), generator=gen)
    return GPT(cfg), x, torch.roll(x, -1, 1)


def op_seconds(iters: int = 30) -> float:
    """Seconds of framework time per forward operator, as the plan counts it (a forward's operators, about
    twice as many again in backward: ``step = 3 x ops x this``), from the built-in GPT at a size where
    nothing but dispatch takes time; the median over ``iters`` steps, on one thread."""
    from disttrain.plan.profile import OpCounter

    model, x, y = _tiny_gpt()

    def step() -> None:
        logits = model(x)
        torch.nn.functional.cross_entropy(logits.flatten(0, 1), y.flatten()).backward()

    with OpCounter() as ops:
        model(x)  # the loss's operators are few; the plan counts the model's and the loss's alike
    step()  # warm-up
    times = []
    for _ in range(iters):
        t0 = time.perf_counter()
        step()
        times.append(time.perf_counter() - t0)
    return statistics.median(times) / (3 * max(ops.count, 1))


def _probe_step(blocks_per_unit: int) -> tuple[Any, Any, torch.Tensor, torch.Tensor]:
    """The built-in GPT of :data:`PROBE_BLOCKS` blocks of width :data:`PROBE_WIDTH`, parallelized with FSDP as a
    job on this machine runs it (its default precision, prefetch and reshard) with ``blocks_per_unit``, its
    optimizer, and a batch."""
    import torch.distributed as dist

    from disttrain.config import from_dict
    from disttrain.models.gpt import GPT, GPTConfig
    from disttrain.parallel.env import resolve_precision
    from disttrain.parallel.parallelize import parallelize
    from disttrain.parallel.strategies import dims_from_config
    from disttrain.train.optim import build_optimizer

    cfg = from_dict({"parallel": {"device": "cpu", "strategy": "fsdp", "blocks_per_unit": blocks_per_unit}})
    precision = resolve_precision(cfg.precision, "cpu")
    model = GPT(GPTConfig(vocab_size=32, n_layers=PROBE_BLOCKS, d_model=PROBE_WIDTH, n_heads=2, context=8))
    world = dist.get_world_size()
    dims = dims_from_config(cfg.parallel, world, world, "fsdp")
    wrapped = parallelize(model, cfg.parallel, precision, dims=dims, device=torch.device("cpu"))
    gen = torch.Generator().manual_seed(0)
    x = torch.randint(0, 32, (2, 8), generator=gen)
    return wrapped, build_optimizer(wrapped.module, cfg), x, torch.roll(x, -1, 1)


def fsdp_probe(steps: int = 7) -> dict[str, Any]:
    """Every rank of the default group: the median time of a whole training step (forward, backward, the global
    clip, the optimizer) of :data:`PROBE_BLOCKS` tiny transformer blocks sharded one unit per block, and as one
    unit, alternating (load drifting over the probe hits both alike)."""
    import torch.distributed as dist

    layouts = {"per_block": _probe_step(1), "one": _probe_step(PROBE_BLOCKS)}
    times: dict[str, list[float]] = {name: [] for name in layouts}
    for i in range(steps + 1):
        for name, (model, optimizer, x, y) in layouts.items():
            dist.barrier()
            t0 = time.perf_counter()
            logits = model(x)
            torch.nn.functional.cross_entropy(logits.float().flatten(0, 1), y.flatten()).backward()
            model.clip_grad_norm_(1.0)
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            if i:  # the first step sets up buffers and the optimizer's state
                times[name].append(time.perf_counter() - t0)
    block = layouts["one"][0].module.blocks[0]
    numel = sum(p.numel() for p in block.parameters()) // dist.get_world_size()  # sharded: a rank's part
    numel *= dist.get_world_size()
    return {
        "nranks": dist.get_world_size(),
        "blocks": PROBE_BLOCKS,
        "block_bytes": numel * 4,
        "per_block_s": statistics.median(times["per_block"]),
        "one_s": statistics.median(times["one"]),
    }


def unit_overhead(probe: dict[str, Any], link: LinkFit) -> float:
    """Seconds of FSDP2's fixed cost per unit pass (one all-gather's worth of hooks and copies), from
    :func:`fsdp_probe`'s times less the two layouts' collectives on ``link``: one unit per block all-gathers
    every block twice but the last (reshard after forward), and reduce-scatters each once; one unit gathers and
    reduce-scatters everything once. Never below 0 (a noisy probe)."""
    b, nbytes, n = int(probe["blocks"]), int(probe["block_bytes"]), int(probe["nranks"])
    many = (2 * b - 1) * link.ring_time(nbytes, n, "all_gather") + b * link.ring_time(nbytes, n, "reduce_scatter")
    one = link.ring_time(b * nbytes, n, "all_gather") + link.ring_time(b * nbytes, n, "reduce_scatter")
    hooks = (float(probe["per_block_s"]) - float(probe["one_s"])) - (many - one)
    return max(hooks, 0.0) / (2 * b - 2)
