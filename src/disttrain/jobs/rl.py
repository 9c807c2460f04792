"""``disttrain rl``'s parent: the run folder, then the learner and actors as processes it watches itself.

Not torchrun: its agent ends (or restarts) the whole group when any worker fails, and an RL job should
outlive an actor. Here a dead actor is written to the events log and printed, and the learner goes on with
the others; the learner failing ends the job with one line that says how to resume. Rank 0 (the learner)
prints to this console; every rank's output also goes to ``<run>/logs/rank<r>.log``. The workers read the job
from the run folder's ``config.toml``.
"""

from __future__ import annotations

import dataclasses
import datetime
import sys
import time
from pathlib import Path

import torch.distributed as dist

from disttrain.checkpoint.commit import resume_hint
from disttrain.config import to_toml
from disttrain.health.events import log_event
from disttrain.launch.direct import Worker, node_ranks, run_watched, start
from disttrain.launch.k8s.env import from_pod
from disttrain.rl.config import RLJobConfig
from disttrain.rl.envs import env_spec
from disttrain.rl.nets import check_algo


def rl_run_dir(cfg: RLJobConfig) -> Path:
    path = Path(cfg.run.root) / (cfg.run.name or time.strftime("%Y%m%d-%H%M%S") + "-rl")
    path.mkdir(parents=True, exist_ok=True)
    return path


def my_ranks(cfg: RLJobConfig) -> tuple[range, str, int]:
    """This node's ranks, the rendezvous host and port (rank 0, the learner, hosts the RPC store)."""
    launch = cfg.launch
    return node_ranks(world_size(cfg), launch.nnodes, launch.node_rank, launch.rdzv_endpoint or "", processes(cfg))


def processes(cfg: RLJobConfig) -> str:
    """The job's processes, for the line that says they do not fit the nodes."""
    rl = cfg.rl
    return f"disttrain rl runs {world_size(cfg)} processes (1 learner + {rl.actors} actors + {rl.spare_actors} spares)"


def world_size(cfg: RLJobConfig) -> int:
    """The learner, the actors and the spares."""
    return 1 + cfg.rl.actors + cfg.rl.spare_actors


def launch_rl(cfg: RLJobConfig) -> int:
    launch, _, _ = from_pod(cfg.launch, None)  # in a PyTorchJob / JobSet pod: its nodes, node rank, rendezvous
    cfg = dataclasses.replace(cfg, launch=launch)
    rl = cfg.rl
    check_algo(env_spec(rl.env_id), rl.algo)  # an unknown id or an unsupported space: one line, before anything
    ranks, host, port = my_ranks(cfg)
    run_dir = rl_run_dir(cfg)
    (run_dir / "logs").mkdir(exist_ok=True)
    (run_dir / "config.toml").write_text(to_toml(cfg))
    if 0 in ranks:
        print(
            f"disttrain rl: {rl.algo} on {rl.env_id}, 1 learner + {rl.actors} actors x {rl.envs_per_actor} "
            f"envs, inference on the {rl.inference}; run folder {run_dir}",
            flush=True,
        )
    module, node = "disttrain.jobs.rl_worker", cfg.launch.node_rank
    procs = {r: start(module, r, world_size(cfg), host, port, run_dir, node) for r in ranks}
    return run_watched(procs, cfg.health, run_dir, node, Watch(cfg, procs, run_dir, (host, port)).run)


class Watch:
    """Until the learner (or, on other nodes, every actor) ends: report dead actors and put a spare in their
    place; end with the learner."""

    def __init__(self, cfg: RLJobConfig, procs: dict[int, Worker], run_dir: Path, store_at: tuple[str, int]) -> None:
        self.procs, self.run_dir, self.store_at = procs, run_dir, store_at
        self.places = {r: r - 1 for r in procs if 1 <= r <= cfg.rl.actors}  # rank -> the actor place it plays
        self.spares = [r for r in procs if r > cfg.rl.actors]
        self.reported: set[int] = set()

    def run(self) -> int:
        while True:
            time.sleep(0.2)
            if 0 in self.procs and self.procs[0].poll() is not None:  # first: actors end when the learner does
                return learner_ended(self.procs, self.run_dir)
            for r, p in self.procs.items():
                code = p.poll()
                if r and code not in (None, 0) and r not in self.reported:
                    self.reported.add(r)
                    self.actor_died(r, code)
            if 0 not in self.procs and all(p.poll() is not None for p in self.procs.values()):
                return 0 if not self.reported else 1

    def actor_died(self, rank: int, code: int) -> None:
        place = self.places.pop(rank, None)
        log_event(self.run_dir, "actor_died", actor=place, rank=rank, exit_code=code)
        log = self.run_dir / "logs" / f"rank{rank}.log"
        then = "the learner goes on with the others"
        if place is not None and self.spares:
            spare = self.spares.pop(0)
            self.places[spare] = place
            try:
                store = dist.TCPStore(*self.store_at, is_master=False, timeout=datetime.timedelta(seconds=30))
                store.set(f"rl/activate/{spare}", str(place))
            except (RuntimeError, OSError) as e:  # the learner (and its store) went first: it ends the job
                then = f"spare rank {spare} could not take its place (the learner's store: {str(e).splitlines()[0]})"
            else:
                log_event(self.run_dir, "actor_replaced", actor=place, rank=spare)
                then = f"spare rank {spare} takes its place"
        print(
            f"disttrain rl: actor {place} (rank {rank}) exited with code {code}; {then} (log: {log})",
            file=sys.stderr,
            flush=True,
        )


def learner_ended(procs: dict[int, Worker], run_dir: Path) -> int:
    code = procs[0].returncode
    deadline = time.monotonic() + (15 if code == 0 else 0)
    while time.monotonic() < deadline and any(p.poll() is None for p in procs.values()):
        time.sleep(0.1)
    if code == 0:
        return 0
    log_event(run_dir, "learner_died", exit_code=code)
    back = resume_hint(run_dir, "learner")
    print(
        f"disttrain rl: the learner (rank 0) exited with code {code}, so the job ends; {back} "
        f"(log: {run_dir / 'logs' / 'rank0.log'})",
        file=sys.stderr,
        flush=True,
    )
    return 1
