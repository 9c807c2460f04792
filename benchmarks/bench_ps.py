"""``disttrain ps`` against a plain one-process loop, PyTorch's RPC parameter-server tutorial and its own plan
(``--parts``, default all three). Every ``disttrain ps`` run is the real command, its figures from its run folder;
every system trains the default job's model, batch and optimizers (``PSJobConfig``) on the same samples (step s's
global batch drawn from the generator seeded ``seed * 100_003 + s``), AUC on ``ClickLog.held_out``.

* ``baseline``: the default job and three variants of it against :func:`one_process`, the loop a user would write
  (its own process): a sparse ``nn.Embedding`` per table with row-sparse Adagrad (the servers' optimizer and rate),
  ``DenseArch`` with Adam, the job's global batch and evaluations; at torch's default threads and at one thread (as
  each PS process runs), the verdict against the faster. Goals: PS >= 0.5x, AUC within 0.003. Then one RPC's cost:
  an empty call, and ``pull_many`` of server 0's share of one trainer's batch.
* ``tutorial``: against https://pytorch.org/tutorials/intermediate/rpc_param_server_tutorial.html: ONE server
  process holds the whole model (dense ``nn.Embedding`` tables, ``DenseArch``); each trainer runs the forward on it
  through an RRef inside ``dist_autograd.context()``, then ``dist_autograd.backward`` and its own
  ``DistributedOptimizer.step``, unsynchronised (Hogwild). The tutorial as written fails with two trainers
  (pytorch/tutorials#2095): a gate on the server (:meth:`TutorialServer.enter`) keeps passes and optimizer steps
  apart. Its samples/s count the steps after 3 warm-up steps, disttrain's every step. Goal: disttrain >= 3x.
* ``plan``: ``disttrain ps --plan``'s predicted samples/s against the job's measured (the median per-step samples/s
  after 10 steps), within +-30% (``jobs.ps_plan.ERROR``): one host (3 variants interleaved); two network-namespace
  hosts (each in its own PID namespace, so that TensorPipe sends tensors over the link) at each ``--rates`` rate,
  after ``disttrain doctor`` across both (root only; skipped with the reason otherwise).
"""

from __future__ import annotations

import argparse
import functools
import itertools
import json
import os
import subprocess
import threading
import time
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any
from unittest import mock

import torch
import torch.nn.functional as F
from torch import nn

from benchmarks import harness as H
from disttrain.jobs.ps_plan import ERROR
from disttrain.ps.clicks import Batch, ClickLog, auc
from disttrain.ps.config import PSJobConfig
from disttrain.ps.model import DenseArch
from disttrain.ps.table import init_rows
from disttrain.testing.launch import DISTTRAIN
from disttrain.testing.netns import Host, two_hosts, why_not
from disttrain.testing.ports import free_port

GOALS = {
    "speed": H.Goal("samples/s, PS / one process", 0.5),
    "auc": H.Goal("|AUC gap|", 0.003, False),
    "tutorial": H.Goal("samples/s, disttrain ps / the tutorial pattern", 3.0),
}
STEPS = {"baseline": PSJobConfig().train.steps, "tutorial": 60, "plan": 200}
OPTIONS = {
    "parts": ("baseline,tutorial,plan", "which parts, comma-separated"),
    "rounds": (3, "baseline and plan: rounds of every variant"),
    "steps": (0, "steps of every job (0: each part's own: the default job's, tutorial 60, plan 200)"),
    "rpc_calls": (2000, "baseline: RPC calls timed per figure"),
    "tables": ([100_000, 50_000, 10_000, 1_000, 500, 100], "tutorial: rows of each table"),
    "rates": (["20mbit", "100mbit"], "plan: rates of the two hosts' link"),
}
QUICK = {"rounds": 1, "steps": 20, "rpc_calls": 50, "tables": [10_000, 1_000, 100], "rates": ["100mbit"]}
BASELINE = {  # label: the command's options
    "disttrain ps (default job: 2 processes, each a trainer and a server, overlapped steps)": "",
    "disttrain ps --ps.overlap off (every read after every update: one process exactly)": "--ps.overlap off",
    "disttrain ps --ps.colocate off (servers of their own: 4 processes)": "--ps.colocate off",
    "disttrain ps --ps.cache-rows 4096": "--ps.cache-rows 4096",
}
PLAN = {"default": "", "servers apart": "--ps.colocate off", "plain steps": "--ps.overlap off"}
PORT, WARMUP, SERVER = 29_481, 3, "parameter_server"  # plan: the two hosts' rendezvous; tutorial


# -- what the parts share -------------------------------------------------------------------------------
def steps_of(args: argparse.Namespace, part: str) -> int:
    return int(args.steps or STEPS[part])


def ps_job(root: Path, name: str, *options: str) -> dict[str, Any]:
    """One ``disttrain ps`` job as a user runs it: its summary.json."""
    H.disttrain("ps", *options, root=root, name=name)
    return H.summary(root / name)


def step_batch(log: ClickLog, job: PSJobConfig, step: int) -> Batch:
    """Step ``step``'s global batch, drawn as the PS trainers draw it."""
    gen = torch.Generator().manual_seed(job.train.seed * 100_003 + step)
    return log.batch(job.train.batch * job.ps.trainers, gen)


def tables_of(job: PSJobConfig, sparse: bool) -> list[nn.Embedding]:
    """One ``nn.Embedding`` per table, its rows initialised as the servers initialise theirs."""
    tables = [nn.Embedding(rows, job.ps.dim, sparse=sparse) for rows in job.ps.tables]
    with torch.no_grad():
        for rows, emb in zip(job.ps.tables, tables, strict=True):
            emb.weight.copy_(init_rows(torch.arange(rows), job.ps.dim, 0.01, job.train.seed + 17))
    return tables


def dense_of(job: PSJobConfig) -> DenseArch:
    torch.manual_seed(job.train.seed)
    return DenseArch(job.ps.n_dense, len(job.ps.tables), job.ps.dim, job.ps.hidden)


def held_out_auc(predict: Callable[[torch.Tensor, torch.Tensor], torch.Tensor], log: ClickLog, b: Batch) -> Any:
    """The AUC of ``predict`` on the held-out samples ``b`` (in chunks), and the hidden model's own (the ceiling)."""
    chunks = [slice(i, i + 4096) for i in range(0, len(b.label), 4096)]
    with torch.no_grad():
        logits = torch.cat([predict(b.dense[c], b.ids[c]) for c in chunks])
    return {"auc": auc(logits, b.label), "ceiling_auc": log.ceiling(b)}


# -- baseline: the plain single-process loop --------------------------------------------------------------
def one_process(args: argparse.Namespace) -> dict[str, Any]:
    """The whole default PS job's training in one plain loop (``--baseline THREADS``: intra-op threads, 0: torch's
    default); its samples/s and final AUC."""
    if int(args.baseline):
        torch.set_num_threads(int(args.baseline))
    job, steps = PSJobConfig(), steps_of(args, "baseline")
    log = ClickLog(list(job.ps.tables), job.ps.n_dense, seed=job.train.seed)
    held, tables, dense = log.held_out(job.train.eval_samples, job.train.seed), tables_of(job, True), dense_of(job)
    sparse_opt = torch.optim.Adagrad([e.weight for e in tables], lr=job.ps.lr, eps=1e-8)
    dense_opt = torch.optim.Adam(dense.parameters(), lr=job.ps.dense_lr)

    def forward(x: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
        return dense(x, torch.stack([t(ids[:, i]) for i, t in enumerate(tables)], dim=1))

    evals: list[dict[str, Any]] = []
    t0, every = time.perf_counter(), job.train.eval_interval
    for step in range(steps):
        b = step_batch(log, job, step)
        loss = F.binary_cross_entropy_with_logits(forward(b.dense, b.ids), b.label)
        sparse_opt.zero_grad(set_to_none=True)
        dense_opt.zero_grad(set_to_none=True)
        loss.backward()
        sparse_opt.step()
        dense_opt.step()
        if (every and (step + 1) % every == 0) or step + 1 == steps:
            evals.append(held_out_auc(forward, log, held))
    samples_per_s = steps * job.train.batch * job.ps.trainers / (time.perf_counter() - t0)
    return {"samples_per_s": samples_per_s, **evals[-1]}


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
        names = [f"t{k}" for k in range(len(ps.tables))]
        shardings = [RowSharding(r, ps.servers, ps.sharding) for r in ps.tables]
        for name, sh in zip(names, shardings, strict=True):
            options = {"optimizer": ps.optimizer, "lr": ps.lr, "seed": tr.seed + 17}
            transport.call("server0", server.create, name, sh.global_ids(0), ps.dim, options)
        b = ClickLog(list(ps.tables), ps.n_dense, seed=tr.seed).batch(tr.batch, torch.Generator().manual_seed(1))
        local = [sh.split(torch.unique(b.ids[:, k]))[0][1] for k, sh in enumerate(shardings)]
        rows, counts = torch.cat(local), [len(r) for r in local]
        calls_of = {"empty": (nothing,), "pull": (server.pull_many, names, rows, counts)}
        timed = {k: H.per_call(functools.partial(transport.call, "server0", *c)) for k, c in calls_of.items()}
        result: dict[str, Any] = H.side_by_side(timed, calls, warmup=calls // 10)
        result |= {"rows": len(rows), "bytes": len(rows) * (8 + ps.dim * 4)}
        (Path(out) / "0.json").write_text(json.dumps(result))
    transport.shutdown()


def rpc_costs(calls: int) -> dict[str, Any]:
    raw = H.spawn(rpc_worker, 2, free_port(), calls)[0]
    rows = [
        {"RPC": k, "us (median)": H.median(raw[k]) * 1e6, "p90 us": sorted(raw[k])[len(raw[k]) * 9 // 10] * 1e6}
        for k in ("empty", "pull")
    ]
    title = f"one RPC (disttrain.rpc.transport, 2 processes, {calls} calls); pull: {raw['rows']} rows"
    H.table(rows, f"{title}, {raw['bytes'] / 1024:.1f} KiB")
    return {"rows": rows, "pull_rows": raw["rows"], "pull_bytes": raw["bytes"]}


@H.in_tmp
def run_baseline(args: argparse.Namespace, tmp: Path) -> dict[str, Any]:
    steps, count = ["--steps", str(steps_of(args, "baseline"))], itertools.count()

    def ps(options: str) -> dict[str, Any]:
        s = ps_job(tmp, f"ps{next(count)}", *options.split(), "--train.steps", steps[1])
        return {"auc": s["final"]["auc"]} | {k: s[k] for k in ("samples_per_s", "bytes_per_step", "cache_hit_rate")}

    variants: dict[str, Any] = {k: functools.partial(ps, o) for k, o in BASELINE.items()}
    variants["one process, torch's default threads"] = lambda: H.run_baseline(__file__, "0", *steps)[0]
    variants["one process, 1 thread"] = lambda: H.run_baseline(__file__, "1", *steps)[0]
    # this part's processes only: the two hosts of ``plan`` must not inherit TP_SOCKET_IFNAME=lo
    with mock.patch.dict(os.environ, TP_SOCKET_IFNAME=os.environ.get("TP_SOCKET_IFNAME", "lo")):
        runs = H.side_by_side(variants, args.rounds)
        return baseline_report(runs, args) | {"rpc": rpc_costs(args.rpc_calls), "runs": runs}


def baseline_report(runs: dict[str, list[dict[str, Any]]], args: argparse.Namespace) -> dict[str, Any]:
    """The table against the faster one-process loop, and the verdicts on the goals."""
    sps = {k: [x["samples_per_s"] for x in v] for k, v in runs.items()}
    strongest = max((k for k in runs if k.startswith("one process")), key=lambda k: H.median(sps[k]))
    ps = next(iter(runs))
    rows = [
        {"system": k, "samples/s (median)": H.median(sps[k]), "per round": ", ".join(f"{x:,.0f}" for x in sps[k])}
        | {"/ the faster one-process loop (paired)": H.paired_ratio(sps[k], sps[strongest])}
        | {"AUC (median)": f"{H.median([x['auc'] for x in runs[k]]):.4f}"}
        for k in runs
    ]
    cache, default = runs[list(BASELINE)[3]], runs[ps]
    fewer = 1 - H.median([x["bytes_per_step"] for x in cache]) / H.median([x["bytes_per_step"] for x in default])
    hits = H.median([x["cache_hit_rate"] for x in cache])
    print(f"--ps.cache-rows 4096: hit rate {hits:.0%}, {fewer:.0%} fewer bytes")
    H.table(rows, f"default job against one process (batch 512, same samples); {args.rounds} rounds, medians")
    print(f"ceiling AUC on the held-out samples: {runs[strongest][0]['ceiling_auc']:.4f}")
    gap = H.median([x["auc"] for x in runs[strongest]]) - H.median([x["auc"] for x in runs[ps]])
    goals = [GOALS["speed"].check(H.paired_ratio(sps[ps], sps[strongest])), GOALS["auc"].check(abs(gap))]
    return {"rows": rows, "goals": goals, "strongest": strongest}


# -- tutorial: the server holds the whole model -----------------------------------------------------------
class TutorialServer(nn.Module):
    """The tutorial's ParameterServer: dense embedding tables + the MLP on one process; ``forward`` runs here for
    every trainer's batch."""

    def __init__(self, job: PSJobConfig) -> None:
        super().__init__()
        self.tables, self.dense_arch = nn.ModuleList(tables_of(job, sparse=False)), dense_of(job)
        self._gate, self._phase, self._inside = threading.Condition(), "", 0
        self._all = threading.Barrier(job.ps.trainers)

    def forward(self, dense: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
        embs = torch.stack([t(ids[:, i]) for i, t in enumerate(self.tables)], dim=1)  # (batch, tables, dim)
        return self.dense_arch(dense, embs)

    @torch.no_grad()
    def predict(self, dense: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
        return self.forward(dense, ids)

    def param_rrefs(self, part: str) -> list[Any]:
        import torch.distributed.rpc as rpc

        return [rpc.RRef(p) for p in (self.tables if part == "tables" else self.dense_arch).parameters()]

    def enter(self, phase: str) -> None:
        """Trainers in the same phase ("pass": forward to the end of backward; "step": the optimizer steps) run
        together, the two phases exclude each other (else one trainer's step changes, in place, weights another's
        backward still needs; pytorch/examples#842 runs whole steps one at a time instead, slower)."""
        with self._gate:
            self._gate.wait_for(lambda: self._inside == 0 or self._phase == phase)
            self._phase, self._inside = phase, self._inside + 1

    def leave(self) -> None:
        with self._gate:
            self._inside -= 1
            self._gate.notify_all()

    def switch(self, phase: str) -> None:
        self.leave()
        self.enter(phase)

    def wait_for_all(self) -> None:
        """Every trainer waits here for the others: at the end of the warm-up, and before trainer 0 evaluates."""
        self._all.wait()


_SERVER: TutorialServer | None = None
_SERVER_LOCK = threading.Lock()


def get_server(job: PSJobConfig) -> TutorialServer:
    """Runs on the server (``rpc.remote``): the one model every trainer shares, made by the first caller."""
    global _SERVER
    with _SERVER_LOCK:
        if _SERVER is None:
            _SERVER = TutorialServer(job)
        return _SERVER


def train(rank: int, job: PSJobConfig) -> dict[str, Any]:
    """The tutorial's trainer loop on this trainer's share of every step's batch; its timings (and AUC)."""
    import torch.distributed.autograd as dist_autograd
    import torch.distributed.rpc as rpc
    from torch.distributed.optim import DistributedOptimizer

    log = ClickLog(list(job.ps.tables), job.ps.n_dense, seed=job.train.seed)
    mine = slice(rank * job.train.batch, (rank + 1) * job.train.batch)
    server = rpc.remote(SERVER, get_server, args=(job,))
    opts = [
        DistributedOptimizer(torch.optim.Adagrad, server.rpc_sync().param_rrefs("tables"), lr=job.ps.lr),
        DistributedOptimizer(torch.optim.Adam, server.rpc_sync().param_rrefs("dense"), lr=job.ps.dense_lr),
    ]
    step_s: list[float] = []
    start = time.monotonic()
    for step in range(job.train.steps):
        if step == WARMUP:
            server.rpc_sync().wait_for_all()
            start = time.monotonic()
        t, b = time.monotonic(), step_batch(log, job, step)
        server.rpc_sync().enter("pass")
        with dist_autograd.context() as context_id:
            logits = server.rpc_sync().forward(b.dense[mine], b.ids[mine])
            loss = F.binary_cross_entropy_with_logits(logits, b.label[mine])
            dist_autograd.backward(context_id, [loss])
            server.rpc_sync().switch("step")
            for opt in opts:
                opt.step(context_id)
        server.rpc_sync().leave()
        step_s.append(time.monotonic() - t)
    end = time.monotonic()
    server.rpc_sync().wait_for_all()  # trainer 0 evaluates the model both have trained
    result: dict[str, Any] = {"start": start, "end": end, "step_s": step_s, "loss": float(loss.detach())}
    held = log.held_out(job.train.eval_samples, job.train.seed)
    return result | (held_out_auc(server.rpc_sync().predict, log, held) if rank == 0 else {})


def tutorial_worker(i: int, out: str, job: PSJobConfig, port: int) -> None:
    """Process ``i``: 0 is the server (it only answers calls), 1.. are the trainers."""
    import torch.distributed.rpc as rpc

    os.environ["TP_SOCKET_IFNAME"] = "lo"
    torch.set_num_threads(1)
    warnings.filterwarnings("ignore", message=".*(TorchScript|ProcessGroup).*")  # deprecation notices
    opts = rpc.TensorPipeRpcBackendOptions(init_method=f"tcp://127.0.0.1:{port}", rpc_timeout=600)
    name = SERVER if i == 0 else f"trainer{i - 1}"
    rpc.init_rpc(name, rank=i, world_size=job.ps.trainers + 1, rpc_backend_options=opts)
    if i > 0:
        (Path(out) / f"{i}.json").write_text(json.dumps(train(i - 1, job)))
    rpc.shutdown()  # waits for every worker


@H.in_tmp
def run_tutorial(args: argparse.Namespace, tmp: Path) -> dict[str, Any]:
    job = PSJobConfig()
    job.ps.tables, job.train.steps = tuple(args.tables), steps_of(args, "tutorial")
    if job.train.steps <= WARMUP:
        raise SystemExit(f"--steps must be above the {WARMUP} warm-up steps")
    tables = " ".join(map(str, job.ps.tables))
    with mock.patch.dict(os.environ, TP_SOCKET_IFNAME="lo", OMP_NUM_THREADS="1"):
        per = H.spawn(tutorial_worker, job.ps.trainers + 1, job, free_port())[1:]
        seconds = max(r["end"] for r in per) - min(r["start"] for r in per)
        base = (job.train.steps - WARMUP) * job.train.batch * job.ps.trainers / seconds
        rows = [{"system": "tutorial pattern (1 server)", "samples/s": base, "x tutorial": 1.0, "AUC": per[0]["auc"]}]
        for n in (1, 2):
            options = f"--ps.trainers {job.ps.trainers} --ps.servers {n} --train.steps {job.train.steps}"
            r = ps_job(tmp, f"s{n}", *f"{options} --train.eval-interval 0 --ps.tables {tables}".split())
            rows.append({"system": f"disttrain ps, {n} server(s)", "samples/s": r["samples_per_s"]})
            rows[-1] |= {"x tutorial": r["samples_per_s"] / base, "AUC": r["final"]["auc"]}
    title = f"{job.ps.trainers} trainers, {job.train.steps} steps of {job.train.batch} samples each, tables {tables}"
    H.table(rows, title)
    print(f"ceiling AUC (the hidden model) on the held-out samples: {per[0]['ceiling_auc']:.3f}")
    print(f"tutorial pattern, median step {H.median([t for r in per for t in r['step_s'][WARMUP:]]) * 1e3:.1f} ms")
    return {"rows": rows, "goals": [GOALS["tutorial"].check(r["x tutorial"]) for r in rows[1:]], "tutorial": per}


# -- plan: ps --plan against the job ----------------------------------------------------------------------
def job_args(steps: int, root: Path, name: str) -> list[str]:
    quiet = "--train.eval-interval 0 --train.eval-samples 2000"
    return f"ps --train.steps {steps} {quiet} --run.root {root} --run.name {name}".split()


def predicted(stdout: str) -> float:
    line = next(x for x in stdout.splitlines() if x.startswith("speed"))
    return float(line.split("~")[1].split()[0].replace(",", ""))


def measured(run: Path) -> float:
    return H.median([r["samples_per_s"] for r in H.records(run / "metrics.jsonl") if "samples_per_s" in r][10:])


def plan_row(where: str, job: str, runs: list[tuple[float, float]]) -> dict[str, Any]:
    """Medians of the runs' (predicted, measured) samples/s and of their ratios."""
    row = {"where": where, "job": job, "predicted samples/s": H.median([p for p, _ in runs])}
    return row | {
        "measured samples/s": H.median([m for _, m in runs]),
        "measured / predicted": H.median([m / p for p, m in runs]),
    }


def one_host(args: argparse.Namespace, tmp: Path) -> list[dict[str, Any]]:
    count = itertools.count()

    def plan_and_job(options: str) -> tuple[float, float]:
        job = [*job_args(steps_of(args, "plan"), tmp, name := f"job{next(count)}"), *options.split()]
        plan = H.command([str(DISTTRAIN), *job, "--plan"])
        H.command([str(DISTTRAIN), *job])
        return predicted(plan.stdout), measured(tmp / name)

    got = H.side_by_side({v: functools.partial(plan_and_job, o) for v, o in PLAN.items()}, args.rounds)
    return [plan_row("one host", v, g) for v, g in got.items()]


def wait_all(procs: list[subprocess.Popen[str]], what: str, timeout: float) -> None:
    for p in procs:
        out, err = p.communicate(timeout=timeout)
        if p.returncode != 0:
            raise SystemExit(f"{what} failed ({p.returncode}):\n{out[-2000:]}\n{err[-3000:]}")


def two_hosts_at(rate: str, steps: int, tmp: Path) -> dict[str, Any]:
    with two_hosts(own_pids=True) as (a, b):
        hosts: tuple[Host, Host] = (a, b)
        for h in hosts:
            h.limit(rate)
        nodes = ["--launch.nnodes", "2", "--launch.rdzv-endpoint", f"{a.addr}:{PORT}"]
        cache_env = [{"DISTTRAIN_CACHE_DIR": str(tmp / f"cache-{rate}-{r}")} for r in range(2)]
        doctors = [
            h.disttrain("doctor", *nodes, "--launch.node-rank", str(r), env=cache_env[r]) for r, h in enumerate(hosts)
        ]
        wait_all(doctors, f"doctor at {rate}", 600)
        job = job_args(steps, tmp, f"two-{rate}")
        plan = H.command(
            a.cmd(str(DISTTRAIN), *job, "--plan", "--launch.nnodes", "2"), env={**os.environ, **cache_env[0]}
        )
        jobs = [h.disttrain(*job, *nodes, "--launch.node-rank", str(r)) for r, h in enumerate(hosts)]
        wait_all(jobs, f"job at {rate}", 900)
    print(plan.stdout, flush=True)
    return plan_row(f"two hosts, {rate}", "default", [(predicted(plan.stdout), measured(tmp / f"two-{rate}"))])


@H.in_tmp
def run_plan(args: argparse.Namespace, tmp: Path) -> dict[str, Any]:
    rows = one_host(args, tmp)
    if (reason := why_not()) is None:
        rows += [two_hosts_at(rate, steps_of(args, "plan"), tmp) for rate in args.rates]
    else:
        print(f"two hosts skipped: {reason}", flush=True)
    H.table(rows, f"disttrain ps --plan against the job (the plan states +-{ERROR:.0%})")
    within = sum(abs(r["measured / predicted"] - 1) <= ERROR for r in rows)
    print(f"within +-{ERROR:.0%}: {within} of {len(rows)}", flush=True)
    return {"rows": rows, "goals": [H.Goal(f"rows within +-{ERROR:.0%}", len(rows)).check(within)]}


def run(args: argparse.Namespace) -> dict[str, Any]:
    return H.parts(args, __file__, {"baseline": run_baseline, "tutorial": run_tutorial, "plan": run_plan})


if __name__ == "__main__":
    H.main(__file__, __doc__, OPTIONS, QUICK, run, baseline=one_process)
