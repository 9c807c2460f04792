"""``disttrain ps`` against the pattern of PyTorch's RPC parameter-server tutorial, same model, data and threads.

The baseline follows https://pytorch.org/tutorials/intermediate/rpc_param_server_tutorial.html: ONE server process
holds the whole model (every table a dense ``nn.Embedding``, rows drawn as disttrain's are, and disttrain's
``DenseArch``); each trainer gets an RRef to it and per step, inside ``dist_autograd.context()``, runs the
forward on the server, the loss here, ``dist_autograd.backward`` (dense embedding gradients: every row, every
step) and ``DistributedOptimizer.step`` (Adagrad over the tables, Adam over the MLP, disttrain's rates), each
trainer with its own optimizers, unsynchronised (Hogwild). One addition: the tutorial as written fails with two
trainers (pytorch/tutorials#2095), so a gate on the server lets the trainers' passes run together and their
optimizer steps run together, never one inside the other (:meth:`TutorialServer.enter`).

Both systems see the same samples (each step's global batch from the generator seeded ``seed * 100_003 + step``,
split by trainer rank); one intra-op thread per process. The baseline's samples/s count the steps after 3
warm-up steps; disttrain's are its ``summary.json`` ``samples_per_s``, which counts every step, so the ratio, if
anything, understates disttrain. AUC on ``ClickLog.held_out(20000, seed)``. Rows: the tutorial pattern (1
server), ``disttrain ps --ps.trainers 2 --ps.servers 1`` and ``--ps.servers 2``. Goal: disttrain >= 3x.

    .venv/bin/python -m benchmarks.bench_ps_tutorial [--steps 60] [--tables 100000 50000 10000 1000 500 100]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import tempfile
import threading
import time
import warnings
from pathlib import Path
from typing import Any

import torch
import torch.distributed.autograd as dist_autograd
import torch.distributed.rpc as rpc
import torch.nn.functional as F
from torch import nn
from torch.distributed.optim import DistributedOptimizer

from benchmarks import harness as H
from disttrain.ps.clicks import Batch, ClickLog, auc
from disttrain.ps.model import DenseArch
from disttrain.testing.ports import free_port

GOAL = H.Goal("samples/s, disttrain ps / the tutorial pattern", 3.0)
OPTIONS = {"steps": (60, "steps per job"), "tables": ([100_000, 50_000, 10_000, 1_000, 500, 100], "rows of each table")}
QUICK = {"steps": 6, "tables": [10_000, 1_000, 100]}
WARMUP = 3
SERVER = "parameter_server"
EVAL_CHUNK = 4096


@dataclasses.dataclass
class Setup:
    """The default ``disttrain ps`` job's model, batch, optimizers and evaluation (``disttrain.ps.config``)."""

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
        tables = [nn.Embedding(rows, s.dim, sparse=False) for rows in s.tables]
        for t in tables:
            nn.init.normal_(t.weight, std=0.01)
        self.tables = nn.ModuleList(tables)
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
    chunks = [slice(i, i + EVAL_CHUNK) for i in range(0, len(b.label), EVAL_CHUNK)]
    logits = torch.cat([server.rpc_sync().predict(b.dense[c], b.ids[c]) for c in chunks])
    return {"auc": auc(logits, b.label), "ceiling_auc": log.ceiling(b)}


def train(rank: int, s: Setup) -> dict[str, Any]:
    """The tutorial's trainer loop on this trainer's share of every step's batch; its timings (and AUC)."""
    log = ClickLog(list(s.tables), s.n_dense, seed=s.seed)
    server = rpc.remote(SERVER, get_server, args=(s,))
    opts = [
        DistributedOptimizer(torch.optim.Adagrad, server.rpc_sync().param_rrefs("tables"), lr=s.lr),
        DistributedOptimizer(torch.optim.Adam, server.rpc_sync().param_rrefs("dense"), lr=s.dense_lr),
    ]
    step_s: list[float] = []
    start = time.monotonic()
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
    result: dict[str, Any] = {"start": start, "end": end, "step_s": step_s, "loss": float(loss.detach())}
    return result | (evaluate(server, log, s) if rank == 0 else {})


def worker(i: int, out: str, s: Setup, port: int) -> None:
    """Process ``i``: 0 is the server (it only answers calls), 1.. are the trainers."""
    os.environ["TP_SOCKET_IFNAME"] = "lo"
    torch.set_num_threads(1)
    warnings.filterwarnings("ignore", message=".*(TorchScript|ProcessGroup).*")  # deprecation notices
    opts = rpc.TensorPipeRpcBackendOptions(init_method=f"tcp://127.0.0.1:{port}", rpc_timeout=600)
    name = SERVER if i == 0 else f"trainer{i - 1}"
    rpc.init_rpc(name, rank=i, world_size=s.trainers + 1, rpc_backend_options=opts)
    if i > 0:
        (Path(out) / f"{i}.json").write_text(json.dumps(train(i - 1, s)))
    rpc.shutdown()  # waits for every worker


def run_tutorial(s: Setup) -> dict[str, Any]:
    """One server + ``s.trainers`` trainers (processes of their own); samples/s after warm-up, AUC, step times."""
    os.environ.update(TP_SOCKET_IFNAME="lo", OMP_NUM_THREADS="1")
    per = H.spawn(worker, s.trainers + 1, s, free_port())[1:]
    seconds = max(r["end"] for r in per) - min(r["start"] for r in per)
    median_step = H.median([t for r in per for t in r["step_s"][WARMUP:]])
    return {"samples_per_s": (s.steps - WARMUP) * s.batch * s.trainers / seconds, "median_step_s": median_step} | {
        k: per[0][k] for k in ("auc", "ceiling_auc")
    }


# -- disttrain ps, the real command ---------------------------------------------------------------------
def run_disttrain(s: Setup, servers: int, tmp: Path) -> dict[str, Any]:
    """``disttrain ps`` with ``servers`` servers: its defaults are the model, batch and optimizers of :class:`Setup`."""
    job = f"--ps.trainers {s.trainers} --ps.servers {servers} --train.steps {s.steps} --train.eval-interval 0"
    args = [*job.split(), "--ps.tables", *map(str, s.tables)]
    H.disttrain("ps", *args, root=tmp, name=f"s{servers}", env={**os.environ, "OMP_NUM_THREADS": "1"})
    return H.summary(tmp / f"s{servers}")


def run(args: argparse.Namespace) -> dict[str, Any]:
    if args.steps <= WARMUP:
        raise SystemExit(f"--steps must be above the {WARMUP} warm-up steps")
    s = Setup(steps=args.steps, tables=tuple(args.tables))
    tutorial = run_tutorial(s)
    with tempfile.TemporaryDirectory(prefix="disttrain-ps-") as tmp:
        ours = {n: run_disttrain(s, n, Path(tmp)) for n in (1, 2)}
    base = tutorial["samples_per_s"]
    rows = [{"system": "tutorial pattern (1 server)", "samples/s": base, "x tutorial": 1.0, "AUC": tutorial["auc"]}]
    for n, r in ours.items():
        rows.append({"system": f"disttrain ps, {n} server(s)", "samples/s": r["samples_per_s"]})
        rows[-1] |= {"x tutorial": r["samples_per_s"] / base, "AUC": r["final"]["auc"]}
    tables = ", ".join(map(str, s.tables))
    H.table(rows, f"{s.trainers} trainers, {s.steps} steps of {s.batch} samples each, tables {tables} x {s.dim}")
    print(f"ceiling AUC (the hidden model) on the {s.eval_samples} held-out samples: {tutorial['ceiling_auc']:.3f}")
    print(f"tutorial pattern, median step {tutorial['median_step_s'] * 1e3:.1f} ms per trainer")
    goals = [GOAL.check(r["x tutorial"]) for r in rows[1:]]
    return {"setup": dataclasses.asdict(s), "rows": rows, "goals": goals, "tutorial": tutorial, "disttrain": ours}


if __name__ == "__main__":
    H.main(__file__, __doc__, OPTIONS, QUICK, run)
