"""``disttrain rl`` against strong single-process DQN loops on real environments: CartPole-v1, LunarLander-v3
(Box2D) and Atari Pong (ale-py). Each baseline runs as its own process (``python -m benchmarks.bench_rl_envs
--baseline KIND``), written here after the public example named, with that example's hyperparameters; each
``disttrain rl`` run is the real command. Seeds are interleaved (the order alternates seed by seed).

(a) CartPole-v1: CleanRL's ``dqn.py`` with CleanRL's own CartPole hyperparameters: Q-network 4-120-84-2 (ReLU),
    Adam lr 2.5e-4, buffer 10,000, gamma 0.99, tau 1.0 (hard copy), target_network_frequency 500,
    batch 128, start_e 1, end_e 0.05, exploration_fraction 0.5 (epsilon reaches 0.05 after 250,000 steps),
    learning_starts 10,000, train_frequency 10, total_timesteps 500,000, MSE TD loss, one environment. It stops
    when solved (mean return of its last 100 episodes >= 475) or at 500,000 steps. ``disttrain rl`` runs with its
    defaults (``--train.seed S``: 3 actors, solved = mean of the last 100 near-greedy episodes >= 475).
    Compared: the whole command's wall time (process start to exit, imports included, both systems), median
    over seeds 0-4 (a seed not solved counts as infinite); goals 5/5 seeds solved and ratio <= 1.0.
(b) LunarLander-v3: Stable-Baselines3 DQN with rl-baselines3-zoo's LunarLander hyperparameters: n_timesteps
    1e5, lr 6.3e-4, batch 128, buffer 50,000, learning_starts 0, gamma 0.99, target_update_interval 250 (env
    steps), train_freq 4, gradient_steps -1 (4 gradient steps every 4 env steps), exploration_fraction 0.12 (of
    its 1e5 steps: epsilon reaches 0.1 at step 12,000), exploration_final_eps 0.1, net [256, 256]; SB3's DQN
    maths (Huber loss, max target, grad norm 10, Adam). The zoo's published figure for this configuration is
    154 +- 79 (one run, deterministic evaluation after 1e5 steps); this baseline lands there (1/3 seeds >= 200
    at 1e5 steps). The same cap for both: a budget of ``lunar_budget_s`` seconds of wall time (300 s: what the
    baseline's own 1e5 steps take here), and disttrain also stops at 500,000 env steps. Solved = mean return
    >= 200 over 100 episodes: disttrain's near-greedy actors' last 100; the baseline's last 100 training
    episodes (epsilon 0.1) or 100 greedy evaluation episodes, run every 25,000 steps (the zoo's eval_freq; the
    one at 1e5 steps is the zoo's own verdict) and left out of its time, which is its whole command minus
    its evaluations. ``disttrain rl --rl.env-id LunarLander-v3 --train.solve-return 200`` with its defaults.
    Compared: time to solve (the whole command), median over seeds 0-2, a seed not solved in the budget
    counting as infinite; goals 3/3 and ratio <= 0.8.
(c) Atari (ALE/Pong-v5, 84x84 grey, 4 frames stacked, frame skip 4): frames/s (agent steps x 4) of the whole
    loop, acting and training, at the same replay ratio: CleanRL ``dqn_atari.py``'s loop (Nature CNN, batch 32
    every 4 agent steps, lr 1e-4, target every 1,000 steps, uint8 replay) in one process vs ``disttrain rl`` with 2
    actors (``--rl.batch 32 --rl.replay-ratio 8``); both learn from step 1,000 and run the same number of steps;
    the loop time, start-up excluded. Goal: ratio >= 1.5. Beside it, the ceiling 2 cores allow (``atari_ceiling``:
    the single process's update and agent step against the learner's update and an actor's step, timed here).

    .venv/bin/python -m benchmarks.bench_rl_envs [--quick] [--parts a b c] [--run-root DIR]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import random
import statistics
import subprocess
import sys
import tempfile
import time
from collections import deque
from pathlib import Path
from typing import Any

from benchmarks import _common as C
from benchmarks.bench_rl import run_rl

GOALS = {"cartpole_ratio": 1.0, "lunar_ratio": 0.8, "atari_fps_ratio": 1.5}


@dataclasses.dataclass
class Plan:
    """How long each part runs: the full benchmark, or ``--quick`` (a smoke run)."""

    cartpole_seeds: tuple[int, ...] = (0, 1, 2, 3, 4)
    cartpole_cap: int = 500_000
    lunar_seeds: tuple[int, ...] = (0, 1, 2)
    lunar_cap: int = 100_000  # the baseline's n_timesteps (its exploration schedule's length)
    lunar_disttrain_cap: int = 500_000
    lunar_budget_s: float = 300.0  # the same wall-time cap for both
    lunar_eval_every: int = 25_000  # the baseline's greedy evaluations (the zoo's eval_freq)
    atari_steps: int = 4_000
    atari_starts: int = 1_000
    timeout_s: float = 900.0


QUICK = Plan(
    cartpole_seeds=(0,),
    cartpole_cap=20_000,
    lunar_seeds=(0,),
    lunar_cap=3_000,
    lunar_disttrain_cap=5_000,
    lunar_budget_s=60.0,
    lunar_eval_every=2_000,
    atari_steps=1_300,
    atari_starts=1_000,
    timeout_s=300.0,
)


# -- the baselines (each in its own process) ----------------------------------------------------------
class Ring:
    """The baselines' replay (SB3's ReplayBuffer as CleanRL and SB3 use it): numpy arrays, uniform samples."""

    def __init__(self, size: int, shape: tuple[int, ...], dtype: Any) -> None:
        import numpy as np

        self.np, self.size, self.pos, self.full = np, size, 0, 0
        self.obs, self.nxt = np.zeros((size, *shape), dtype), np.zeros((size, *shape), dtype)
        self.act, self.rew, self.done = np.zeros(size, np.int64), np.zeros(size, np.float32), np.zeros(size, np.float32)

    def add(self, obs: Any, nxt: Any, action: int, reward: float, term: bool) -> None:
        p = self.pos
        self.obs[p], self.nxt[p], self.act[p], self.rew[p], self.done[p] = obs, nxt, action, reward, float(term)
        self.pos, self.full = (p + 1) % self.size, min(self.full + 1, self.size)

    def sample(self, n: int) -> tuple[Any, ...]:
        import torch

        i = self.np.random.randint(0, self.full, n)
        return tuple(torch.from_numpy(a[i]) for a in (self.obs, self.nxt, self.act, self.rew, self.done))


def _setup(seed: int) -> Any:
    import numpy as np
    import torch

    torch.set_num_threads(1)
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)
    return np, torch


def cleanrl_cartpole(seed: int, cap: int) -> dict[str, Any]:
    """CleanRL dqn.py on CartPole-v1 (hyperparameters in the module docstring), stopping when solved."""
    np, torch = _setup(seed)
    import gymnasium as gym
    import torch.nn.functional as F
    from torch import nn

    env = gym.make("CartPole-v1")
    net = nn.Sequential(nn.Linear(4, 120), nn.ReLU(), nn.Linear(120, 84), nn.ReLU(), nn.Linear(84, 2))
    target = nn.Sequential(nn.Linear(4, 120), nn.ReLU(), nn.Linear(120, 84), nn.ReLU(), nn.Linear(84, 2))
    target.load_state_dict(net.state_dict())
    opt = torch.optim.Adam(net.parameters(), lr=2.5e-4)
    batch, starts, freq, tnf, gamma = 128, 10_000, 10, 500, 0.99
    rb = Ring(10_000, (4,), np.float32)
    returns: deque[float] = deque(maxlen=100)
    obs, _ = env.reset(seed=seed)
    env.action_space.seed(seed)
    ep_ret, solved, step = 0.0, False, 0
    for step in range(1, cap + 1):
        eps = max(0.05, 1.0 + (0.05 - 1.0) * (step - 1) / (0.5 * cap))
        greedy = random.random() >= eps
        action = int(net(torch.as_tensor(obs)).argmax().item()) if greedy else env.action_space.sample()
        nxt, r, term, trunc, _ = env.step(action)
        rb.add(obs, nxt, action, float(r), term)
        ep_ret += float(r)
        if term or trunc:
            returns.append(ep_ret)
            (obs, _), ep_ret = env.reset(), 0.0
            if len(returns) == 100 and statistics.fmean(returns) >= 475:
                solved = True
                break
        else:
            obs = nxt
        if step > starts and step % freq == 0:
            o, n, a, rew, done = rb.sample(batch)
            with torch.no_grad():
                y = rew + gamma * target(n).max(1).values * (1 - done)
            loss = F.mse_loss(y, net(o).gather(1, a[:, None]).squeeze(1))
            opt.zero_grad()
            loss.backward()
            opt.step()
            if step % tnf == 0:
                target.load_state_dict(net.state_dict())
    return {"solved": solved, "env_steps": step, "return": statistics.fmean(returns) if returns else math.nan}


def sb3_lunar(seed: int, plan: Plan) -> dict[str, Any]:
    """SB3 DQN with rl-baselines3-zoo's LunarLander-v3 hyperparameters (module docstring), until solved or
    out of ``plan.lunar_budget_s`` seconds (evaluations not counted)."""
    np, torch = _setup(seed)
    import gymnasium as gym
    import torch.nn.functional as F
    from torch import nn

    def q_net() -> nn.Module:
        return nn.Sequential(nn.Linear(8, 256), nn.ReLU(), nn.Linear(256, 256), nn.ReLU(), nn.Linear(256, 4))

    t0 = time.perf_counter()
    env, eval_env = gym.make("LunarLander-v3"), gym.make("LunarLander-v3")
    net, target = q_net(), q_net()
    target.load_state_dict(net.state_dict())
    opt = torch.optim.Adam(net.parameters(), lr=6.3e-4)
    rb = Ring(50_000, (8,), np.float32)
    returns: deque[float] = deque(maxlen=100)
    obs, _ = env.reset(seed=seed)
    env.action_space.seed(seed)
    ep_ret, solved, step, eval_s, evals, ret = 0.0, False, 0, 0.0, [], math.nan
    while not solved and time.perf_counter() - t0 - eval_s < plan.lunar_budget_s:
        step += 1
        eps = max(0.1, 1.0 + (0.1 - 1.0) * (step - 1) / (0.12 * plan.lunar_cap))
        action = env.action_space.sample() if random.random() < eps else greedy_action(net, obs)
        nxt, r, term, trunc, _ = env.step(action)
        rb.add(obs, nxt, action, float(r), term)
        ep_ret += float(r)
        if term or trunc:
            returns.append(ep_ret)
            (obs, _), ep_ret = env.reset(), 0.0
            if len(returns) == 100 and statistics.fmean(returns) >= 200:
                solved, ret = True, statistics.fmean(returns)
        else:
            obs = nxt
        if step % 250 == 0:
            target.load_state_dict(net.state_dict())
        if step % 4 == 0:
            for _ in range(4):  # gradient_steps -1: as many as env steps since the last train
                o, n, a, rew, done = rb.sample(128)
                with torch.no_grad():
                    y = rew + (1 - done) * 0.99 * target(n).max(1).values
                loss = F.smooth_l1_loss(net(o).gather(1, a[:, None]).squeeze(1), y)
                opt.zero_grad()
                loss.backward()
                nn.utils.clip_grad_norm_(net.parameters(), 10)
                opt.step()
        if step % plan.lunar_eval_every == 0 and not solved:
            e0 = time.perf_counter()
            ret = greedy_eval(eval_env, net, seed)  # the zoo's verdict: greedy episodes of the trained policy
            eval_s += time.perf_counter() - e0
            evals.append([step, round(ret, 1)])
            solved = ret >= 200
    train_s = time.perf_counter() - t0 - eval_s
    at_1e5 = next((r for s, r in evals if s == plan.lunar_cap), None)
    return {"solved": solved, "env_steps": step, "return": ret, "eval_s": eval_s, "train_s": train_s} | {
        "return_at_n_timesteps": at_1e5,
        "evals": evals,
    }


def greedy_action(net: Any, obs: Any) -> int:
    import torch

    with torch.no_grad():
        return int(net(torch.as_tensor(obs)).argmax().item())


def greedy_eval(env: Any, net: Any, seed: int, episodes: int = 100) -> float:
    """The mean return of ``episodes`` greedy episodes."""
    returns = []
    for k in range(episodes):
        obs, _ = env.reset(seed=10_000 + seed * 100 + k)
        done, ret = False, 0.0
        while not done:
            obs, r, term, trunc, _ = env.step(greedy_action(net, obs))
            ret, done = ret + float(r), term or trunc
        returns.append(ret)
    return statistics.fmean(returns)


def cleanrl_atari(seed: int, steps: int, starts: int) -> dict[str, Any]:
    """CleanRL dqn_atari.py's loop on ALE/Pong-v5 (module docstring): its loop time and frames/s."""
    np, torch = _setup(seed)
    import ale_py
    import gymnasium as gym
    import torch.nn.functional as F
    from torch import nn

    gym.register_envs(ale_py)

    def q_net() -> nn.Module:
        return nn.Sequential(
            nn.Conv2d(4, 32, 8, stride=4),
            nn.ReLU(),
            nn.Conv2d(32, 64, 4, stride=2),
            nn.ReLU(),
            nn.Conv2d(64, 64, 3, stride=1),
            nn.ReLU(),
            nn.Flatten(),
            nn.Linear(3136, 512),
            nn.ReLU(),
            nn.Linear(512, 6),
        )

    env = gym.make("ALE/Pong-v5", frameskip=1)
    env = gym.wrappers.AtariPreprocessing(env, noop_max=30, frame_skip=4, terminal_on_life_loss=False)
    env = gym.wrappers.FrameStackObservation(env, 4)
    net, target = q_net(), q_net()
    target.load_state_dict(net.state_dict())
    opt = torch.optim.Adam(net.parameters(), lr=1e-4)
    rb, updates = Ring(10_000, (4, 84, 84), np.uint8), 0
    obs, _ = env.reset(seed=seed)
    t0 = time.perf_counter()
    for step in range(1, steps + 1):
        eps = max(0.01, 1.0 - step / 100_000)
        if random.random() < eps:
            action = env.action_space.sample()
        else:
            with torch.no_grad():
                action = int(net(torch.from_numpy(obs)[None].float() / 255).argmax().item())
        nxt, r, term, trunc, _ = env.step(action)
        rb.add(obs, nxt, action, float(r), term)
        obs = env.reset()[0] if term or trunc else nxt
        if step > starts and step % 4 == 0:
            o, n, a, rew, done = rb.sample(32)
            with torch.no_grad():
                y = rew + 0.99 * target(n.float() / 255).max(1).values * (1 - done)
            loss = F.mse_loss(y, net(o.float() / 255).gather(1, a[:, None]).squeeze(1))
            opt.zero_grad()
            loss.backward()
            opt.step()
            updates += 1
            if step % 1000 == 0:
                target.load_state_dict(net.state_dict())
    wall = time.perf_counter() - t0
    return {"env_steps": steps, "updates": updates, "wall_s": wall, "frames_per_s": 4 * steps / wall}


def run_baseline(kind: str, seed: int, plan: Plan) -> dict[str, Any]:
    """One baseline as its own process; its result plus ``command_s`` (the process's whole wall time)."""
    cmd = [sys.executable, "-m", "benchmarks.bench_rl_envs", "--baseline", kind, "--seed", str(seed)]
    cmd += ["--plan", json.dumps(dataclasses.asdict(plan))]
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=plan.timeout_s, cwd=C.ROOT)
    command_s = time.perf_counter() - t0
    if proc.returncode:
        print(f"  baseline {kind} seed {seed}: FAILED\n{proc.stderr[-2000:]}", flush=True)
        return {"error": f"exit {proc.returncode}", "command_s": command_s, "stderr": proc.stderr[-3000:]}
    r = {**json.loads(proc.stdout.strip().splitlines()[-1]), "command_s": command_s}
    r["counted_s"] = command_s - r.get("eval_s", 0.0)  # its evaluation episodes are not counted against it
    print(f"  baseline {kind} seed {seed}: {fmt_run(r)}", flush=True)
    return r


def fmt_run(r: dict[str, Any]) -> str:
    return ", ".join(f"{k} {v:.1f}" if isinstance(v, float) else f"{k} {v}" for k, v in r.items() if k != "config")


def baseline_main(kind: str, seed: int, plan: Plan) -> None:
    if kind == "cartpole":
        out = cleanrl_cartpole(seed, plan.cartpole_cap)
    elif kind == "lunar":
        out = sb3_lunar(seed, plan)
    else:
        out = cleanrl_atari(seed, plan.atari_steps, plan.atari_starts)
    print(json.dumps(out), flush=True)


# -- the parts ----------------------------------------------------------------------------------------
def solve_part(root: Path, plan: Plan, kind: str, seeds: tuple[int, ...], args: list[str]) -> dict[str, Any]:
    """Per seed, disttrain and the baseline (the order alternating); whole-command times."""
    out: dict[str, list[dict[str, Any]]] = {"disttrain": [], "baseline": []}
    for i, seed in enumerate(seeds):
        order = ("disttrain", "baseline") if i % 2 == 0 else ("baseline", "disttrain")
        for system in order:
            if system == "disttrain":
                r = run_rl(root, f"{kind}-s{seed}", [*args, "--train.seed", str(seed)], plan.timeout_s)
                r.pop("config", None)
            else:
                r = run_baseline(kind, seed, plan)
            out[system].append({"seed": seed, **r})
    return out


def atari_ceiling(reps: int = 10) -> dict[str, float]:
    """What 2 cores allow at 8 samples per agent step (batch 32: one update per 4 agent steps), from the parts
    timed one after another in this process (one thread): the learner's double-DQN update, CleanRL's update (max
    target: one forward fewer), an agent step of the single process (emulation + a forward of one observation),
    and an actor's agent step (4 environments, one batched forward). The single process does both in turn; with
    the learner on one core and the actors on the other, the slower of the two sets the pace."""
    import copy

    import torch
    import torch.nn.functional as F

    from disttrain.rl import updates
    from disttrain.rl.envs import env_spec, make_one, make_vec
    from disttrain.rl.nets import as_input, make_net_for

    spec, b = env_spec("ALE/Pong-v5"), 32
    net = make_net_for(spec, 128, 0)
    target = copy.deepcopy(net)
    opt = torch.optim.Adam(net.parameters(), lr=1e-4, fused=True)
    frames = (b, *spec.obs_shape)
    batch = {"obs": torch.randint(0, 255, frames, dtype=torch.uint8), "action": torch.randint(0, 6, (b,))}
    batch |= {"next_obs": torch.randint(0, 255, frames, dtype=torch.uint8), "reward": torch.zeros(b)}
    batch |= {"done": torch.zeros(b), "discount": torch.full((b,), 0.99**3)}

    def cleanrl_update() -> None:
        with torch.no_grad():
            y = batch["reward"] + 0.99 * target(batch["next_obs"]).max(1).values * (1 - batch["done"])
        loss = F.mse_loss(y, net(batch["obs"]).gather(1, batch["action"][:, None]).squeeze(1))
        opt.zero_grad()
        loss.backward()
        opt.step()

    def timed(fn: Any, n: int) -> float:
        t0 = time.perf_counter()
        for _ in range(n):
            fn()
        return (time.perf_counter() - t0) / n

    ones = torch.ones(b)
    pair = (lambda: updates.dqn_step(net, target, opt, batch, ones), cleanrl_update)
    for fn in pair * 2:  # warm-up
        fn()
    times = [[timed(fn, 1) for fn in pair] for _ in range(reps)]  # interleaved; medians
    ours, theirs = (statistics.median(t[k] for t in times) for k in (0, 1))
    one, vec = make_one("ALE/Pong-v5"), make_vec("ALE/Pong-v5", 4, 0)
    obs1, obs4 = one.reset(seed=0)[0], vec.reset(seed=0)[0]

    def single_step() -> None:
        with torch.no_grad():
            action = int(net(torch.from_numpy(obs1)[None]).argmax().item())
        one.step(action)

    def actor_step() -> None:
        with torch.no_grad():
            actions = net(as_input(torch.from_numpy(obs4), spec)).argmax(1).numpy()
        vec.step(actions)

    single, actor = timed(single_step, 20 * reps), timed(actor_step, 5 * reps) / 4
    one.close()
    vec.close()
    per_update = 4  # agent steps per update: batch 32 / 8 samples per step
    one_process = per_update * single + theirs
    out = {"update_ms": ours * 1e3, "cleanrl_update_ms": theirs * 1e3, "single_step_ms": single * 1e3}
    out |= {"actor_step_ms": actor * 1e3, "ceiling": one_process / max(ours, per_update * actor)}
    out["ceiling_max_target"] = one_process / max(theirs, per_update * actor)
    print(
        f"  ceiling on 2 cores: one process {one_process * 1e3:.0f} ms per update and its 4 agent steps "
        f"(CleanRL update {theirs * 1e3:.0f} ms + 4 x {single * 1e3:.1f} ms); learner || actors: update "
        f"{ours * 1e3:.0f} ms (double DQN) || 4 x {actor * 1e3:.1f} ms: at most {out['ceiling']:.2f}x "
        f"({out['ceiling_max_target']:.2f}x with CleanRL's max target)",
        flush=True,
    )
    return out


def atari_part(root: Path, plan: Plan) -> dict[str, Any]:
    args = ["--rl.env-id", "ALE/Pong-v5", "--rl.actors", "2", "--rl.batch", "32", "--rl.replay-ratio", "8"]
    args += ["--rl.learning-starts", str(plan.atari_starts), "--train.max-env-steps", str(plan.atari_steps)]
    args += ["--train.solve-return", "0", "--rl.replay-capacity", "10000"]
    base = run_baseline("atari", 0, plan)
    dt = run_rl(root, "atari", args, plan.timeout_s)
    dt.pop("config", None)
    ceiling = atari_ceiling(3 if plan.atari_steps < 4_000 else 10)
    for r in (dt, base):
        if "error" not in r:  # (disttrain stops at the step cap with up to a chunk per actor not yet trained on)
            r["frames_per_s"] = 4 * r["env_steps"] / r["wall_s"]
            r["trained_frames_per_s"] = 4 * min(r["env_steps"], plan.atari_starts + 4 * r["updates"]) / r["wall_s"]
    return {"disttrain": dt, "baseline": base, "ceiling": ceiling}


def _median_time(runs: list[dict[str, Any]]) -> float:
    xs = [float(r.get("counted_s", r["command_s"])) if r.get("solved") else math.inf for r in runs]
    return statistics.median(xs) if xs else math.nan


def solve_table(name: str, part: dict[str, Any], goal: float) -> dict[str, Any]:
    rows = []
    for system, runs in part.items():
        for r in runs:
            rows.append(
                [
                    system,
                    r["seed"],
                    "FAILED" if "error" in r else "yes" if r["solved"] else "no",
                    r.get("env_steps", ""),
                    r.get("return", ""),
                    r.get("counted_s", r["command_s"]),
                ]
            )
    C.table(["system", "seed", "solved", "env steps", "return", "time s"], rows, title=name)
    med = {s: _median_time(runs) for s, runs in part.items()}
    # a baseline that solved at most half its seeds has no finite median: no ratio to report
    ratio = med["disttrain"] / med["baseline"] if math.isfinite(med["baseline"]) else math.nan
    n = len(part["disttrain"])
    solved = {s: sum(bool(r.get("solved")) for r in runs) for s, runs in part.items()}
    ok = solved["disttrain"] == n and math.isfinite(ratio) and ratio <= goal
    print(
        f"  medians (whole command less any evaluation, unsolved = inf): disttrain {med['disttrain']:.1f} s, baseline "
        f"{med['baseline']:.1f} s, ratio {ratio:.3f} (goal <= {goal}); solved disttrain {solved['disttrain']}/{n}, "
        f"baseline {solved['baseline']}/{n}: {'met' if ok else 'MISSED'}",
        flush=True,
    )

    def fin(x: float) -> float | None:
        return x if math.isfinite(x) else None

    return {
        "disttrain_median_s": fin(med["disttrain"]),
        "baseline_median_s": fin(med["baseline"]),
        "ratio": fin(ratio),
        "solved": solved,
        "goal_met": ok,
    }


def atari_table(part: dict[str, Any]) -> dict[str, Any]:
    d, b = part["disttrain"], part["baseline"]
    fd, fb = d.get("trained_frames_per_s", math.nan), b.get("trained_frames_per_s", math.nan)
    rows = [
        [name, r.get("env_steps", ""), r.get("updates", ""), r.get("wall_s", ""), r.get("frames_per_s", ""), f]
        for name, r, f in (("one process (CleanRL loop)", b, fb), ("disttrain rl, 2 actors", d, fd))
    ]
    head = ["system", "agent steps", "updates", "loop s", "frames/s", "trained frames/s"]
    title = "(c) Atari ALE/Pong-v5 frames/s (trained: frames the updates have caught up with, 8 samples per step)"
    C.table(head, rows, title=title)
    ratio = fd / fb
    goal = GOALS["atari_fps_ratio"]
    ceiling = part["ceiling"]["ceiling"]
    print(
        f"  ratio {ratio:.2f} (goal >= {goal}): {C.verdict(ratio, goal)}; the 2-core ceiling {ceiling:.2f}x", flush=True
    )
    out = {"ratio": ratio if math.isfinite(ratio) else None, "goal_met": bool(ratio >= goal)}
    return out | {"ceiling": ceiling, "of_ceiling": ratio / ceiling}


def main(argv: list[str]) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="a smoke run: one seed, short caps")
    p.add_argument("--parts", nargs="+", default=["a", "b", "c"], choices=["a", "b", "c"])
    p.add_argument("--run-root", type=Path, help="keep the run folders here (default: a temporary folder)")
    p.add_argument("--baseline", choices=["cartpole", "lunar", "atari"], help=argparse.SUPPRESS)
    p.add_argument("--seed", type=int, default=0, help=argparse.SUPPRESS)
    p.add_argument("--plan", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.baseline:
        plan = Plan(**json.loads(args.plan))
        baseline_main(args.baseline, args.seed, plan)
        return
    plan = QUICK if args.quick else Plan()
    C.one_thread()
    C.print_machine()
    t0 = time.perf_counter()
    results: dict[str, Any] = {"quick": args.quick, "plan": dataclasses.asdict(plan)}
    figures: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="disttrain-rl-envs-") as tmp:
        root = args.run_root or Path(tmp)
        root.mkdir(parents=True, exist_ok=True)
        if "a" in args.parts:
            cap = [] if plan.cartpole_cap == 500_000 else ["--train.max-env-steps", str(plan.cartpole_cap)]
            results["cartpole"] = solve_part(root, plan, "cartpole", plan.cartpole_seeds, cap)
        if "b" in args.parts:
            ll = ["--rl.env-id", "LunarLander-v3", "--train.solve-return", "200"]
            ll += ["--train.max-env-steps", str(plan.lunar_disttrain_cap)]
            results["lunar"] = solve_part(root, plan, "lunar", plan.lunar_seeds, ll)
            for r in results["lunar"]["disttrain"]:  # the same wall-time cap as the baseline's
                r["solved"] = bool(r.get("solved")) and r["command_s"] <= plan.lunar_budget_s
        if "c" in args.parts:
            results["atari"] = atari_part(root, plan)
    print()
    if "cartpole" in results:
        title = "(a) CartPole-v1: disttrain rl (defaults) vs CleanRL dqn.py, whole command"
        figures["cartpole"] = solve_table(title, results["cartpole"], GOALS["cartpole_ratio"])
    if "lunar" in results:
        title = "(b) LunarLander-v3: disttrain rl vs SB3-zoo DQN, time to solve (same wall-time cap for both)"
        figures["lunar"] = solve_table(title, results["lunar"], GOALS["lunar_ratio"])
    if "atari" in results:
        figures["atari"] = atari_table(results["atari"])
    total = time.perf_counter() - t0
    print(f"\ntotal benchmark time {total:.0f} s", flush=True)
    C.write_results(
        "bench_rl_envs" + ("_quick" if args.quick else ""), {**results, "figures": figures, "total_s": total}
    )


if __name__ == "__main__":
    main(sys.argv[1:])
