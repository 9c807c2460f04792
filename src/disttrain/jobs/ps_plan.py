"""``disttrain ps --plan``'s speed: this host's costs of one BSP step timed on the job's own samples and model
(one thread, as each worker runs), the RPC links from doctor's cache (measured now when this host has none),
and :func:`disttrain.ps.speed.predict`'s samples/s for the job's nodes, rendered as a few lines. Every cost is
timed on the CPU clock (a thread's or a process's CPU seconds), not the wall clock: what a step costs, whatever
share of the cores other work leaves the plan while it measures, so a busy machine plans as a quiet one does."""

from __future__ import annotations

import dataclasses
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from torch.nn.utils import parameters_to_vector

from disttrain.config import LaunchConfig, to_toml
from disttrain.plan.machine import load_machine
from disttrain.ps.bsp_step import StepRows, summed_columns, unique_columns
from disttrain.ps.clicks import Batch, ClickLog, CriteoFile
from disttrain.ps.config import PSJobConfig
from disttrain.ps.model import DenseArch
from disttrain.ps.sharding import RowSharding
from disttrain.ps.speed import Link, StepCosts, predict
from disttrain.ps.table import sparse_step
from disttrain.utils.fmt import fmt_bytes, fmt_rate
from disttrain.utils.peak import one_thread

ARENA_ROWS = 1 << 20
"""The most rows the timed server update touches (a server's update costs by the rows pushed, not held)."""


def measure_costs(cfg: PSJobConfig, links: dict[str, Link]) -> StepCosts:
    """What a step costs on this host: its pieces timed here (:func:`timed_pieces`), then calibrated on the job
    itself run here (:func:`calibrated`)."""
    return calibrated(cfg, timed_pieces(cfg), links)


def timed_pieces(cfg: PSJobConfig, steps: int = 10) -> StepCosts:
    """A trainer's step (rows gathered, forward, backward, gradients summed per row, Adam: what the job's code
    does beside its messages) and server 0's update, timed on one thread's CPU clock on the job's first
    ``steps`` global batches (medians, after a warm-up step), and the distinct rows each trainer reads from each
    server."""
    ps, train = cfg.ps, cfg.train
    log: ClickLog | CriteoFile = (
        ClickLog(list(ps.tables), ps.n_dense, seed=train.seed)
        if ps.data_path is None
        else CriteoFile(ps.data_path, list(ps.tables), train.eval_samples)
    )
    tables = list(log.tables)
    shardings = [RowSharding(rows, ps.servers, ps.sharding) for rows in tables]
    offsets = torch.tensor([0, *tables[:-1]]).cumsum(0)
    local_offsets = torch.tensor([0, *[s.shard_rows(0) for s in shardings[:-1]]]).cumsum(0)
    model = DenseArch(ps.n_dense, len(tables), ps.dim, ps.hidden)
    opt = torch.optim.Adam(model.parameters(), lr=ps.dense_lr, fused=True)
    arena = min(sum(tables), ARENA_ROWS)
    weight, sum_sq = torch.zeros(arena, ps.dim), torch.zeros(arena, ps.dim)
    rows = torch.zeros(ps.trainers, ps.servers)
    trainer_times, server_times = [], []
    with one_thread():
        for step in range(steps + 1):
            t0 = time.thread_time()
            whole = log.batch(train.batch * ps.trainers, torch.Generator().manual_seed(train.seed * 100_003 + step))
            parts = [_part(whole, t, train.batch) for t in range(ps.trainers)]
            _trainer_step(model, opt, parts[0], offsets, ps.dim)
            took = time.thread_time() - t0
            pushed = []
            for t, b in enumerate(parts):
                for i, sharding in enumerate(shardings):
                    ids = torch.unique(b.ids[:, i])
                    owner = sharding.owner(ids)
                    rows[t] += torch.bincount(owner, minlength=ps.servers).float()
                    pushed.append(sharding.local(ids[owner == 0]) + local_offsets[i])
            server = _update_s(weight, sum_sq, torch.cat(pushed) % arena, ps.lr)  # server 0, every trainer's
            if step:  # the first one warms up
                trainer_times.append(took)
                server_times.append(server)
    return StepCosts(
        trainer_s=statistics.median(trainer_times),
        server_s=statistics.median(server_times),
        rows=tuple(tuple(r) for r in (rows / (steps + 1)).tolist()),
        dense_params=sum(p.numel() for p in model.parameters()),
        dim=ps.dim,
        measured="its pieces",
    )


def _update_s(weight: torch.Tensor, sum_sq: torch.Tensor, rows: torch.Tensor, lr: float) -> float:
    """CPU seconds of a server's update of ``rows`` (duplicates summed), then its read of them."""
    t0 = time.thread_time()
    sparse_step(weight, sum_sq, rows, torch.ones(len(rows), weight.shape[1]), lr, 1e-8)
    weight[torch.unique(rows)]
    return time.thread_time() - t0


def probe_config(cfg: PSJobConfig, steps: int) -> PSJobConfig:
    """``cfg`` for a short timed run on this host: ``steps`` steps, no evaluation, checkpoint or progress line,
    one node."""
    train = dataclasses.replace(cfg.train, steps=steps, eval_interval=0, eval_samples=256, log_interval=0)
    return dataclasses.replace(
        cfg,
        train=train,
        checkpoint=dataclasses.replace(cfg.checkpoint, interval=0),
        launch=LaunchConfig(),
    )


def step_of_run(cfg: PSJobConfig, timeout_s: float = 120) -> float | None:
    """CPU seconds per step of ``cfg`` (a :func:`probe_config`) run here as ``disttrain ps`` runs it: the median,
    over its steps after the first 5, of trainer 0's process CPU in a step (every thread: its server's and
    RPC's too). None when it fails (the plan then does without it)."""
    with tempfile.TemporaryDirectory(prefix="disttrain-ps-plan-") as tmp:
        run = dataclasses.replace(cfg, run=dataclasses.replace(cfg.run, root=tmp, name="probe"))
        Path(tmp, "job.toml").write_text(to_toml(run))
        cli = "import sys; from disttrain.cli import main; sys.exit(main(sys.argv[1:]))"
        argv = [sys.executable, "-c", cli, "ps", "--config", str(Path(tmp, "job.toml"))]
        try:
            done = subprocess.run(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=timeout_s)
            metrics = Path(tmp, "probe", "metrics.jsonl")
            lines = metrics.read_text().splitlines() if done.returncode == 0 and metrics.is_file() else []
        except (subprocess.TimeoutExpired, OSError):
            return None
    cpu = [json.loads(x)["process_cpu_s"] for x in lines if '"process_cpu_s"' in x][5:]
    return statistics.median(cpu) if cpu else None


def calibrated(cfg: PSJobConfig, costs: StepCosts, links: dict[str, Link], steps: int = 30) -> StepCosts:
    """``costs`` made to match the job itself, run here on one node for ``steps`` steps (:func:`step_of_run`):
    what the timed pieces leave out (the messages' handling, RPC's threads beside the trainer's, the step's
    bookkeeping) becomes a message's CPU at each end, bisected until the model's busiest process spends the
    CPU per step the run's did; with no message between processes, the trainer's step. Unchanged when the
    run fails."""
    here = step_of_run(probe_config(cfg, steps))
    if here is None:
        return costs
    how = f"calibrated on the job run here for {steps} steps"
    one = dataclasses.replace(costs, measured=how)
    if cfg.ps.processes < 2 or (cfg.ps.colocated and cfg.ps.servers == 1):  # every message stays in its process
        return dataclasses.replace(one, trainer_s=max(costs.trainer_s, here - costs.server_s))
    cores = os.cpu_count() or 1
    target = here * max(1.0, cfg.ps.processes / cores)  # the model's CPU per step is stretched by taking turns
    low, high = 0.0, here
    for _ in range(40):  # the busiest process's CPU grows with a message's: bisect for the measured one
        mid = (low + high) / 2
        cpu = predict(cfg, dataclasses.replace(one, message_cpu_s=mid), links, 1, cores).cpu_s
        low, high = (mid, high) if cpu < target else (low, mid)
    return dataclasses.replace(one, message_cpu_s=low)


def _part(b: Batch, t: int, batch: int) -> Batch:
    part = slice(t * batch, (t + 1) * batch)
    return Batch(b.dense[part], b.ids[part], b.label[part])


def _trainer_step(model: DenseArch, opt: torch.optim.Optimizer, b: Batch, offsets: torch.Tensor, dim: int) -> None:
    """What a BSP trainer computes in a step (as :class:`disttrain.ps.trainer.PSTrainer` does it)."""
    uniq, inverse = unique_columns(b.ids, offsets)
    rows = StepRows(uniq, inverse, [torch.zeros(len(u), dim) for u in uniq])
    embs = rows.embeddings().requires_grad_()
    loss = F.binary_cross_entropy_with_logits(model(b.dense, embs), b.label)
    opt.zero_grad(set_to_none=True)
    loss.backward()
    assert embs.grad is not None
    summed_columns(embs.grad, inverse, [len(u) for u in uniq])
    parameters_to_vector([p.grad for p in model.parameters() if p.grad is not None])
    opt.step()


def rpc_links(nnodes: int) -> tuple[dict[str, Link], list[str]]:
    """The links a prediction reads from this host's doctor figures (measuring the RPC link now when it has
    none), and a line per link saying where its figures come from."""
    prof = load_machine()
    if prof is None or "rpc" not in prof.links:
        from disttrain.jobs.doctor import measure_machine

        print(f"disttrain: {measure_machine(2, rpc=True)}", file=sys.stderr, flush=True)
        prof = load_machine()
    links: dict[str, Link] = {}
    notes = []
    for name, what in (("rpc", "within a node"), ("rpc_inter", "across nodes"), ("intra", ""), ("inter", "")):
        fit = prof.links.get(name) if prof is not None else None
        if fit is not None:
            links[name] = (fit.latency_s, fit.bandwidth_Bps)
            if what and (name == "rpc" or nnodes > 1):
                notes.append(f"rpc {what}: {fit.latency_s * 1e3:.2f} ms round trip, {fmt_rate(fit.bandwidth_Bps)}")
    if "rpc" not in links:
        links["rpc"] = (2e-4, 1e9)
        notes.append("rpc within a node: not measured (`disttrain doctor` failed here); assumed 0.2 ms, 1 GB/s")
    if nnodes > 1 and "rpc_inter" not in links:
        notes.append(
            "rpc across nodes: not measured, taken as within a node (an upper bound): run `disttrain doctor "
            f"--launch.nnodes {nnodes} ...` on the nodes, then plan again"
        )
    return links, notes


def nodes_sharing_cores(nnodes: int) -> int:
    """How many of ``nnodes`` nodes share one machine's cores, as the last doctor across nodes found (network
    namespaces or containers of one host); 1 for one node, or nodes of their own."""
    prof = load_machine()
    return min(nnodes, prof.nodes_sharing_cores) if prof is not None and nnodes > 1 else 1


def speed_plan(cfg: PSJobConfig) -> str:
    """The lines ``ps --plan`` prints about speed."""
    ps = cfg.ps
    if ps.mode != "bsp":
        return f"speed: predicted for bsp steps only (this job runs {ps.mode}: trainers do not move in steps)"
    nnodes = int(cfg.launch.nnodes.split(":")[-1])
    links, notes = rpc_links(nnodes)
    costs = measure_costs(cfg, links)
    cores, shared = os.cpu_count() or 1, nodes_sharing_cores(nnodes)
    p = predict(cfg, costs, links, nnodes, cores / shared)
    how = "overlapped" if ps.overlapped else "plain"
    where = f"{ps.processes} processes on {nnodes} node(s) of {cores} cores"
    if shared > 1:
        where = f"{ps.processes} processes on {nnodes} nodes sharing this machine's {cores} cores (doctor found them)"
    return "\n".join(
        [
            f"speed (bsp, {how} steps, {where}): ~{p.samples_per_s:,.0f} samples/s predicted "
            f"(step {p.step_s * 1e3:.2f} ms, set by {p.bound})",
            f"  compute: a trainer's step {costs.trainer_s * 1e3:.2f} ms and a server's update "
            f"{costs.server_s * 1e3:.2f} ms (CPU timed now: {costs.measured}, one thread); the busiest process "
            f"{p.cpu_s * 1e3:.2f} ms of CPU per step",
            f"  messages: {p.messages_s * 1e3:.2f} ms per step ({fmt_bytes(p.bytes_per_step)} per step, "
            f"{fmt_bytes(p.cross_bytes)} across nodes){_message_cpu(costs)}",
            *[f"  {n}" for n in notes],
            f"  within {ERROR:.0%} where the links were measured (checked on two hosts over a rate-limited link)",
        ]
    )


def _message_cpu(costs: StepCosts) -> str:
    if not costs.message_cpu_s:
        return ""
    return f"; {costs.message_cpu_s * 1e3:.2f} ms of CPU at each end of one (the job run here on one node)"


ERROR = 0.3
"""The prediction's stated error, as tests/multinode and the benchmark check it."""
