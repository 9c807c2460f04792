"""``disttrain ps``'s parent: the run folder (with the resolved ``config.toml`` the workers read), then trainers +
servers as one torchrun job on this node."""

from __future__ import annotations

import dataclasses
import datetime
import os
import sys
import time
from pathlib import Path

import torch.distributed as dist

from disttrain.checkpoint.commit import resume_hint
from disttrain.config import to_toml
from disttrain.errors import ConfigError
from disttrain.health.events import log_event
from disttrain.launch.direct import Worker, node_ranks, per_node, run_watched, start
from disttrain.launch.frozen_watch import watch_frozen
from disttrain.launch.k8s.env import from_pod
from disttrain.launch.torchrun import run_torchrun, torchrun_argv
from disttrain.ps.config import PSJobConfig
from disttrain.ps.plan import render_plan
from disttrain.ps.trainer import LOST_KEY


def ps_run_dir(cfg: PSJobConfig) -> Path:
    path = Path(cfg.run.root) / (cfg.run.name or time.strftime("%Y%m%d-%H%M%S") + "-ps")
    path.mkdir(parents=True, exist_ok=True)
    return path


def launch_ps(cfg: PSJobConfig, plan: bool = False) -> int:
    """The job; ``plan``: only print the rows and bytes each server would hold, and the speed it will reach."""
    ps = cfg.ps
    if plan:
        from disttrain.jobs.ps_plan import speed_plan

        print(render_plan(ps))
        print(speed_plan(cfg))
        return 0
    launch, _, _ = from_pod(cfg.launch, None)  # in a PyTorchJob / JobSet pod: its nodes, node rank, rendezvous
    cfg = dataclasses.replace(cfg, launch=launch)
    if ps.data_path is not None and not Path(ps.data_path).is_file():
        raise ConfigError(f"ps.data_path {ps.data_path} does not exist; give a Criteo-format .tsv file")
    nproc = ps_procs_per_node(cfg)
    run_dir = ps_run_dir(cfg)
    config = run_dir / "config.toml"
    config.write_text(to_toml(cfg))
    tables = f"{len(ps.tables)} tables ({sum(ps.tables):,} rows x {ps.dim})"
    print(
        f"disttrain ps: {ps.trainers} trainer(s) x {ps.servers} server(s), {ps.mode}, {tables}; run folder {run_dir}",
        flush=True,
    )
    os.environ.setdefault("TORCH_CPP_LOG_LEVEL", "ERROR")  # TensorPipe's warnings repeat what the trainers say
    if ps.watched:
        return launch_watched(cfg, run_dir)
    argv = torchrun_argv(nproc, cfg.launch, log_dir=run_dir / "logs")

    def name(rank: int) -> str:
        return f"{ps.role(rank)} (rank {rank})"

    with watch_frozen(cfg.health, run_dir, cfg.launch.node_rank):
        code = run_torchrun([*argv, "-m", "disttrain.jobs.ps_worker", str(run_dir)], nproc, "cpu", name)
    if code == 1:  # the line above named the rank; how to go on (a trainer may have said it first)
        back = resume_hint(run_dir, "server")
        print(f"disttrain ps: the job stopped; {back}", file=sys.stderr, flush=True)
    return code


def ps_procs_per_node(cfg: PSJobConfig) -> int:
    """Trainers + servers spread evenly over a fixed ``launch.nnodes`` (ranks in order: trainers, then servers)."""
    who = "trainers, each with its server" if cfg.ps.colocated else f"trainers + {cfg.ps.servers} servers"
    what = f"disttrain ps runs {cfg.ps.processes} processes ({cfg.ps.trainers} {who})"
    return per_node(cfg.ps.processes, cfg.launch.nnodes, what)


def launch_watched(cfg: PSJobConfig, run_dir: Path) -> int:
    """The processes started and watched here (:mod:`disttrain.launch.direct`), not by torchrun, whose agent
    would end every process when one dies: the trainers hand a dead server's shard to a spare, and under asp
    the trainers go on without a dead one."""
    ps, launch = cfg.ps, cfg.launch
    what = f"disttrain ps runs {ps.processes} processes ({ps.trainers} trainers + {ps.servers} servers + spares)"
    ranks, host, port = node_ranks(ps.processes, launch.nnodes, launch.node_rank, launch.rdzv_endpoint or "", what)
    procs = {
        r: start("disttrain.jobs.ps_worker", r, ps.processes, host, port, run_dir, launch.node_rank) for r in ranks
    }
    watch = ProcessWatch(cfg, procs, run_dir, (host, port))
    return run_watched(procs, cfg.health, run_dir, launch.node_rank, watch.run)


class ProcessWatch:
    """Until this node's trainers end: a server that dies is named (the trainers replace it); an asp trainer
    that dies (not trainer 0) is named and left behind, the store told (the trainers' clocks and watchdog
    leave it out); any other trainer that fails ends the job."""

    def __init__(self, cfg: PSJobConfig, procs: dict[int, Worker], run_dir: Path, store_at: tuple[str, int]) -> None:
        self.cfg, self.procs, self.run_dir, self.store_at = cfg, procs, run_dir, store_at
        self.reported: set[int] = set()

    def run(self) -> int:
        ps, procs = self.cfg.ps, self.procs
        trainers = [r for r in procs if r < ps.trainers]
        while True:
            time.sleep(0.2)
            for r, p in procs.items():
                code = p.poll()
                if code in (None, 0) or r in self.reported:
                    continue
                self.reported.add(r)
                if not self.lost(r, code):
                    return 1
            if trainers and all(procs[r].poll() is not None for r in trainers):
                deadline = time.monotonic() + 15
                while time.monotonic() < deadline and any(p.poll() is None for p in procs.values()):
                    time.sleep(0.1)
                return 0
            if not trainers and all(p.poll() is not None for p in procs.values()):
                return 0

    def lost(self, r: int, code: int) -> bool:
        """Process ``r`` exited with ``code``: named, logged; whether the job goes on without it."""
        ps, log = self.cfg.ps, self.run_dir / "logs" / f"rank{r}.log"
        if r >= ps.trainers:
            log_event(self.run_dir, "ps_server_died", rank=r, role=ps.role(r), exit_code=code)
            self.say(f"{ps.role(r)} (rank {r}) exited with code {code}; a spare takes its shard (log: {log})")
            return True
        if r > 0 and ps.outlives_trainers:
            log_event(self.run_dir, "ps_trainer_lost", rank=r, exit_code=code)
            gone = f"trainer{r} (rank {r}) exited with code {code}"
            self.say(f"{gone}; asp: the other trainers go on without its samples (log: {log})")
            host, port = self.store_at
            store = dist.TCPStore(host, port, is_master=False, timeout=datetime.timedelta(seconds=30))
            store.set(LOST_KEY.format(rank=r), str(code))
            return True
        log_event(self.run_dir, "ps_trainer_died", rank=r, exit_code=code)
        go_on = " (with --ps.colocate off, an asp trainer other than trainer 0 may die and the others go on)"
        why = go_on if r > 0 and ps.mode == "asp" else ""
        self.say(f"trainer{r} (rank {r}) exited with code {code}; the job ends{why} (log: {log})")
        return False

    @staticmethod
    def say(line: str) -> None:
        print(f"disttrain ps: {line}", file=sys.stderr, flush=True)
