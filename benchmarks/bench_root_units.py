"""``parallel.root_units``: the embeddings and the head in the root unit (``one``) or in units of their own
(``split``), for a model whose vocabulary outweighs its blocks: the plan's per-rank peak and the measured one.

The model is the built-in GPT with a 16,384-token vocabulary, untied (4 blocks of width 256, context 128:
8.4M parameters in the embedding and head against 0.8M per block), trained by FSDP on 2 ranks (gloo, one
thread each), micro-batch 4, fp32. Each variant runs in a launch of its own through
``disttrain.jobs.measure.measure`` (what ``disttrain estimate --measure`` runs): exact bytes of the parameters,
gradients and optimizer state, and the process RSS peak above the RSS before the model was built. Memory does
not depend on the load; the step times are printed too, but they come from separate launches.

    .venv/bin/python -m benchmarks.bench_root_units
"""

from __future__ import annotations

import argparse
import dataclasses
import sys

from torch import nn

from benchmarks import _common as C

VOCAB, LAYERS, WIDTH, HEADS, CONTEXT = 16384, 4, 256, 4, 128


def big_vocab() -> nn.Module:
    """``model.module`` factory: the GPT above (its character data uses the first ids of the vocabulary)."""
    from disttrain.models.gpt import GPT, GPTConfig

    return GPT(GPTConfig(vocab_size=VOCAB, n_layers=LAYERS, d_model=WIDTH, n_heads=HEADS, context=CONTEXT))


def main(argv: list[str]) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--nproc", type=int, default=2)
    args = p.parse_args(argv)
    from disttrain.config import from_dict
    from disttrain.jobs.measure import measure
    from disttrain.plan.estimate import Layout, plan_job
    from disttrain.train.loss import cross_entropy

    C.print_machine()
    base = from_dict(
        {
            "model": {"module": "benchmarks.bench_root_units:big_vocab", "context": CONTEXT},
            "train": {"micro_batch": 4, "global_batch": 4 * args.nproc, "eval_interval": 0},
            "parallel": {"device": "cpu", "nproc": args.nproc, "blocks_per_unit": 1},
            "precision": {"dtype": "fp32"},
            "metrics": {"progress": "off"},
        }
    )
    rows, out = [], {}
    for setting in ("one", "split"):
        cfg = dataclasses.replace(base, parallel=dataclasses.replace(base.parallel, root_units=setting))
        plan = plan_job(cfg, Layout(args.nproc, 1, 2**40), cross_entropy).plans["fsdp"]
        got = measure(cfg, args.nproc, ["fsdp"])["fsdp"]
        if "error" in got:
            raise SystemExit(f"{setting}: {got['error']}")
        out[setting] = {"planned_peak": plan.total, "planned_gathered": plan.gathered, **got}
        rows.append(
            [
                setting,
                f"{plan.gathered / 2**20:.1f}",
                f"{plan.total / 2**20:.1f}",
                f"{got['peak'] / 2**20:.1f}",
                f"{got['step_s'] * 1e3:.0f}",
            ]
        )
    C.table(["root_units", "plan: gathered MiB", "plan: peak MiB", "measured peak MiB", "step ms"], rows)
    saved = out["one"]["peak"] - out["split"]["peak"]
    planned = out["one"]["planned_peak"] - out["split"]["planned_peak"]
    print(f"split saves {saved / 2**20:.1f} MiB per rank measured, {planned / 2**20:.1f} MiB planned")
    C.write_results("bench_root_units", {"args": vars(args), "results": out})


if __name__ == "__main__":
    main(sys.argv[1:])
