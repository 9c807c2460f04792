"""``disttrain ps``'s default job against the plain single-process loop a user would write for the same model.

The baseline (:func:`one_process`, run as ``python -m benchmarks.bench_ps_baseline --one-process OUT``): the
same DLRM-style model in ONE process, written plainly: one ``nn.Embedding(rows, dim, sparse=True)`` per table
(rows initialised as the servers initialise theirs, ``disttrain.ps.table.init_rows`` with seed ``seed + 17``)
with row-sparse ``torch.optim.Adagrad`` (the servers' default optimizer: ``sum_sq += g*g; w -= lr * g /
(sqrt(sum_sq) + eps)``, lr 0.05, eps 1e-8, which torch's Adagrad computes for sparse gradients), and
disttrain's ``DenseArch`` (from ``torch.manual_seed(seed)``, as the trainers build it) with Adam lr 0.003.
Batch = the PS job's global batch (trainers x batch = 2 x 256), drawn exactly as the PS draws each step's
global batch (``ClickLog.batch(512, Generator(seed * 100_003 + step))``): the same samples in the same order.
Evaluations as the PS job's (every ``eval_interval`` steps and at the end, on ``ClickLog.held_out(eval_samples,
seed)``, AUC by ``disttrain.ps.clicks.auc``), inside the timed loop as in ``PSTrainer.fit``, so samples/s count
the same work. Two variants: torch's default threads (what a user gets) and one thread (as each PS process
runs); the verdict is against the faster of the two.

``disttrain ps`` runs as a user runs it: the CLI with the default job (2 trainers x 2 servers, BSP, 400 steps);
its figures from ``summary.json``. The three alternate, ``--rounds`` rounds (the order rotating every round),
medians; the ratios are paired per round.

RPC costs: two processes joined by ``disttrain.rpc.transport`` (TensorPipe, the PS job's transport choice), the
caller times (a) a call of an empty function and (b) ``disttrain.ps.server.pull_many`` of server 0's share of
one trainer's batch (the distinct rows of 256 samples from every table, mod-2 sharding), as the PS trainers do.

    .venv/bin/python -m benchmarks.bench_ps_baseline [--rounds 3] [--rpc-calls 2000]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import warnings
from pathlib import Path
from typing import Any

import torch
import torch.multiprocessing as mp
import torch.nn.functional as F
from torch import nn

from benchmarks import _common as C
from disttrain.ps.clicks import ClickLog, auc
from disttrain.ps.config import PSJobConfig
from disttrain.ps.model import DenseArch
from disttrain.ps.table import init_rows
from disttrain.testing.launch import DISTTRAIN
from disttrain.testing.ports import free_port

SPEED_GOAL = 0.5
AUC_GOAL = 0.003


# -- the plain single-process loop ----------------------------------------------------------------------
def one_process(out: Path, threads: int = 0) -> None:
    """The whole default PS job's training in one plain loop; samples/s and the final AUC to ``out``
    (``threads``: intra-op threads, 0: torch's default)."""
    if threads:
        torch.set_num_threads(threads)
    job = PSJobConfig()
    ps, tr = job.ps, job.train
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
        n = len(held.label)
        logits = torch.cat([forward(held.dense[i : i + 4096], held.ids[i : i + 4096]) for i in range(0, n, 4096)])
        return auc(logits, held.label)

    evals: list[float] = []
    t0 = time.perf_counter()
    for step in range(tr.steps):
        b = log.batch(batch, torch.Generator().manual_seed(tr.seed * 100_003 + step))
        loss = F.binary_cross_entropy_with_logits(forward(b.dense, b.ids), b.label)
        sparse_opt.zero_grad(set_to_none=True)
        dense_opt.zero_grad(set_to_none=True)
        loss.backward()
        sparse_opt.step()
        dense_opt.step()
        if (tr.eval_interval and (step + 1) % tr.eval_interval == 0) or step + 1 == tr.steps:
            evals.append(evaluate())
    elapsed = time.perf_counter() - t0
    result = {
        "samples_per_s": tr.steps * batch / elapsed,
        "auc": evals[-1],
        "ceiling_auc": log.ceiling(held),
        "final_loss": float(loss),
        "threads": torch.get_num_threads(),
    }
    out.write_text(json.dumps(result))


def run_baseline(tmp: Path, r: int, threads: int) -> dict[str, Any]:
    out = tmp / f"baseline{r}-{threads}.json"
    cmd = [sys.executable, "-m", "benchmarks.bench_ps_baseline", "--one-process", str(out), "--threads", str(threads)]
    t = time.monotonic()
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=900, cwd=C.ROOT)
    if proc.returncode != 0:
        raise RuntimeError(f"the one-process loop failed: {proc.stderr[-2000:]}")
    return {**json.loads(out.read_text()), "wall_s": time.monotonic() - t}


def run_ps(tmp: Path, r: int, variant: str = "ps", *args: str) -> dict[str, Any]:
    name = f"{variant}{r}"
    cmd = [str(DISTTRAIN), "ps", "--run.root", str(tmp), "--run.name", name, *args]
    t = time.monotonic()
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
    if proc.returncode != 0:
        raise RuntimeError(f"disttrain ps failed: {proc.stderr[-2000:]}")
    s = json.loads((tmp / name / "summary.json").read_text())
    return {
        "samples_per_s": s["samples_per_s"],
        "auc": s["final"]["auc"],
        "wall_s": time.monotonic() - t,
        "bytes_per_step": s["bytes_per_step"],
        "cache_hit_rate": s["cache_hit_rate"],
    }


# -- what one RPC costs -----------------------------------------------------------------------------------
def nothing() -> None:
    """The empty call."""


def rpc_worker(i: int, port: int, calls: int, out: str) -> None:
    """Process 0 calls, process 1 ("server0") answers; process 0 writes the per-call seconds to ``out``."""
    from disttrain.ps import server
    from disttrain.ps.sharding import RowSharding
    from disttrain.rpc import transport

    torch.set_num_threads(1)
    warnings.filterwarnings("ignore", message=".*(TorchScript|ProcessGroup).*")
    transport.init("caller" if i == 0 else "server0", i, 2, addr="127.0.0.1", port=port)
    if i == 0:
        ps, tr = PSJobConfig().ps, PSJobConfig().train
        names = [f"t{k}" for k in range(len(ps.tables))]
        shardings = [RowSharding(rows, ps.servers, ps.sharding) for rows in ps.tables]
        for name, sh in zip(names, shardings, strict=True):
            options = {"optimizer": ps.optimizer, "lr": ps.lr, "seed": tr.seed + 17}
            transport.call("server0", server.create, name, sh.global_ids(0), ps.dim, options)
        b = ClickLog(list(ps.tables), ps.n_dense, seed=tr.seed).batch(tr.batch, torch.Generator().manual_seed(1))
        local = [sh.split(torch.unique(b.ids[:, k]))[0][1] for k, sh in enumerate(shardings)]
        rows, counts = torch.cat(local), [len(r) for r in local]

        def timed(fn: Any, *args: Any) -> list[float]:
            for _ in range(calls // 10):  # warm-up
                transport.call("server0", fn, *args)
            out_s = []
            for _ in range(calls):
                t = time.perf_counter()
                transport.call("server0", fn, *args)
                out_s.append(time.perf_counter() - t)
            return out_s

        result = {
            "empty": timed(nothing),
            "pull": timed(server.pull_many, names, rows, counts),
            "pull_rows": len(rows),
            "pull_bytes": len(rows) * 8 + len(rows) * ps.dim * 4,
        }
        Path(out).write_text(json.dumps(result))
    transport.shutdown()


def rpc_costs(calls: int) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="disttrain-rpc-cost-") as tmp:
        out = str(Path(tmp) / "rpc.json")
        mp.start_processes(rpc_worker, args=(free_port(), calls, out), nprocs=2, start_method="spawn")
        raw = json.loads(Path(out).read_text())
    return {
        "empty_us": statistics.median(raw["empty"]) * 1e6,
        "empty_p90_us": statistics.quantiles(raw["empty"], n=10)[-1] * 1e6,
        "pull_us": statistics.median(raw["pull"]) * 1e6,
        "pull_p90_us": statistics.quantiles(raw["pull"], n=10)[-1] * 1e6,
        "pull_rows": raw["pull_rows"],
        "pull_bytes": raw["pull_bytes"],
        "calls": calls,
    }


# -- side by side -----------------------------------------------------------------------------------------
def main(argv: list[str]) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--rpc-calls", type=int, default=2000)
    p.add_argument("--one-process", type=Path, help=argparse.SUPPRESS)
    p.add_argument("--threads", type=int, default=0, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.one_process is not None:
        one_process(args.one_process, args.threads)
        return
    C.print_machine()
    os.environ.setdefault("TP_SOCKET_IFNAME", "lo")
    t0 = time.monotonic()
    runs = run_rounds(args.rounds)
    rpc = rpc_costs(args.rpc_calls)
    report(runs, rpc, args.rounds, time.monotonic() - t0)


def run_rounds(rounds: int) -> dict[str, list[dict[str, Any]]]:
    """Each variant in its own process, ``rounds`` times, the order rotating every round."""
    # "one": torch's default threads (what a user gets); "one-1t": one thread, as each PS process has
    variants = {
        "ps": lambda tmp, r: run_ps(tmp, r),
        "ps-exact": lambda tmp, r: run_ps(tmp, r, "ps-exact", "--ps.overlap", "off"),
        "ps-separate": lambda tmp, r: run_ps(tmp, r, "ps-separate", "--ps.colocate", "off"),
        "ps-cache": lambda tmp, r: run_ps(tmp, r, "ps-cache", "--ps.cache-rows", "4096"),
        "one": lambda tmp, r: run_baseline(tmp, r, 0),
        "one-1t": lambda tmp, r: run_baseline(tmp, r, 1),
    }
    names = list(variants)
    runs: dict[str, list[dict[str, Any]]] = {k: [] for k in names}
    with tempfile.TemporaryDirectory(prefix="disttrain-ps-baseline-") as tmp:
        for r in range(rounds):
            k0 = r % len(names)
            for k in names[k0:] + names[:k0]:  # the order rotates every round
                runs[k].append(variants[k](Path(tmp), r))
                print(f"round {r + 1} {k}: {runs[k][-1]}", flush=True)
    return runs


def report(runs: dict[str, list[dict[str, Any]]], rpc: dict[str, Any], rounds: int, elapsed: float) -> None:
    """The tables, the verdicts against the issue's goals, and the results file."""
    names = list(runs)
    med = {k: {m: C.median([x[m] for x in v]) for m in ("samples_per_s", "auc")} for k, v in runs.items()}
    ps_sps = [x["samples_per_s"] for x in runs["ps"]]
    ratios = {k: C.paired_ratio(ps_sps, [x["samples_per_s"] for x in runs[k]]) for k in ("one", "one-1t")}
    strongest = max(("one", "one-1t"), key=lambda k: med[k]["samples_per_s"])
    best = [x["samples_per_s"] for x in runs[strongest]]
    for k in ("ps-exact", "ps-separate", "ps-cache"):  # against the same (faster) loop
        ratios[k] = C.paired_ratio([x["samples_per_s"] for x in runs[k]], best)
    ratio, gap = ratios[strongest], med[strongest]["auc"] - med["ps"]["auc"]
    job = PSJobConfig()
    title = (
        f"default job: {job.ps.trainers} trainers x {job.ps.servers} servers, {job.train.steps} steps of "
        f"{job.ps.trainers} x {job.train.batch}; one process: batch {job.ps.trainers * job.train.batch}, same samples; "
        f"{rounds} rounds, medians"
    )
    cache = C.median([x["cache_hit_rate"] for x in runs["ps-cache"]])
    fewer = 1 - C.median([x["bytes_per_step"] for x in runs["ps-cache"]]) / C.median(
        [x["bytes_per_step"] for x in runs["ps"]]
    )
    labels = {
        "ps": "disttrain ps (default job: 2 processes, each a trainer and a server, overlapped steps)",
        "ps-exact": "disttrain ps --ps.overlap off (every read after every update: one process exactly)",
        "ps-separate": "disttrain ps --ps.colocate off (servers of their own: 4 processes)",
        "ps-cache": f"disttrain ps --ps.cache-rows 4096 (hit rate {cache:.0%}, {fewer:.0%} fewer bytes / step)",
        "one": f"one process ({runs['one'][0]['threads']} threads, torch default)",
        "one-1t": "one process (1 thread)",
    }
    C.table(
        ["system", "samples/s (median)", "per round", "/ the faster one-process loop (paired)", "AUC (median)"],
        [
            [
                labels[k],
                med[k]["samples_per_s"],
                ", ".join(f"{x['samples_per_s']:,.0f}" for x in runs[k]),
                ratios[k] if k.startswith("ps-") else ratio if k == "ps" else f"(PS / this: {ratios[k]:.2f})",
                f"{med[k]['auc']:.4f}",
            ]
            for k in names
        ],
        title=title,
    )
    C.table(
        ["figure (against the faster one-process loop)", "value", "goal", "verdict"],
        [
            ["samples/s, PS / one process (paired median)", ratio, f">= {SPEED_GOAL}", C.verdict(ratio, SPEED_GOAL)],
            ["AUC, one process - PS", f"{gap:+.5f}", f"|.| <= {AUC_GOAL}", C.verdict(abs(gap), AUC_GOAL, False)],
        ],
    )
    print(f"ceiling AUC on the held-out samples: {runs['one'][0]['ceiling_auc']:.4f}")
    print(
        f"one RPC here (disttrain.rpc.transport, 2 processes, median of {rpc['calls']}): empty call "
        f"{rpc['empty_us']:.0f} us (p90 {rpc['empty_p90_us']:.0f}); pull of {rpc['pull_rows']} rows "
        f"({rpc['pull_bytes'] / 1024:.1f} KiB) {rpc['pull_us']:.0f} us (p90 {rpc['pull_p90_us']:.0f})"
    )
    print(f"wall time: {elapsed:.0f} s")
    C.write_results(
        "bench_ps_baseline",
        {
            "runs": runs,
            "medians": med,
            "ratios": ratios,
            "strongest": strongest,
            "ratio": ratio,
            "auc_gap": gap,
            "rpc": rpc,
            "wall_s": elapsed,
        },
    )


if __name__ == "__main__":
    main(sys.argv[1:])
