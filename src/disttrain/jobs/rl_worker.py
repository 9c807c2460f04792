"""``python -m disttrain.jobs.rl_worker RUN_DIR`` (started by ``disttrain rl``): the job is the run folder's
``config.toml``; rank 0 is the learner, ranks 1.. the actors. The learner writes ``metrics.jsonl``,
``summary.json`` and the progress lines."""

from __future__ import annotations

import json
import os
import sys
import time
import warnings
from pathlib import Path
from typing import Any

import torch

from disttrain.config import load_toml, to_dict
from disttrain.health.events import log_event
from disttrain.health.heartbeat import ProgressBeat
from disttrain.rl import learner as learner_mod
from disttrain.rl import state
from disttrain.rl.actor import Actor
from disttrain.rl.config import RLConfig, RLJobConfig
from disttrain.rl.envs import env_spec
from disttrain.rl.learner import Learner, mean
from disttrain.rpc import transport
from disttrain.testing.faults import install_if_requested
from disttrain.utils import hooks
from disttrain.utils.process import run_and_exit

STOP_KEY = "rl/stop"


def record(lr: Learner, t0: float, steps0: int, updates0: int) -> dict[str, Any]:
    """A metrics.jsonl record: counters, the means over the last episodes, rates since this process started."""
    c, elapsed = lr.c, max(time.perf_counter() - t0, 1e-9)
    return {
        "time_s": round(time.perf_counter() - t0, 2),
        "env_steps": c.env_steps,
        "episodes": c.episodes,
        "updates": c.updates,
        "return": mean(c.returns),
        "return_all": mean(c.all_returns),
        "episode_length": mean(c.lengths),
        "loss": mean(lr.losses),
        "env_steps_per_s": (c.env_steps - steps0) / elapsed,
        "updates_per_s": (c.updates - updates0) / elapsed,
        "learner_busy": c.train_s / elapsed,
        "replay_size": len(lr.replay),
        "actor_lag": mean(c.lags),
    }


def progress(rec: dict[str, Any]) -> str:
    return (
        f"env steps {rec['env_steps']:>8,} | episodes {rec['episodes']:>5} | return {rec['return']:6.1f} "
        f"(all actors {rec['return_all']:6.1f}) | updates {rec['updates']:>6,} | loss {rec['loss']:.4f} | "
        f"{rec['env_steps_per_s']:,.0f} steps/s | replay {rec['replay_size']:,} | "
        f"lag {rec['actor_lag']:.1f} | learner busy {rec['learner_busy']:.0%}"
    )


def learn(cfg: RLJobConfig, run_dir: Path) -> dict[str, Any]:
    """The learner's loop: train when the replay ratio allows, take in experience, answer actors, log,
    checkpoint; until solved or out of environment steps."""
    lr = Learner(cfg, env_spec(cfg.rl.env_id))
    resumed = state.resume(run_dir, lr)
    if resumed is not None:
        log_event(run_dir, "rl_resume", updates=lr.c.updates, env_steps=lr.c.env_steps, path=str(resumed))
        print(f"resumed from {resumed} ({lr.c.updates} updates, {lr.c.env_steps:,} env steps)", flush=True)
    learner_mod.serve(lr)
    metrics = open(run_dir / "metrics.jsonl", "a")  # noqa: SIM115 (closed below)
    t0, steps0, updates0, last_log = time.perf_counter(), lr.c.env_steps, lr.c.updates, time.perf_counter()
    every = cfg.checkpoint.interval
    while not (lr.solved() or lr.c.env_steps >= cfg.train.max_env_steps):
        trained = lr.train_once()
        lr.drain(0.0 if trained else 0.02)
        lr.release()
        if trained and every and lr.c.updates % every == 0:
            state.save(run_dir, lr)
        if trained:
            hooks.fire("learner_update", lr.c.updates, 0)
        if time.perf_counter() - last_log >= cfg.train.log_interval_s:
            last_log = time.perf_counter()
            rec = record(lr, t0, steps0, updates0)
            metrics.write(json.dumps(rec) + "\n")
            metrics.flush()
            print(progress(rec), flush=True)
    lr.finish()
    transport.store().set(STOP_KEY, "1")  # idle spares leave
    final = record(lr, t0, steps0, updates0) | {"solved": lr.solved(), "wall_s": round(time.perf_counter() - t0, 2)}
    final |= {  # what learned from what: the network, and how the replay held the observations
        "network": type(lr.net).__name__,
        "replay_ratio": cfg.rl.samples_per_step,
        "replay_capacity": lr.replay.capacity,
        "replay_obs_dtype": str(lr.replay.obs_dtype).removeprefix("torch."),
        "replay_bytes": lr.replay.nbytes,
    }
    metrics.write(json.dumps(final) + "\n")
    metrics.close()
    wait_for_actors(lr, cfg.rl)
    return final


def wait_for_actors(lr: Learner, cfg: RLConfig, quiet_s: float = 10.0) -> None:
    """Until every actor has been told to stop, or has been silent for ``quiet_s`` (it died)."""
    deadline = time.monotonic() + cfg.rpc_timeout_s
    while time.monotonic() < deadline:
        lr.drain(0.05)
        lr.release()
        if lr.all_told(cfg.actors, quiet_s):
            return


def main(argv: list[str]) -> int:
    install_if_requested()  # tests: faults on purpose, on the engines' hook points
    run_dir = Path(argv[0])
    cfg = load_toml(run_dir / "config.toml", job=RLJobConfig)
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    torch.set_num_threads(1)
    warnings.filterwarnings("ignore", message="You are using a Backend")  # torch's own RPC set-up, on gloo
    actors = cfg.rl.actors
    name = "learner" if rank == 0 else f"actor{rank - 1}" if rank <= actors else f"spare{rank - actors - 1}"
    transport.init(name, rank, world, timeout_s=cfg.rl.rpc_timeout_s)
    with ProgressBeat(run_dir, rank, name, cfg.health) as beat:  # the launcher names one whose process stops
        remove = hooks.on("learner_update" if rank == 0 else "actor_chunk", lambda step, _rank: beat.progress(step))
        try:
            play(cfg, rank, run_dir)
        finally:
            remove()
    return 0


def play(cfg: RLJobConfig, rank: int, run_dir: Path) -> None:
    """This rank's part: the learner's loop and the summary (rank 0), or an actor's (or a spare's)."""
    actors = cfg.rl.actors
    if rank == 0:
        final = learn(cfg, run_dir)
        summary = {"config": to_dict(cfg), **final}
        (run_dir / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
        verdict = "solved" if final["solved"] else "not solved"
        print(
            f"done ({verdict}): {final['wall_s']:.1f} s, {final['env_steps']:,} env steps, {final['episodes']} "
            f"episodes, {final['env_steps_per_s']:,.0f} env steps/s, return {final['return']:.1f} over the last "
            f"{len(learner_mod._get().c.returns)} counted episodes | run folder: {run_dir}",
            flush=True,
        )
        transport.shutdown(graceful=False, peers=[0, *learner_mod._get().told, *idle_spares(cfg.rl)])
    else:
        index = rank - 1 if rank <= actors else wait_as_spare()
        if index is not None:
            res = Actor(cfg, index, env_spec(cfg.rl.env_id), rank).run()
            (run_dir / "logs" / f"actor{index}.json").write_text(json.dumps(res) + "\n")
        transport.shutdown(graceful=False, peers=[0])


def wait_as_spare() -> int | None:
    """A spare: the place of the dead actor it is told to take (by ``disttrain rl``'s parent), or None when
    the learner stops first."""
    store = transport.store()
    me = f"rl/activate/{os.environ['RANK']}"
    while True:
        if store.check([me]):
            return int(store.get(me))
        if store.check([STOP_KEY]):
            return None
        time.sleep(0.2)


def idle_spares(cfg: RLConfig) -> list[int]:
    store = transport.store()
    spares = range(cfg.actors + 1, cfg.actors + 1 + cfg.spare_actors)
    return [r for r in spares if not store.check([f"rl/activate/{r}"])]


def entry(argv: list[str]) -> int:
    """``python -m disttrain.jobs.rl_worker RUN_DIR``: one rank of the job, its exit code."""
    return main(argv)


if __name__ == "__main__":
    run_and_exit(lambda: entry(sys.argv[1:]))
