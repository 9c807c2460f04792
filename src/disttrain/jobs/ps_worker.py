"""``python -m disttrain.jobs.ps_worker RUN_DIR`` under torchrun: the job is the run folder's ``config.toml``;
ranks below ``ps.trainers`` train, the rest serve. Trainer 0 creates the tables, writes ``metrics.jsonl`` and
``summary.json``, and prints."""

from __future__ import annotations

import json
import os
import sys
import time
import warnings
from pathlib import Path
from typing import Any, NoReturn

import torch
import torch.distributed as dist

from disttrain.checkpoint.commit import resume_hint
from disttrain.config import load_toml, to_dict
from disttrain.errors import RpcError
from disttrain.health.events import log_event, record_exit
from disttrain.health.heartbeat import ProgressBeat
from disttrain.health.monitor import HealthMonitor
from disttrain.ps import checkpoint as ps_checkpoint
from disttrain.ps import server
from disttrain.ps.config import PSJobConfig
from disttrain.ps.trainer import LOST_KEY, PSResult, PSTrainer
from disttrain.rpc import transport
from disttrain.testing.faults import install_if_requested
from disttrain.utils import hooks
from disttrain.utils.process import exit_now, run_and_exit


def trainers_group(rank: int, n: int) -> Any:
    """The trainers' own process group (DDP of the dense part), on torchrun's store under its own prefix."""
    if n == 1:
        return None
    store = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), is_master=False)
    dist.init_process_group("gloo", store=dist.PrefixStore("ps-trainers", store), rank=rank, world_size=n)
    return dist.group.WORLD


def reporter(cfg: PSJobConfig, run_dir: Path) -> Any:
    metrics = open(run_dir / "metrics.jsonl", "a")  # noqa: SIM115 (closed by the last step)
    last = {"t": time.perf_counter(), "step": 0}  # when, and at which step, the last progress line was printed
    train, trainers = cfg.train, cfg.ps.trainers

    def on_step(step: int, res: PSResult) -> None:
        rec: dict[str, Any] = {
            "step": step,
            "loss": res.losses[-1],
            "staleness": res.staleness[-1],
            "samples_per_s": train.batch * trainers / max(res.step_s[-1], 1e-9),  # this step, all trainers
            "bytes_per_step": res.step_bytes[-1],  # trainer 0's reads and pushes
            "process_cpu_s": res.step_cpu_s[-1],  # this step's CPU in trainer 0's process, every thread
        }
        if res.evals and res.evals[-1]["step"] == step:
            rec.update(res.evals[-1])
            print(
                f"step {step:6d}/{train.steps} | loss {rec['loss']:.4f} | auc {rec['auc']:.4f} "
                f"(ceiling {rec['ceiling_auc']:.4f}) | logloss {rec['logloss']:.4f}",
                flush=True,
            )
        elif train.log_interval and step % train.log_interval == 0:
            now = time.perf_counter()
            since = step - int(last["step"])
            rate = since * train.batch * trainers / max(now - last["t"], 1e-9)
            print(
                f"step {step:6d}/{train.steps} | loss {rec['loss']:.4f} | {rate:,.0f} samples/s | "
                f"staleness {max(res.staleness[-since:], default=0)}",
                flush=True,
            )
            last.update(t=now, step=step)
        metrics.write(json.dumps(rec) + "\n")
        metrics.flush()  # a killed job keeps every step it logged
        if step == train.steps:
            metrics.close()

    return on_step


def main(argv: list[str]) -> int:
    install_if_requested()  # tests: faults on purpose, on the engines' hook points
    run_dir = Path(argv[0])
    cfg = load_toml(run_dir / "config.toml", job=PSJobConfig)
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    warnings.filterwarnings("ignore", message="You are using a Backend")  # torch's own DDP set-up, on gloo
    torch.set_num_threads(1)
    servers = [f"server{i}" for i in range(cfg.ps.servers)]
    # a colocated process is addressed as its server (trainers are never called)
    me = servers[rank] if cfg.ps.colocated else cfg.ps.role(rank)
    transport.init(me, rank, world, timeout_s=cfg.ps.rpc_timeout_s)
    if rank < cfg.ps.trainers:
        holders = train(cfg, rank, servers, run_dir)
        if cfg.ps.watched:
            leave_watched(cfg, rank, holders)
        else:
            transport.shutdown()  # colocated: serves until every trainer is done
        return 0
    with ProgressBeat(run_dir, rank, me, cfg.health) as beat:  # a server: the launcher names it if it freezes
        remove = hooks.on("ps_update", lambda step, _rank: beat.progress(step))
        if cfg.ps.watched:
            serve_until_done()
            transport.shutdown(graceful=False, peers=[0])
        else:
            transport.shutdown()  # serves until every trainer is done
        remove()
    return 0


DONE_KEY = "ps/done"


def leave_watched(cfg: PSJobConfig, rank: int, holders: list[str]) -> None:
    """A watched job (spare servers, asp trainers that may die) may have lost a process, which a graceful RPC
    shutdown (a barrier over every worker) would wait for: the trainers say they are done in the store,
    trainer 0 waits for every trainer that is done or lost, tells the servers and spares to leave, and leaves
    after every live process has."""
    store = transport.store()
    store.set(f"ps/trainer-done/{rank}", "1")
    if rank != 0:
        transport.shutdown(graceful=False, peers=[0])
        return
    waiting = set(range(cfg.ps.trainers))
    while waiting:
        waiting = {
            r
            for r in waiting
            if not store.check([f"ps/trainer-done/{r}"]) and not store.check([LOST_KEY.format(rank=r)])
        }
        time.sleep(0.05 if waiting else 0)
    store.set(DONE_KEY, "1")
    lost = [r for r in range(cfg.ps.trainers) if store.check([LOST_KEY.format(rank=r)])]
    dead = [cfg.ps.server_rank(k) for k in range(cfg.ps.servers) if f"server{k}" not in holders]
    transport.shutdown(graceful=False, peers=[r for r in range(cfg.ps.processes) if r not in dead + lost])


def serve_until_done() -> None:
    """A server or spare of a job with spares: answer calls until trainer 0 says the job is done."""
    store = transport.store()
    while not store.check([DONE_KEY]):
        time.sleep(0.2)


def train(cfg: PSJobConfig, rank: int, servers: list[str], run_dir: Path) -> list[str]:
    """Trainer ``rank``'s part: tables (rank 0), resume, the loop under heartbeats, the summary (rank 0); the
    processes that hold the shards at the end (a spare may hold a dead server's)."""
    group = trainers_group(rank, cfg.ps.trainers)
    # ssp/asp trainers do not step together, and a server's loss rolls bsp trainers back: windows meet in the store
    health = HealthMonitor(cfg.health, rank, cfg.ps.trainers, run_dir, cfg.ps.rpc_timeout_s, lockstep=False)
    health.start()
    try:
        trainer = PSTrainer(cfg, rank, servers, group, run_dir, health)
        resume = ps_checkpoint.latest(run_dir)
        if rank == 0:
            trainer.create_tables()
            if resume is not None:
                ps_checkpoint.load_servers(resume, servers)
                log_event(run_dir, "ps_resume", step=ps_checkpoint.trainer_state(resume)["step"], path=str(resume))
                print(f"resumed from {resume}", flush=True)
        if resume is not None:
            trainer.load_state(ps_checkpoint.trainer_state(resume))
        if group is not None:
            dist.barrier()
        res = trainer.fit(reporter(cfg, run_dir) if rank == 0 else None)
    except RpcError as e:
        health.close(finished=False)
        server_down(cfg, rank, run_dir, e)
    health.close()
    if rank == 0:
        trainer.notice_lost(at_once=True)
        write_summary(cfg, run_dir, res, trainer.lost)
    if group is not None:
        dist.destroy_process_group()
    return trainer.servers


def write_summary(cfg: PSJobConfig, run_dir: Path, res: PSResult, lost: list[int]) -> None:
    """``summary.json`` and the last line; ``lost``: the asp trainers that died while the others went on."""
    stats = transport.call("server0", server.push_stats) if cfg.ps.mode != "bsp" else {}
    summary = {
        "config": to_dict(cfg),
        "final": res.evals[-1],
        "samples_per_s": res.samples_per_s,
        "bytes_per_step": res.bytes_per_step,
        "cache_hit_rate": res.cache_hit_rate,
        "final_loss": res.losses[-1],
        "max_staleness": max(res.staleness, default=0),
        "server0_pushes": stats,
        "trainers_lost": lost,
    }
    (run_dir / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    gone = f" | lost trainer(s) {', '.join(map(str, lost))}: the others went on" if lost else ""
    print(
        f"done: {cfg.train.steps} steps, {res.samples_per_s:,.0f} samples/s, AUC {res.evals[-1]['auc']:.4f} "
        f"(ceiling {res.evals[-1]['ceiling_auc']:.4f}){gone} | run folder: {run_dir}",
        flush=True,
    )


def server_down(cfg: PSJobConfig, rank: int, run_dir: Path, e: RpcError) -> NoReturn:
    """A call to a server failed (it died, or stopped answering within ps.rpc_timeout_s): one line naming it,
    the events log, and the way back; then this trainer exits (torchrun ends or restarts the whole job)."""
    who = next((s for s in (f"server{i}" for i in range(cfg.ps.servers)) if f" on {s} " in str(e)), "a server")
    where = f"{who} (rank {cfg.ps.server_rank(int(who[6:]))})" if who != "a server" else who
    back = resume_hint(run_dir, "server")
    msg = f"disttrain ps: {where} is down or not answering, trainer {rank} stops: {e}; {back}"
    log_event(run_dir, "ps_server_down", server=who, trainer=rank, error=str(e))
    record_exit(run_dir, rank, msg)
    print(msg, file=sys.stderr, flush=True)
    exit_now(3)
    raise SystemExit(3)  # not reached


def entry(argv: list[str]) -> int:
    """``python -m disttrain.jobs.ps_worker RUN_DIR``: one rank of the job, its exit code."""
    return main(argv)


if __name__ == "__main__":
    run_and_exit(lambda: entry(sys.argv[1:]))
