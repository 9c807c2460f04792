"""``disttrain ps``'s default job against the plain single-process loop a user would write for the same model.

The baseline (:func:`one_process`, its own process: ``--baseline THREADS``): the same DLRM-style model in ONE
process, written plainly: an ``nn.Embedding(rows, dim, sparse=True)`` per table (rows initialised as the servers
initialise theirs) with row-sparse ``torch.optim.Adagrad`` (the servers' default optimizer and rate), and
disttrain's ``DenseArch`` with Adam; batch = the PS job's global batch, drawn as the PS draws it (the same
samples in the same order); evaluations as the PS job's, inside the timed loop, so samples/s count the same
work. Two variants: torch's default threads (what a user gets) and one thread (as each PS process runs); the
verdict is against the faster. ``disttrain ps`` runs as a user runs it, the default job and three variants of
it; figures from ``summary.json``. ``--rounds`` rounds, the order rotating; medians, ratios paired per round.

RPC costs: two processes joined by ``disttrain.rpc.transport``; the caller times a call of an empty function and
``disttrain.ps.server.pull_many`` of server 0's share of one trainer's batch, as the PS trainers pull it.

    .venv/bin/python -m benchmarks.bench_ps_baseline [--rounds 3] [--rpc-calls 2000]
"""

from __future__ import annotations

import argparse
import functools
import itertools
import json
import os
import tempfile
import time
import warnings
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from benchmarks import harness as H
from disttrain.ps.clicks import ClickLog, auc
from disttrain.ps.config import PSJobConfig
from disttrain.ps.model import DenseArch
from disttrain.ps.table import init_rows
from disttrain.testing.ports import free_port

GOALS = {"speed": H.Goal("samples/s, PS / one process", 0.5), "auc": H.Goal("|AUC gap|", 0.003, False)}
OPTIONS = {
    "rounds": (3, "rounds of every variant"),
    "rpc_calls": (2000, "RPC calls timed per figure"),
    "steps": (0, "steps of every job (0: the default job's)"),
}
QUICK = {"rounds": 1, "rpc_calls": 50, "steps": 20}
VARIANTS = {  # label: the command's options
    "disttrain ps (default job: 2 processes, each a trainer and a server, overlapped steps)": "",
    "disttrain ps --ps.overlap off (every read after every update: one process exactly)": "--ps.overlap off",
    "disttrain ps --ps.colocate off (servers of their own: 4 processes)": "--ps.colocate off",
    "disttrain ps --ps.cache-rows 4096": "--ps.cache-rows 4096",
}


# -- the plain single-process loop ----------------------------------------------------------------------
def one_process(args: argparse.Namespace) -> dict[str, Any]:
    """The whole default PS job's training in one plain loop (``--baseline THREADS``: intra-op threads, 0: torch's
    default); its samples/s and final AUC."""
    if int(args.baseline):
        torch.set_num_threads(int(args.baseline))
    job = PSJobConfig()
    ps, tr, steps = job.ps, job.train, args.steps or job.train.steps
    batch = tr.batch * ps.trainers
    log = ClickLog(list(ps.tables), ps.n_dense, seed=tr.seed)
    held = log.held_out(tr.eval_samples, tr.seed)
    tables = [nn.Embedding(rows, ps.dim, sparse=True) for rows in ps.tables]
    with torch.no_grad():
        for rows, emb in zip(ps.tables, tables, strict=True):
            emb.weight.copy_(init_rows(torch.arange(rows), ps.dim, 0.01, tr.seed + 17))
    torch.manual_seed(tr.seed)
    dense = DenseArch(ps.n_dense, len(ps.tables), ps.dim, ps.hidden)
    sparse_opt = torch.optim.Adagrad([e.weight for e in tables], lr=ps.lr, eps=1e-8)
    dense_opt = torch.optim.Adam(dense.parameters(), lr=ps.dense_lr)

    def forward(x: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
        return dense(x, torch.stack([t(ids[:, i]) for i, t in enumerate(tables)], dim=1))

    @torch.no_grad()
    def evaluate() -> float:
        chunks = range(0, len(held.label), 4096)
        return auc(torch.cat([forward(held.dense[i : i + 4096], held.ids[i : i + 4096]) for i in chunks]), held.label)

    evals: list[float] = []
    t0 = time.perf_counter()
    for step in range(steps):
        b = log.batch(batch, torch.Generator().manual_seed(tr.seed * 100_003 + step))
        loss = F.binary_cross_entropy_with_logits(forward(b.dense, b.ids), b.label)
        sparse_opt.zero_grad(set_to_none=True)
        dense_opt.zero_grad(set_to_none=True)
        loss.backward()
        sparse_opt.step()
        dense_opt.step()
        if (tr.eval_interval and (step + 1) % tr.eval_interval == 0) or step + 1 == steps:
            evals.append(evaluate())
    samples_per_s = steps * batch / (time.perf_counter() - t0)
    return {"samples_per_s": samples_per_s, "auc": evals[-1], "ceiling_auc": log.ceiling(held)}


def run_ps(tmp: Path, name: str, options: str, steps: int) -> dict[str, Any]:
    H.disttrain("ps", *options.split(), *(["--train.steps", str(steps)] if steps else []), root=tmp, name=name)
    s = H.summary(tmp / name)
    return {"auc": s["final"]["auc"]} | {k: s[k] for k in ("samples_per_s", "bytes_per_step", "cache_hit_rate")}


# -- what one RPC costs ---------------------------------------------------------------------------------
def nothing() -> None:
    """The empty call."""


def rpc_worker(i: int, out: str, port: int, calls: int) -> None:
    """Process 0 calls, process 1 ("server0") answers; process 0 writes the per-call seconds to ``out``."""
    from disttrain.ps import server
    from disttrain.ps.sharding import RowSharding
    from disttrain.rpc import transport

    torch.set_num_threads(1)
    warnings.filterwarnings("ignore", message=".*(TorchScript|ProcessGroup).*")
    transport.init("caller" if i == 0 else "server0", i, 2, addr="127.0.0.1", port=port)
    if i == 0:
        ps, tr = PSJobConfig().ps, PSJobConfig().train
        names, shardings = (
            [f"t{k}" for k in range(len(ps.tables))],
            [RowSharding(r, ps.servers, ps.sharding) for r in ps.tables],
        )
        for name, sh in zip(names, shardings, strict=True):
            options = {"optimizer": ps.optimizer, "lr": ps.lr, "seed": tr.seed + 17}
            transport.call("server0", server.create, name, sh.global_ids(0), ps.dim, options)
        b = ClickLog(list(ps.tables), ps.n_dense, seed=tr.seed).batch(tr.batch, torch.Generator().manual_seed(1))
        local = [sh.split(torch.unique(b.ids[:, k]))[0][1] for k, sh in enumerate(shardings)]
        rows, counts = torch.cat(local), [len(r) for r in local]

        calls_of = {"empty": (nothing,), "pull": (server.pull_many, names, rows, counts)}
        result: dict[str, Any] = H.side_by_side(
            {k: H.per_call(functools.partial(transport.call, "server0", *c)) for k, c in calls_of.items()},
            calls,
            warmup=calls // 10,
        )
        result |= {"rows": len(rows), "bytes": len(rows) * (8 + ps.dim * 4)}
        (Path(out) / "0.json").write_text(json.dumps(result))
    transport.shutdown()


def rpc_costs(calls: int) -> dict[str, Any]:
    raw = H.spawn(rpc_worker, 2, free_port(), calls)[0]
    rows = [
        {"RPC": k, "us (median)": H.median(raw[k]) * 1e6, "p90 us": sorted(raw[k])[len(raw[k]) * 9 // 10] * 1e6}
        for k in ("empty", "pull")
    ]
    H.table(
        rows,
        f"one RPC (disttrain.rpc.transport, 2 processes, {calls} calls); pull: {raw['rows']} rows, "
        f"{raw['bytes'] / 1024:.1f} KiB",
    )
    return {"rows": rows, "pull_rows": raw["rows"], "pull_bytes": raw["bytes"]}


# -- side by side ---------------------------------------------------------------------------------------
def run(args: argparse.Namespace) -> dict[str, Any]:
    os.environ.setdefault("TP_SOCKET_IFNAME", "lo")
    baseline = ["--steps", str(args.steps)]
    with tempfile.TemporaryDirectory(prefix="disttrain-ps-baseline-") as tmp:
        count = itertools.count()
        variants: dict[str, Any] = {
            k: lambda o=o: run_ps(Path(tmp), f"ps{next(count)}", o, args.steps) for k, o in VARIANTS.items()
        }
        variants["one process, torch's default threads"] = lambda: H.run_baseline(__file__, "0", *baseline)[0]
        variants["one process, 1 thread"] = lambda: H.run_baseline(__file__, "1", *baseline)[0]
        runs = H.side_by_side(variants, args.rounds)
    return report(runs, args) | {"rpc": rpc_costs(args.rpc_calls), "runs": runs}


def report(runs: dict[str, list[dict[str, Any]]], args: argparse.Namespace) -> dict[str, Any]:
    """The table against the faster one-process loop, and the verdicts on the goals."""
    sps = {k: [x["samples_per_s"] for x in v] for k, v in runs.items()}
    loops = [k for k in runs if k.startswith("one process")]
    strongest = max(loops, key=lambda k: H.median(sps[k]))
    ps = next(iter(runs))
    rows = [
        {"system": k, "samples/s (median)": H.median(sps[k]), "per round": ", ".join(f"{x:,.0f}" for x in sps[k])}
        | {"/ the faster one-process loop (paired)": H.paired_ratio(sps[k], sps[strongest])}
        | {"AUC (median)": f"{H.median([x['auc'] for x in runs[k]]):.4f}"}
        for k in runs
    ]
    cache, default = runs[list(VARIANTS)[3]], runs[ps]
    fewer = 1 - H.median([x["bytes_per_step"] for x in cache]) / H.median([x["bytes_per_step"] for x in default])
    print(
        f"--ps.cache-rows 4096: hit rate {H.median([x['cache_hit_rate'] for x in cache]):.0%}, {fewer:.0%} fewer bytes"
    )
    H.table(rows, f"default job against one process (batch 512, same samples); {args.rounds} rounds, medians")
    print(f"ceiling AUC on the held-out samples: {runs[strongest][0]['ceiling_auc']:.4f}")
    gap = H.median([x["auc"] for x in runs[strongest]]) - H.median([x["auc"] for x in runs[ps]])
    goals = [GOALS["speed"].check(H.paired_ratio(sps[ps], sps[strongest])), GOALS["auc"].check(abs(gap))]
    return {"rows": rows, "goals": goals, "strongest": strongest}


if __name__ == "__main__":
    H.main(__file__, __doc__, OPTIONS, QUICK, run, baseline=one_process)
