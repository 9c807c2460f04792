"""``disttrain ps`` against the pattern of PyTorch's RPC parameter-server tutorial, same model, data and threads.

The baseline follows https://pytorch.org/tutorials/intermediate/rpc_param_server_tutorial.html (and the
embedding-on-a-server half of "Combining Distributed DataParallel with Distributed RPC Framework"): ONE
server process holds the whole model in an ``nn.Module``: every embedding table as a plain dense
``nn.Embedding`` (``sparse=False``, rows drawn with std 0.01 as disttrain's are) and disttrain's own
``DenseArch`` (initialised from ``torch.manual_seed(seed)``, as disttrain's trainers do). Each trainer gets an
RRef to it through ``rpc.remote`` (the tutorial's lock-guarded singleton), and per step, inside
``dist_autograd.context()``: the forward on the server through ``rref.rpc_sync().forward(dense, ids)``, the
loss here, ``dist_autograd.backward(context_id, [loss])`` (the embedding gradients are dense: every row, every
step), then ``DistributedOptimizer.step(context_id)``. ``DistributedOptimizer`` takes no parameter groups, so
there are two: Adagrad lr 0.05 over the tables and Adam lr 0.003 over the MLP (disttrain's optimizers and
rates). As in the tutorial, each trainer builds its own optimizers (its own optimizer state on the server) and
applies its own gradient of the mean loss over its 256 samples, unsynchronised with the other trainer.
The one addition: the tutorial as written fails with two trainers (one's optimizer step changes weights in
place that the other's backward still needs, pytorch/tutorials#2095), so a gate on the server lets the
trainers' forward+backward passes run together and their optimizer steps run together (Hogwild, as in the
tutorial), never one trainer's step inside another's pass: three small calls per step (``TutorialServer.enter``).

Both systems see the same samples: the global batch of ``batch x trainers`` per step comes from the generator
seeded ``seed * 100_003 + step`` and is split by trainer rank (``PSTrainer.my_batch``). One intra-op thread
per process (server and trainers alike).

Throughput: the baseline's samples/s count the steps after 3 warm-up steps (a barrier on the server starts
the timed part) over the wall time from then to the last trainer's last step. disttrain's figure is its
``summary.json`` ``samples_per_s``, which counts every step (warm-up and its final evaluation included), so
the ratio, if anything, understates disttrain. AUC: after training, trainer 0 scores ``ClickLog.held_out
(20000, seed)`` with the server's model (disttrain: its final evaluation on the same samples).

Rows: the tutorial pattern (1 server), ``disttrain ps --ps.trainers 2 --ps.servers 1`` (like for like: the tutorial
has one server) and ``--ps.servers 2``. Goal: disttrain >= 3x the tutorial's samples/s at 2 trainers.

    .venv/bin/python -m benchmarks.bench_ps_tutorial [--steps 60] [--tables 100000 50000 10000 1000 500 100]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import warnings
from pathlib import Path
from typing import Any

import torch
import torch.distributed.autograd as dist_autograd
import torch.distributed.rpc as rpc
import torch.multiprocessing as mp
import torch.nn.functional as F
from torch import nn
from torch.distributed.optim import DistributedOptimizer

from benchmarks import _common as C
from disttrain.ps.clicks import Batch, ClickLog, auc
from disttrain.ps.model import DenseArch
from disttrain.testing.launch import DISTTRAIN
from disttrain.testing.ports import free_port

GOAL = 3.0
WARMUP = 3
SERVER = "parameter_server"
EVAL_CHUNK = 4096


@dataclasses.dataclass
class Setup:
    tables: tuple[int, ...] = (100_000, 50_000, 10_000, 1_000, 500, 100)
    dim: int = 16
    n_dense: int = 13
    hidden: int = 64
    batch: int = 256
    trainers: int = 2
    steps: int = 60
    seed: int = 0
    lr: float = 0.05
    dense_lr: float = 0.003
    eval_samples: int = 20_000


# -- the server: the tutorial's ParameterServer, holding the whole model --------------------------------
class TutorialServer(nn.Module):
    """Dense embedding tables + the MLP on one process; ``forward`` runs here for every trainer's batch."""

    def __init__(self, s: Setup) -> None:
        super().__init__()
        torch.manual_seed(s.seed)
        self.dense_arch = DenseArch(s.n_dense, len(s.tables), s.dim, s.hidden)
        self.tables = nn.ModuleList(nn.Embedding(rows, s.dim, sparse=False) for rows in s.tables)
        for t in self.tables:
            nn.init.normal_(t.weight, std=0.01)
        self._lock = threading.Lock()
        self._arrived: dict[str, int] = {}
        self._gate = threading.Condition()
        self._phase, self._inside = "", 0

    def forward(self, dense: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
        embs = torch.stack([t(ids[:, i]) for i, t in enumerate(self.tables)], dim=1)  # (batch, tables, dim)
        return self.dense_arch(dense, embs)

    @torch.no_grad()
    def predict(self, dense: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
        return self.forward(dense, ids)

    def param_rrefs(self, part: str) -> list[rpc.RRef]:
        module = self.tables if part == "tables" else self.dense_arch
        return [rpc.RRef(p) for p in module.parameters()]

    def enter(self, phase: str) -> None:
        """Trainers in the same phase ("pass": forward to the end of backward; "step": the optimizer steps) run
        together, the two phases exclude each other. Without this (the tutorial as written) one trainer's step
        changes, in place, weights another's backward still needs, and that backward fails with more than one
        trainer (pytorch/tutorials#2095); pytorch/examples#842 runs whole steps one at a time instead, slower."""
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

    def arrive(self, name: str) -> int:
        with self._lock:
            self._arrived[name] = self._arrived.get(name, 0) + 1
            return self._arrived[name]

    def arrived(self, name: str) -> int:
        with self._lock:
            return self._arrived.get(name, 0)


_SERVER: TutorialServer | None = None
_SERVER_LOCK = threading.Lock()


def get_server(s: Setup) -> TutorialServer:
    """Runs on the server (``rpc.remote``): the one model every trainer shares, made by the first caller."""
    global _SERVER
    with _SERVER_LOCK:
        if _SERVER is None:
            _SERVER = TutorialServer(s)
        return _SERVER


# -- the trainers ---------------------------------------------------------------------------------------
def my_batch(log: ClickLog, s: Setup, rank: int, step: int) -> Batch:
    """``PSTrainer.my_batch``: this trainer's slice of the step's global batch."""
    b = log.batch(s.batch * s.trainers, torch.Generator().manual_seed(s.seed * 100_003 + step))
    part = slice(rank * s.batch, (rank + 1) * s.batch)
    return Batch(b.dense[part], b.ids[part], b.label[part])


def barrier(server: rpc.RRef, name: str, n: int) -> None:
    server.rpc_sync().arrive(name)
    while server.rpc_sync().arrived(name) < n:
        time.sleep(0.005)


def evaluate(server: rpc.RRef, log: ClickLog, s: Setup) -> dict[str, float]:
    b = log.held_out(s.eval_samples, s.seed)
    logits = torch.cat(
        [
            server.rpc_sync().predict(b.dense[i : i + EVAL_CHUNK], b.ids[i : i + EVAL_CHUNK])
            for i in range(0, len(b.label), EVAL_CHUNK)
        ]
    )
    return {"auc": auc(logits, b.label), "ceiling_auc": log.ceiling(b)}


def train(rank: int, s: Setup, out: str) -> None:
    """The tutorial's trainer loop on this trainer's share of every step's batch; its timings to ``out``."""
    log = ClickLog(list(s.tables), s.n_dense, seed=s.seed)
    server = rpc.remote(SERVER, get_server, args=(s,))
    opts = [
        DistributedOptimizer(torch.optim.Adagrad, server.rpc_sync().param_rrefs("tables"), lr=s.lr),
        DistributedOptimizer(torch.optim.Adam, server.rpc_sync().param_rrefs("dense"), lr=s.dense_lr),
    ]
    step_s: list[float] = []
    first = start = time.monotonic()
    for step in range(s.steps):
        if step == WARMUP:
            barrier(server, "warm", s.trainers)
            start = time.monotonic()
        t = time.monotonic()
        b = my_batch(log, s, rank, step)
        server.rpc_sync().enter("pass")
        with dist_autograd.context() as context_id:
            logits = server.rpc_sync().forward(b.dense, b.ids)
            loss = F.binary_cross_entropy_with_logits(logits, b.label)
            dist_autograd.backward(context_id, [loss])
            server.rpc_sync().switch("step")
            for opt in opts:
                opt.step(context_id)
        server.rpc_sync().leave()
        step_s.append(time.monotonic() - t)
    end = time.monotonic()
    barrier(server, "done", s.trainers)  # trainer 0 evaluates the model both have trained
    result: dict[str, Any] = {"first": first, "start": start, "end": end, "step_s": step_s}
    result["loss"] = float(loss.detach())
    if rank == 0:
        result.update(evaluate(server, log, s))
    (Path(out) / f"trainer{rank}.json").write_text(json.dumps(result))


def worker(i: int, s: Setup, port: int, out: str) -> None:
    """Process ``i``: 0 is the server (it only answers calls), 1.. are the trainers."""
    os.environ["TP_SOCKET_IFNAME"] = "lo"
    torch.set_num_threads(1)
    warnings.filterwarnings("ignore", message=".*(TorchScript|ProcessGroup).*")  # deprecation notices
    opts = rpc.TensorPipeRpcBackendOptions(init_method=f"tcp://127.0.0.1:{port}", rpc_timeout=600)
    name = SERVER if i == 0 else f"trainer{i - 1}"
    rpc.init_rpc(name, rank=i, world_size=s.trainers + 1, rpc_backend_options=opts)
    if i > 0:
        train(i - 1, s, out)
    rpc.shutdown()  # waits for every worker


def run_tutorial(s: Setup, timeout: float = 900.0) -> dict[str, Any]:
    """One server + ``s.trainers`` trainers (spawned processes); samples/s after warm-up, AUC, step times."""
    os.environ.update(TP_SOCKET_IFNAME="lo", OMP_NUM_THREADS="1")
    with tempfile.TemporaryDirectory(prefix="disttrain-ps-tutorial-") as tmp:
        ctx = mp.start_processes(
            worker, args=(s, free_port(), tmp), nprocs=s.trainers + 1, join=False, start_method="spawn"
        )
        deadline = time.monotonic() + timeout
        while not ctx.join(timeout=5):
            if time.monotonic() > deadline:
                for p in ctx.processes:
                    p.kill()
                raise RuntimeError(f"the tutorial-pattern job did not finish in {timeout:.0f} s")
        per = [json.loads((Path(tmp) / f"trainer{r}.json").read_text()) for r in range(s.trainers)]
    end = max(r["end"] for r in per)
    timed = (s.steps - WARMUP) * s.batch * s.trainers
    all_steps = s.steps * s.batch * s.trainers / (end - min(r["first"] for r in per))
    steps = [t for r in per for t in r["step_s"][WARMUP:]]
    return {
        "samples_per_s": timed / (end - min(r["start"] for r in per)),
        "samples_per_s_all_steps": all_steps,
        "median_step_s": statistics.median(steps),
        "auc": per[0]["auc"],
        "ceiling_auc": per[0]["ceiling_auc"],
        "per_trainer": per,
    }


# -- disttrain ps, the real command ---------------------------------------------------------------------
def run_disttrain(s: Setup, servers: int, tmp: Path) -> dict[str, Any]:
    name = f"s{servers}"
    args = [
        "--ps.trainers",
        str(s.trainers),
        "--ps.servers",
        str(servers),
        "--train.steps",
        str(s.steps),
        "--train.eval-interval",
        "0",
        "--train.eval-samples",
        str(s.eval_samples),
        "--ps.tables",
        *map(str, s.tables),
        "--ps.dim",
        str(s.dim),
        "--ps.n-dense",
        str(s.n_dense),
        "--ps.hidden",
        str(s.hidden),
        "--train.batch",
        str(s.batch),
        "--ps.lr",
        str(s.lr),
        "--ps.dense-lr",
        str(s.dense_lr),
        "--train.seed",
        str(s.seed),
    ]
    cmd = [str(DISTTRAIN), "ps", *args, "--run.root", str(tmp), "--run.name", name]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=900, env=env)
    if proc.returncode != 0:
        raise RuntimeError(f"disttrain ps --ps.servers {servers} failed: {proc.stderr[-2000:]}")
    return json.loads((tmp / name / "summary.json").read_text())


def main(argv: list[str]) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--steps", type=int, default=60)
    p.add_argument("--tables", type=int, nargs="+", default=list(Setup.tables), help="rows of each table")
    args = p.parse_args(argv)
    if args.steps <= WARMUP:
        raise SystemExit(f"--steps must be above the {WARMUP} warm-up steps")
    s = Setup(steps=args.steps, tables=tuple(args.tables))
    C.print_machine()
    t0 = time.monotonic()
    tutorial = run_tutorial(s)
    with tempfile.TemporaryDirectory(prefix="disttrain-ps-") as tmp:
        ours = {n: run_disttrain(s, n, Path(tmp)) for n in (1, 2)}
    base = tutorial["samples_per_s"]
    rows: list[list[Any]] = [["tutorial pattern (1 server)", base, 1.0, tutorial["auc"], "", ""]]
    for n, r in ours.items():
        ratio = r["samples_per_s"] / base
        label = f"disttrain ps, {n} server{'s' if n > 1 else ''}"
        rows.append([label, r["samples_per_s"], ratio, r["final"]["auc"], f">= {GOAL:g}x", C.verdict(ratio, GOAL)])
    title = (
        f"{s.trainers} trainers, {s.steps} steps of {s.batch} samples each (the same samples), tables "
        f"{', '.join(map(str, s.tables))} x {s.dim}, one thread per process"
    )
    C.table(["system", "samples/s", "x tutorial", "AUC", "goal", "verdict"], rows, title=title)
    print(f"ceiling AUC (the hidden model) on the {s.eval_samples} held-out samples: {tutorial['ceiling_auc']:.3f}")
    print(
        f"tutorial pattern over all {s.steps} steps (warm-up included): {tutorial['samples_per_s_all_steps']:,.0f}"
        f" samples/s; median step {tutorial['median_step_s'] * 1e3:.1f} ms per trainer"
    )
    elapsed = time.monotonic() - t0
    print(f"wall time: {elapsed:.0f} s")
    C.write_results(
        "bench_ps_tutorial",
        {
            "setup": dataclasses.asdict(s),
            "tutorial": tutorial,
            "disttrain": ours,
            "ratios": {n: r["samples_per_s"] / base for n, r in ours.items()},
            "wall_s": elapsed,
        },
    )


if __name__ == "__main__":
    main(sys.argv[1:])
