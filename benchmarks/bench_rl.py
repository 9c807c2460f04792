"""``disttrain rl`` (DQN on CartPole-v1, 1 learner + N actor processes over RPC): throughput and time to solve.

Every configuration is a fresh ``disttrain rl`` job (learner and actors share this machine's cores); its figures
come from the run's summary.json.

1. Throughput: env steps/s with 1-4 actors (chunk 50, inference on the actors), fixed-length runs
   (``--train.solve-return 0``), the learner's replay-ratio flow control included; with 3 actors, ``--rl.chunk 1``
   (one RPC per env step, the PyTorch RPC tutorial's pattern) and ``--rl.inference learner`` (SEED RL: one RPC per
   step to the learner's batched forward), each against chunk 50 with inference on the actors.
2. Time to solve CartPole (mean return of the last 100 counted episodes >= 475) with the defaults, seeds 0-2,
   against a plain single-process DQN loop with disttrain's maths and defaults (:func:`baseline_dqn`: its network,
   Adam, 3-step returns by ``NStepFolder``, ``ReplayBuffer``, ``dqn_step``, replay ratio 8, target copy every 250
   updates; CleanRL's exploration schedule, epsilon 1.0 to 0.02 over the first 20% of the cap), its own process
   (``--baseline dqn``), seeds alternating. Both count only episodes begun with epsilon <= 0.02; both times are the
   training loop only (disttrain: summary.json ``wall_s``); a seed not solved counts as infinite in the medians.
   Goals: disttrain's median <= 120 s and <= 0.7x the baseline's. The whole command's time is shown beside it.

    .venv/bin/python -m benchmarks.bench_rl [--quick] [--seeds 0 1 2]
"""

from __future__ import annotations

import argparse
import copy
import math
import statistics
import tempfile
import time
from collections import deque
from collections.abc import Callable
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
import torch

from benchmarks import harness as H
from disttrain.rl.config import RLConfig, RLTrainConfig
from disttrain.rl.envs import env_spec
from disttrain.rl.nets import make_net
from disttrain.rl.nstep import NStepFolder
from disttrain.rl.replay import ReplayBuffer
from disttrain.rl.updates import dqn_step

GOALS = {
    "solve": H.Goal("disttrain's median loop time to solve CartPole, s", 120.0, higher_is_better=False),
    "ratio": H.Goal("time to solve, disttrain / single process", 0.7, higher_is_better=False),
}
OPTIONS = {
    **H.options(steps=40_000, seeds=[0, 1, 2], timeout_s=1200.0, seed=0),  # steps: of the throughput runs
    "chunk1_steps": (5_000, "env steps of the --rl.chunk 1 run (one RPC per step)"),
    "learner_steps": (10_000, "env steps of the --rl.inference learner run (one RPC per step)"),
    "cap": (500_000, "solve runs: env steps before giving up (both systems)"),
}
QUICK = {"steps": 5_000, "chunk1_steps": 1_000, "learner_steps": 2_000, "cap": 30_000, "seeds": [0], "timeout_s": 600.0}
THROUGHPUT = [(1, 50, "actor"), (2, 50, "actor"), (3, 50, "actor"), (4, 50, "actor"), (3, 1, "actor")]
THROUGHPUT += [(3, 50, "learner")]  # (actors, chunk, inference)


def run_rl(root: Path, name: str, args: list[str], timeout_s: float) -> dict[str, Any]:
    """One ``disttrain rl`` job: its summary.json plus ``command_s`` (the whole command's wall time), or ``error``
    with its stderr's tail (a long benchmark goes on past one failed run)."""
    ran = H.disttrain("rl", *args, root=root, name=name, timeout=timeout_s, check=False)
    error = ran.error or ("" if (root / name / "summary.json").exists() else "no summary.json")
    if error:
        print(f"  {name}: FAILED ({error}); stderr tail:\n{ran.stderr[-2000:]}", flush=True)
        return {"error": error, "command_s": ran.wall_s, "stderr": ran.stderr[-4000:]}
    s = H.summary(root / name)
    print(f"  {name}: {s['env_steps']:,} env steps in {s['wall_s']:.1f} s, solved {s['solved']}", flush=True)
    return {**s, "command_s": ran.wall_s}


def solve_runs(
    root: Path,
    kind: str,
    seeds: list[int],
    options: list[str],
    baseline: Callable[[int], dict[str, Any]],
    timeout: float,
) -> dict[str, list[dict[str, Any]]]:
    """Per seed, ``disttrain rl OPTIONS --train.seed S`` and ``baseline(S)`` (its own process), the order
    alternating seed by seed."""
    order = {"disttrain": iter(seeds), "baseline": iter(seeds)}

    def disttrain() -> dict[str, Any]:
        seed = next(order["disttrain"])
        return {"seed": seed, **run_rl(root, f"{kind}-s{seed}", [*options, "--train.seed", str(seed)], timeout)}

    def base() -> dict[str, Any]:
        seed = next(order["baseline"])
        return {"seed": seed, **baseline(seed)}

    return H.side_by_side({"disttrain": disttrain, "baseline": base}, len(seeds))


def to_solve(runs: list[dict[str, Any]], key: str) -> float:
    """Median over seeds of ``key`` for solving, a seed not solved (or failed) counting as never solving: the
    median is finite only if more than half the seeds solved."""
    return statistics.median([float(r[key]) if r.get("solved") else math.inf for r in runs])


def solve_table(title: str, runs: dict[str, list[dict[str, Any]]], keys: tuple[str, ...]) -> dict[str, str]:
    """Print every seed's run of each system; how many each solved."""
    rows = [
        {"system": system, "seed": r["seed"], "solved": "FAILED: " + r["error"] if "error" in r else r["solved"]}
        | {k: r.get(k, "") for k in keys}
        for system, rs in runs.items()
        for r in rs
    ]
    H.table(rows, title)
    return {s: f"{sum(bool(r.get('solved')) for r in rs)}/{len(rs)}" for s, rs in runs.items()}


# -- the single-process baseline ----------------------------------------------------------------------
def baseline_dqn(args: argparse.Namespace) -> dict[str, Any]:
    """CleanRL-style DQN on one CartPole-v1 env in this process, disttrain's defaults and maths (see the module
    docstring); timed from the first env step, set-up excluded."""
    torch.set_num_threads(1)
    d, t, seed = RLConfig(), RLTrainConfig(), args.seed  # the [rl] and [train] defaults
    env, spec = gym.make(d.env_id), env_spec(d.env_id)
    net = make_net(spec.obs_dim, spec.n_actions, d.hidden, seed)
    target = copy.deepcopy(net).requires_grad_(False)
    opt = torch.optim.Adam(net.parameters(), lr=d.learning_rate)
    replay = ReplayBuffer(d.capacity_for(image=False), spec.obs_dim, seed=seed)
    folder = NStepFolder(1, d.n_step, d.gamma)
    rng, every, ones = np.random.default_rng(seed), round(d.batch / d.samples_per_step), torch.ones(d.batch)
    counted: deque[float] = deque(maxlen=t.solve_window)
    obs, _ = env.reset(seed=seed)
    step = episodes = updates = 0
    ep_ret, ep_eps, new_episode, solved = 0.0, 1.0, True, False
    t0 = time.perf_counter()
    while step < args.cap and not solved:
        eps = max(t.eval_eps, 1.0 + (t.eval_eps - 1.0) * step / (0.2 * args.cap))  # CleanRL's schedule
        if new_episode:
            ep_eps, new_episode = eps, False
        if rng.random() < eps:
            action = int(rng.integers(spec.n_actions))
        else:
            with torch.no_grad():
                action = int(net(torch.from_numpy(obs).float()).argmax())
        nxt, reward, term, trunc, _ = env.step(action)
        folder.add(
            obs[None],
            np.array([action]),
            np.array([reward], np.float64),
            nxt[None],
            np.array([term]),
            np.array([trunc]),
        )
        step, ep_ret, obs = step + 1, ep_ret + float(reward), nxt
        if term or trunc:
            episodes += 1
            if ep_eps <= t.eval_eps:
                counted.append(ep_ret)
            solved = len(counted) == t.solve_window and statistics.fmean(counted) >= t.solve_return
            (obs, _), ep_ret, new_episode = env.reset(), 0.0, True
        if step % every == 0:
            batch, _ = folder.take()
            if batch is not None:
                replay.add(batch)
            if len(replay) >= d.learning_starts:
                dqn_step(net, target, opt, replay.sample(d.batch)[0], ones)
                updates += 1
                if updates % d.target_every == 0:
                    target.load_state_dict(net.state_dict())
    ret = statistics.fmean(counted) if counted else math.nan
    return {"solved": solved, "wall_s": time.perf_counter() - t0, "env_steps": step, "episodes": episodes} | {
        "updates": updates,
        "return": ret,
    }


def run(args: argparse.Namespace) -> dict[str, Any]:
    H.one_thread()

    def baseline(seed: int) -> dict[str, Any]:
        return H.run_baseline(__file__, "dqn", "--seed", str(seed), "--cap", str(args.cap), timeout=args.timeout_s)[0]

    with tempfile.TemporaryDirectory(prefix="disttrain-rl-bench-") as tmp:
        root, runs, rows, rate = Path(tmp), {}, [], {}
        for actors, chunk, inference in THROUGHPUT:
            key = f"a{actors}-c{chunk}-{inference}"
            steps = args.chunk1_steps if chunk == 1 else args.learner_steps if inference == "learner" else args.steps
            job = f"--rl.actors {actors} --rl.chunk {chunk} --rl.inference {inference} --train.max-env-steps {steps}"
            runs[key] = r = run_rl(root, key, [*job.split(), "--train.solve-return", "0"], args.timeout_s)
            rate[key] = math.nan if "error" in r else float(r["env_steps_per_s"])
            rows.append({"actors": actors, "chunk": chunk, "inference": inference, "env steps": r.get("env_steps")})
            rows[-1] |= {"loop s": r.get("wall_s"), "env steps/s": rate[key], "error": r.get("error", "")}
        cap = [] if args.cap == OPTIONS["cap"][0] else ["--train.max-env-steps", str(args.cap)]
        solve = solve_runs(root, "solve", args.seeds, cap, baseline, args.timeout_s)
    H.table(rows, "disttrain rl throughput (fixed-length runs, --train.solve-return 0)")
    ratios = {"chunk50_over_chunk1": rate["a3-c50-actor"] / rate["a3-c1-actor"]}
    ratios["learner_over_actor_inference"] = rate["a3-c50-learner"] / rate["a3-c50-actor"]
    print(", ".join(f"{k.replace('_', ' ')}: {v:.2f}x" for k, v in ratios.items()))
    keys = ("wall_s", "env_steps", "episodes", "updates", "return", "command_s")
    solved = solve_table(f"Solving CartPole-v1 (cap {args.cap:,} steps)", solve, keys)
    med = {s: to_solve(rs, "wall_s") for s, rs in solve.items()}
    command_s = to_solve(solve["disttrain"], "command_s")
    print(f"median loop s to solve (unsolved = inf): {med}, disttrain's whole command {command_s:.1f}; solved {solved}")
    goals = [GOALS["solve"].check(med["disttrain"]), GOALS["ratio"].check(med["disttrain"] / med["baseline"])]
    return {"ratios": ratios, "medians_s": med, "goals": goals, "throughput": runs, "solve": solve}


if __name__ == "__main__":
    H.main(__file__, __doc__, OPTIONS, QUICK, run, baseline=baseline_dqn)
