"""``disttrain rl`` against strong single-process DQN loops on real environments: CartPole-v1, LunarLander-v3
(Box2D) and Atari Pong (ale-py). Each baseline runs as its own process (``--baseline KIND``), written here after
the public example named, with that example's hyperparameters (:data:`EXAMPLES`); each ``disttrain rl`` run is
the real command. Seeds alternate between the two systems.

(a) CartPole-v1 vs CleanRL's ``dqn.py`` (one environment; it stops when the mean return of its last 100 episodes
    is >= 475, or at 500,000 steps); ``disttrain rl`` with its defaults. Compared: the whole command's wall time,
    imports included, median over seeds 0-4, a seed not solved counting as infinite; goals 5/5 solved and <= 1.0x.
(b) LunarLander-v3 vs Stable-Baselines3's DQN with rl-baselines3-zoo's hyperparameters (n_timesteps 1e5: its
    exploration schedule's length), the same wall-time cap for both (``--lunar-budget-s``; disttrain also stops
    at 500,000 env steps). Solved = mean return >= 200 over 100 episodes: disttrain's near-greedy actors' last
    100; the baseline's last 100 training episodes, or 100 greedy episodes every 25,000 steps (the zoo's
    ``EvalCallback``), left out of its time. ``disttrain rl --rl.env-id LunarLander-v3 --train.solve-return 200``.
    Compared: time to solve, median over seeds 0-2; goals 3/3 and <= 0.8x.
(c) ALE/Pong-v5 (84x84 grey, 4 frames stacked, frame skip 4): trained frames/s of the whole loop at the same
    replay ratio (8 samples per agent step), CleanRL ``dqn_atari.py``'s loop in one process vs ``disttrain rl``
    with 2 actors, the same steps, start-up excluded; goal >= 1.5x (out of reach on 2 cores: the ceiling the
    learner's update allows is in benchmarks/HISTORY.md).

    .venv/bin/python -m benchmarks.bench_rl_envs [--quick] [--parts a b c]
"""

from __future__ import annotations

import argparse
import dataclasses
import itertools
import math
import random
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
import torch.nn.functional as F
from torch import nn

from benchmarks import harness as H
from benchmarks.bench_rl import run_rl, solve_runs, solve_table, to_solve

GOALS = {
    "cartpole": H.Goal("CartPole time to solve, disttrain / CleanRL (5/5 solved)", 1.0, higher_is_better=False),
    "lunar": H.Goal("LunarLander time to solve, disttrain / SB3-zoo (3/3 solved)", 0.8, higher_is_better=False),
    "atari": H.Goal("Pong trained frames/s, disttrain / CleanRL", 1.5),
}
OPTIONS = {
    "parts": (["a", "b", "c"], "a: CartPole, b: LunarLander, c: Atari Pong", ("a", "b", "c")),
    "cartpole_seeds": ([0, 1, 2, 3, 4], "(a) seeds"),
    "cartpole_cap": (500_000, "(a) env steps before giving up (both systems; (b): disttrain's)"),
    "lunar_seeds": ([0, 1, 2], "(b) seeds"),
    **H.options(timeout_s=900.0, seed=0),
    "lunar_cap": (100_000, "(b) the baseline's n_timesteps (its exploration schedule's length)"),
    "lunar_budget_s": (300.0, "(b) the same wall-time cap for both"),
    "atari_steps": (4_000, "(c) agent steps (learning starts at 1,000)"),
}
QUICK = {"cartpole_seeds": [0], "cartpole_cap": 20_000, "lunar_seeds": [0], "lunar_cap": 3_000} | {
    "lunar_budget_s": 15.0,
    "atari_steps": 1_300,
    "timeout_s": 300.0,
}
ATARI_STARTS, LUNAR_EVAL_EVERY = 1_000, 25_000  # (c) as CleanRL's learning_starts; (b) the zoo's eval_freq


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
    """One public example's DQN: its environment, network (for observations of ``shape``) and hyperparameters.
    Epsilon falls linearly from 1 to ``eps_end`` over the first ``explore`` of the schedule's steps; every
    ``train_every`` env steps after ``starts``, ``updates`` updates of ``batch`` from a replay of ``buffer``
    (target: reward + 0.99 x the target network's max); the target copied every ``target_every`` env steps;
    ``clip``: SB3's smooth L1 loss and gradient-norm clip (0: CleanRL's MSE); solved: the mean return of the last
    100 episodes >= ``solve``."""

    env: str
    net: Callable[[], nn.Module]
    shape: tuple[int, ...]
    lr: float
    explore: tuple[float, float]  # (fraction, eps_end)
    train: tuple[int, int, int, int]  # (starts, every, updates, batch)
    target_every: int
    buffer: int
    clip: float
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


def baseline(args: argparse.Namespace) -> dict[str, Any]:
    """``--baseline KIND``: one baseline, in this process of its own."""
    ex = EXAMPLES[args.baseline]
    if args.baseline == "cartpole":
        return dqn(ex, args.seed, args.cartpole_cap, args.cartpole_cap)
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


def atari_part(root: Path, args: argparse.Namespace) -> dict[str, Any]:
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
    H.table(
        rows, "(c) Atari ALE/Pong-v5 frames/s (trained: frames the updates have caught up with, 8 samples per step)"
    )
    ratio = rows[1]["trained frames/s"] / rows[0]["trained frames/s"]
    return {"disttrain": dt, "baseline": base, "goal": GOALS["atari"].check(ratio)}


def solve_part(root: Path, args: argparse.Namespace, kind: str, seeds: list[int], options: str) -> dict[str, Any]:
    """(a) or (b): per seed, both systems; whole-command times (the baseline's less its evaluations)."""
    runs = solve_runs(root, kind, seeds, options.split(), lambda s: run_baseline(kind, s, args), args.timeout_s)
    for r in runs["disttrain"]:
        r["counted_s"] = r["command_s"]
        if kind == "lunar":  # the same wall-time cap as the baseline's
            r["solved"] = bool(r.get("solved")) and r["command_s"] <= args.lunar_budget_s
    title = {"cartpole": "(a) CartPole-v1: disttrain rl vs CleanRL dqn.py, whole command"}
    title["lunar"] = "(b) LunarLander-v3: disttrain rl vs SB3-zoo DQN, time to solve (the same wall-time cap)"
    solved = solve_table(title[kind], runs, ("env_steps", "return", "counted_s"))
    med = {s: to_solve(rs, "counted_s") for s, rs in runs.items()}
    print(f"  medians (whole command less any evaluation, unsolved = inf): {med}; solved {solved}", flush=True)
    # a baseline that solved at most half its seeds has no finite median: no ratio; nor when disttrain missed one
    all_solved = solved["disttrain"] == f"{len(seeds)}/{len(seeds)}"
    ratio = med["disttrain"] / med["baseline"] if math.isfinite(med["baseline"]) and all_solved else math.nan
    return {"runs": runs, "medians_s": med, "solved": solved, "goal": GOALS[kind].check(ratio)}


def run(args: argparse.Namespace) -> dict[str, Any]:
    H.one_thread()
    results: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="disttrain-rl-envs-") as tmp:
        root = Path(tmp)
        if "a" in args.parts:
            cap = "" if args.cartpole_cap == 500_000 else f"--train.max-env-steps {args.cartpole_cap}"
            results["cartpole"] = solve_part(root, args, "cartpole", args.cartpole_seeds, cap)
        if "b" in args.parts:
            ll = f"--rl.env-id LunarLander-v3 --train.solve-return 200 --train.max-env-steps {args.cartpole_cap}"
            results["lunar"] = solve_part(root, args, "lunar", args.lunar_seeds, ll)
        if "c" in args.parts:
            results["atari"] = atari_part(root, args)
    return {"goals": [part.pop("goal") for part in results.values()], **results}


if __name__ == "__main__":
    H.main(__file__, __doc__, OPTIONS, QUICK, run, baseline=baseline)
