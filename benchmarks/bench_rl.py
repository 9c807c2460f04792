"""``disttrain rl`` (DQN, 1 learner + N actor processes over RPC) against single-process DQN loops (``--parts``,
default all five). Every ``disttrain rl`` run is the real command, its figures from its summary.json; every baseline
runs as its own process (``--baseline KIND``); seeds alternate between the two systems.

``throughput``: env steps/s on CartPole-v1 by actors (1-4; chunk 50, inference on the actors), fixed-length runs;
    with 3 actors, ``--rl.chunk 1`` (one RPC per env step) and ``--rl.inference learner`` (SEED RL) against chunk 50.
``solve``: time to solve CartPole (mean return of the last 100 counted episodes >= 475) with the defaults against
    :func:`baseline_dqn`, a plain loop with disttrain's maths and defaults and CleanRL's exploration schedule; both
    count only episodes begun at epsilon <= 0.02 and time the training loop only; a seed not solved counts as
    infinite in the medians. Goals: disttrain's median <= 120 s and <= 0.7x the baseline's.
``a``, ``b``, ``c``: against strong loops written here after public examples, with their hyperparameters
    (:data:`EXAMPLES`): (a) CartPole-v1 vs CleanRL ``dqn.py``, whole-command wall times, goals 5/5 solved and
    <= 1.0x; (b) LunarLander-v3 vs SB3-zoo's DQN under the same wall-time cap (``--lunar-budget-s``), solved = mean
    return >= 200 over 100 episodes (the baseline's greedy evaluations every 25,000 steps, the zoo's
    ``EvalCallback``, left out of its time), goals 3/3 and <= 0.8x; (c) ALE/Pong-v5 trained frames/s at the same
    replay ratio, CleanRL ``dqn_atari.py``'s loop vs 2 actors, start-up excluded, goal >= 1.5x.
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import itertools
import math
import random
import statistics
import time
from collections import deque
from collections.abc import Callable
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

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
    "cartpole": H.Goal("CartPole time to solve, disttrain / CleanRL (5/5 solved)", 1.0, higher_is_better=False),
    "lunar": H.Goal("LunarLander time to solve, disttrain / SB3-zoo (3/3 solved)", 0.8, higher_is_better=False),
    "atari": H.Goal("Pong trained frames/s, disttrain / CleanRL", 1.5),
}
PARTS = ("throughput", "solve", "a", "b", "c")
OPTIONS = {
    "parts": (list(PARTS), "throughput, solve (CartPole), a: CartPole, b: LunarLander, c: Atari Pong", PARTS),
    **H.options(steps=40_000, seeds=[0, 1, 2], timeout_s=1200.0, seed=0),  # steps: of the throughput runs
    "chunk1_steps": (5_000, "throughput: env steps of the --rl.chunk 1 run (one RPC per step)"),
    "learner_steps": (10_000, "throughput: env steps of the --rl.inference learner run (one RPC per step)"),
    "cap": (500_000, "solve, a, b: CartPole's env steps before giving up (both systems; b: disttrain's)"),
    "cartpole_seeds": ([0, 1, 2, 3, 4], "(a) seeds"),
    "lunar_seeds": ([0, 1, 2], "(b) seeds"),
    "lunar_cap": (100_000, "(b) the baseline's n_timesteps (its exploration schedule's length)"),
    "lunar_budget_s": (300.0, "(b) the same wall-time cap for both"),
    "atari_steps": (4_000, "(c) agent steps (learning starts at 1,000)"),
}
QUICK = {"steps": 5_000, "chunk1_steps": 1_000, "learner_steps": 2_000, "cap": 20_000, "seeds": [0]}
QUICK |= {"cartpole_seeds": [0], "lunar_seeds": [0], "lunar_cap": 3_000, "lunar_budget_s": 15.0}
QUICK |= {"atari_steps": 1_300, "timeout_s": 600.0}
THROUGHPUT = [(1, 50, "actor"), (2, 50, "actor"), (3, 50, "actor"), (4, 50, "actor"), (3, 1, "actor")]
THROUGHPUT += [(3, 50, "learner")]  # (actors, chunk, inference)
ATARI_STARTS, LUNAR_EVAL_EVERY = 1_000, 25_000  # (c) as CleanRL's learning_starts; (b) the zoo's eval_freq


# -- disttrain rl and the rounds ----------------------------------------------------------------------------
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


# -- the baselines (each in its own process) ----------------------------------------------------------
def mlp(*sizes: int) -> Callable[[], nn.Module]:
    def build() -> nn.Module:
        layers: list[nn.Module] = []
        for a, b in itertools.pairwise(sizes):
            layers += [nn.Linear(a, b), nn.ReLU()]
        return nn.Sequential(*layers[:-1])

    return build


def nature_cnn() -> nn.Module:
    convs = [nn.Conv2d(4, 32, 8, stride=4), nn.Conv2d(32, 64, 4, stride=2), nn.Conv2d(64, 64, 3, stride=1)]
    return nn.Sequential(*(m for c in convs for m in (c, nn.ReLU())), nn.Flatten(), mlp(3136, 512, 6)())


@dataclasses.dataclass(frozen=True)
class Example:
    """One public example's DQN: epsilon falls linearly from 1 to ``eps_end`` over the first ``fraction`` of the
    schedule; every ``every`` env steps after ``starts``, ``updates`` updates of ``batch`` (target: reward + 0.99 x
    the target network's max); solved: the mean return of the last 100 episodes >= ``solve``."""

    env: str
    net: Callable[[], nn.Module]
    shape: tuple[int, ...]  # of an observation
    lr: float
    explore: tuple[float, float]  # (fraction, eps_end)
    train: tuple[int, int, int, int]  # (starts, every, updates, batch)
    target_every: int  # env steps between copies into the target network
    buffer: int  # replay size
    clip: float  # SB3's smooth L1 loss and gradient-norm clip (0: CleanRL's MSE)
    solve: float


EXAMPLES = {  # CleanRL dqn.py, rl-baselines3-zoo's DQN (gradient_steps -1: 4 every 4 env steps), dqn_atari.py
    "cartpole": Example(
        "CartPole-v1", mlp(4, 120, 84, 2), (4,), 2.5e-4, (0.5, 0.05), (10_000, 10, 1, 128), 500, 10_000, 0, 475
    ),
    "lunar": Example(
        "LunarLander-v3", mlp(8, 256, 256, 4), (8,), 6.3e-4, (0.12, 0.1), (0, 4, 4, 128), 250, 50_000, 10, 200
    ),
    "atari": Example(
        "ALE/Pong-v5", nature_cnn, (4, 84, 84), 1e-4, (0.1, 0.01), (ATARI_STARTS, 4, 1, 32), 1000, 10_000, 0, math.inf
    ),
}


class Ring:
    """The baselines' replay (SB3's ReplayBuffer as CleanRL and SB3 use it): numpy arrays, uniform samples."""

    def __init__(self, size: int, shape: tuple[int, ...], dtype: Any) -> None:
        self.size, self.pos, self.full = size, 0, 0
        self.obs, self.nxt = np.zeros((size, *shape), dtype), np.zeros((size, *shape), dtype)
        self.act, self.rew, self.done = np.zeros(size, np.int64), np.zeros(size, np.float32), np.zeros(size, np.float32)

    def add(self, obs: Any, nxt: Any, action: int, reward: float, term: bool) -> None:
        p = self.pos
        self.obs[p], self.nxt[p], self.act[p], self.rew[p], self.done[p] = obs, nxt, action, reward, float(term)
        self.pos, self.full = (p + 1) % self.size, min(self.full + 1, self.size)

    def sample(self, n: int) -> tuple[torch.Tensor, ...]:
        i = np.random.randint(0, self.full, n)
        return tuple(torch.from_numpy(a[i]) for a in (self.obs, self.nxt, self.act, self.rew, self.done))


def make_env(name: str) -> Any:
    if not name.startswith("ALE/"):
        return gym.make(name)
    import ale_py

    gym.register_envs(ale_py)
    env = gym.make(name, frameskip=1)
    env = gym.wrappers.AtariPreprocessing(env, noop_max=30, frame_skip=4, terminal_on_life_loss=False)
    return gym.wrappers.FrameStackObservation(env, 4)


def q_values(net: nn.Module, obs: Any) -> torch.Tensor:
    x = torch.as_tensor(obs)
    return net(x.float() / 255 if x.dtype == torch.uint8 else x)


def greedy_eval(env: Any, net: nn.Module, seed: int, episodes: int = 100) -> float:
    """The mean return of ``episodes`` greedy episodes."""
    returns = []
    for k in range(episodes):
        obs, done, ret = env.reset(seed=10_000 + seed * 100 + k)[0], False, 0.0
        while not done:
            with torch.no_grad():
                obs, r, term, trunc, _ = env.step(int(q_values(net, obs[None]).argmax()))
            ret, done = ret + float(r), term or trunc
        returns.append(ret)
    return statistics.fmean(returns)


def dqn(
    ex: Example, seed: int, schedule: int, cap: float, budget_s: float = math.inf, evals_every: int = 0
) -> dict[str, Any]:
    """``ex``'s loop (exploring over ``schedule`` steps) until solved, at ``cap`` env steps or out of ``budget_s``
    seconds (greedy evaluations every ``evals_every`` steps not counted); the loop's time."""
    torch.set_num_threads(1)
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)
    env, net, target = make_env(ex.env), ex.net(), ex.net()
    target.load_state_dict(net.state_dict())
    opt = torch.optim.Adam(net.parameters(), lr=ex.lr)
    rb = Ring(ex.buffer, ex.shape, np.uint8 if len(ex.shape) == 3 else np.float32)
    returns: deque[float] = deque(maxlen=100)
    obs, _ = env.reset(seed=seed)
    env.action_space.seed(seed)
    (fraction, eps_end), (starts, every, per_train, batch) = ex.explore, ex.train
    ep_ret, solved, ret, step, updates, eval_s, evals = 0.0, False, math.nan, 0, 0, 0.0, []
    t0 = time.perf_counter()
    while not solved and step < cap and time.perf_counter() - t0 - eval_s < budget_s:
        step += 1
        eps = max(eps_end, 1.0 + (eps_end - 1.0) * (step - 1) / (fraction * schedule))
        if random.random() < eps:
            action = env.action_space.sample()
        else:
            with torch.no_grad():
                action = int(q_values(net, obs[None]).argmax())
        nxt, r, term, trunc, _ = env.step(action)
        rb.add(obs, nxt, action, float(r), term)
        obs, ep_ret = nxt, ep_ret + float(r)
        if term or trunc:
            returns.append(ep_ret)
            (obs, _), ep_ret = env.reset(), 0.0
            solved = len(returns) == 100 and (ret := statistics.fmean(returns)) >= ex.solve
        if step % ex.target_every == 0:  # (before training: no copy comes before learning starts)
            target.load_state_dict(net.state_dict())
        if step > starts and step % every == 0:
            for _ in range(per_train):
                update(ex, net, target, opt, rb.sample(batch))
            updates += per_train
        if evals_every and step % evals_every == 0 and not solved:
            e0 = time.perf_counter()
            ret = greedy_eval(make_env(ex.env), net, seed)  # the zoo's verdict: greedy episodes of the policy
            eval_s += time.perf_counter() - e0
            evals.append([step, round(ret, 1)])
            solved = ret >= ex.solve
    wall = time.perf_counter() - t0 - eval_s
    out = {"solved": solved, "env_steps": step, "return": ret, "eval_s": eval_s, "wall_s": wall, "updates": updates}
    return out | {"evals": evals}


def update(ex: Example, net: nn.Module, target: nn.Module, opt: Any, batch: tuple[torch.Tensor, ...]) -> None:
    o, n, a, rew, done = batch
    with torch.no_grad():
        y = rew + 0.99 * q_values(target, n).max(1).values * (1 - done)
    q = q_values(net, o).gather(1, a[:, None]).squeeze(1)
    loss = F.smooth_l1_loss(q, y) if ex.clip else F.mse_loss(y, q)
    opt.zero_grad()
    loss.backward()
    if ex.clip:
        nn.utils.clip_grad_norm_(net.parameters(), ex.clip)
    opt.step()


def baseline_dqn(args: argparse.Namespace) -> dict[str, Any]:
    """DQN on one CartPole-v1 env in this process with disttrain's defaults and maths: its network, Adam, 3-step
    returns (``NStepFolder``), ``ReplayBuffer``, ``dqn_step``; CleanRL's exploration schedule (epsilon 1.0 to 0.02
    over the first 20% of the cap). Timed from the first env step."""
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
            obs[None], np.array([action]), np.array([float(reward)]), nxt[None], np.array([term]), np.array([trunc])
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
    out = {"solved": solved, "wall_s": time.perf_counter() - t0, "env_steps": step, "episodes": episodes}
    return out | {"updates": updates, "return": ret, "eval_s": 0.0}


def baseline(args: argparse.Namespace) -> dict[str, Any]:
    """``--baseline KIND``: one baseline, in this process of its own."""
    if args.baseline == "dqn":
        return baseline_dqn(args)
    ex = EXAMPLES[args.baseline]
    if args.baseline == "cartpole":
        return dqn(ex, args.seed, args.cap, args.cap)
    if args.baseline == "lunar":
        return dqn(ex, args.seed, args.lunar_cap, math.inf, args.lunar_budget_s, LUNAR_EVAL_EVERY)
    return dqn(ex, args.seed, 1_000_000, args.atari_steps)


def run_baseline(kind: str, seed: int, args: argparse.Namespace) -> dict[str, Any]:
    """One baseline as its own process: its result plus ``command_s`` (the process's whole wall time) and
    ``counted_s`` (less its evaluations), or the error (a long benchmark goes on past one failed run)."""
    try:
        r, ran = H.run_baseline(__file__, kind, *args.argv, "--seed", str(seed), timeout=args.timeout_s)
    except SystemExit as e:
        print(f"  baseline {kind} seed {seed}: FAILED\n{str(e)[-2000:]}", flush=True)
        return {"error": str(e)[-3000:], "command_s": math.nan}
    r |= {"command_s": ran.wall_s, "counted_s": ran.wall_s - r["eval_s"]}
    print(f"  baseline {kind} seed {seed}: " + ", ".join(f"{k} {v}" for k, v in r.items() if k != "evals"), flush=True)
    return r


def atari_part(args: argparse.Namespace, root: Path) -> dict[str, Any]:
    job = "--rl.env-id ALE/Pong-v5 --rl.actors 2 --rl.batch 32 --rl.replay-ratio 8 --rl.replay-capacity 10000"
    job += f" --rl.learning-starts {ATARI_STARTS} --train.max-env-steps {args.atari_steps} --train.solve-return 0"
    base = run_baseline("atari", 0, args)
    dt = {k: v for k, v in run_rl(root, "atari", job.split(), args.timeout_s).items() if k != "config"}
    rows = []
    for name, r in (("one process (CleanRL loop)", base), ("disttrain rl, 2 actors", dt)):
        if "error" not in r:  # (disttrain stops at the step cap with up to a chunk per actor not yet trained on)
            r["frames_per_s"] = 4 * r["env_steps"] / r["wall_s"]
            r["trained_frames_per_s"] = 4 * min(r["env_steps"], ATARI_STARTS + 4 * r["updates"]) / r["wall_s"]
        keys = {"agent steps": "env_steps", "updates": "updates", "loop s": "wall_s", "frames/s": "frames_per_s"}
        rows.append({"system": name, **{k: r.get(v, "") for k, v in keys.items()}})
        rows[-1]["trained frames/s"] = r.get("trained_frames_per_s", math.nan)
    H.table(rows, "(c) Atari ALE/Pong-v5 frames/s (trained: frames the updates have caught up with)")
    ratio = rows[1]["trained frames/s"] / rows[0]["trained frames/s"]
    return {"disttrain": dt, "baseline": base, "goals": [GOALS["atari"].check(ratio)]}


TITLES = {
    "dqn": "Solving CartPole-v1 (cap {cap:,} steps)",
    "cartpole": "(a) CartPole-v1: disttrain rl vs CleanRL dqn.py, whole command",
    "lunar": "(b) LunarLander-v3: disttrain rl vs SB3-zoo DQN, time to solve (the same wall-time cap)",
}


def solve_part(args: argparse.Namespace, root: Path, kind: str, seeds: list[int], options: list[str]) -> dict[str, Any]:
    """Per seed, ``disttrain rl OPTIONS --train.seed S`` and the baseline ``kind`` (its own process), the order
    alternating seed by seed. Time to solve: ``dqn``, the loops'; (a), (b), whole commands (less evaluations)."""
    todo = {"disttrain": iter(seeds), "baseline": iter(seeds)}

    def disttrain() -> dict[str, Any]:
        seed = next(todo["disttrain"])
        r = run_rl(root, f"{kind}-s{seed}", [*options, "--train.seed", str(seed)], args.timeout_s)
        if kind == "lunar":  # the same wall-time cap as the baseline's
            r["solved"] = bool(r.get("solved")) and r["command_s"] <= args.lunar_budget_s
        return {"seed": seed, "counted_s": r["command_s"], **r}

    def baseline() -> dict[str, Any]:
        seed = next(todo["baseline"])
        return {"seed": seed, **run_baseline(kind, seed, args)}

    runs = H.side_by_side({"disttrain": disttrain, "baseline": baseline}, len(seeds))
    loop = kind == "dqn"
    keys = ("wall_s", "episodes", "updates", "command_s") if loop else ("counted_s",)
    solved = solve_table(TITLES[kind].format(cap=args.cap), runs, ("env_steps", "return", *keys))
    med = {s: to_solve(rs, "wall_s" if loop else "counted_s") for s, rs in runs.items()}
    print(f"  median s to solve ({'loop' if loop else 'less evaluations'}; unsolved = inf): {med}; solved {solved}")
    if loop:
        print(f"  disttrain's whole command: {to_solve(runs['disttrain'], 'command_s'):.1f} s", flush=True)
        goals = [GOALS["solve"].check(med["disttrain"]), GOALS["ratio"].check(med["disttrain"] / med["baseline"])]
    else:  # a baseline that solved at most half its seeds has no finite median: no ratio; nor when disttrain missed one
        all_solved = solved["disttrain"] == f"{len(seeds)}/{len(seeds)}"
        ratio = med["disttrain"] / med["baseline"] if math.isfinite(med["baseline"]) and all_solved else math.nan
        goals = [GOALS[kind].check(ratio)]
    return {"runs": runs, "medians_s": med, "solved": solved, "goals": goals}


def throughput(args: argparse.Namespace, root: Path) -> dict[str, Any]:
    """Fixed-length runs by actors, chunk and where inference runs: env steps/s."""
    runs, rows, rate = {}, [], {}
    for actors, chunk, inference in THROUGHPUT:
        key = f"a{actors}-c{chunk}-{inference}"
        steps = args.chunk1_steps if chunk == 1 else args.learner_steps if inference == "learner" else args.steps
        job = f"--rl.actors {actors} --rl.chunk {chunk} --rl.inference {inference} --train.max-env-steps {steps}"
        runs[key] = r = run_rl(root, key, [*job.split(), "--train.solve-return", "0"], args.timeout_s)
        rate[key] = math.nan if "error" in r else float(r["env_steps_per_s"])
        rows.append({"actors": actors, "chunk": chunk, "inference": inference, "env steps": r.get("env_steps")})
        rows[-1] |= {"loop s": r.get("wall_s"), "env steps/s": rate[key], "error": r.get("error", "")}
    H.table(rows, "disttrain rl throughput (fixed-length runs, --train.solve-return 0)")
    ratios = {"chunk50_over_chunk1": rate["a3-c50-actor"] / rate["a3-c1-actor"]}
    ratios["learner_over_actor_inference"] = rate["a3-c50-learner"] / rate["a3-c50-actor"]
    print(", ".join(f"{k.replace('_', ' ')}: {v:.2f}x" for k, v in ratios.items()))
    return {"ratios": ratios, "runs": runs}


def run(args: argparse.Namespace) -> dict[str, Any]:
    H.one_thread()
    cap = [] if args.cap == OPTIONS["cap"][0] else ["--train.max-env-steps", str(args.cap)]
    lunar = f"--rl.env-id LunarLander-v3 --train.solve-return 200 --train.max-env-steps {args.cap}".split()
    runs = {
        "throughput": H.in_tmp(throughput),
        "solve": H.in_tmp(lambda args, root: solve_part(args, root, "dqn", args.seeds, cap)),
        "a": H.in_tmp(lambda args, root: solve_part(args, root, "cartpole", args.cartpole_seeds, cap)),
        "b": H.in_tmp(lambda args, root: solve_part(args, root, "lunar", args.lunar_seeds, lunar)),
        "c": H.in_tmp(atari_part),
    }
    return H.parts(args, __file__, runs)


if __name__ == "__main__":
    H.main(__file__, __doc__, OPTIONS, QUICK, run, baseline=baseline)
