"""``disttrain rl`` (DQN on CartPole-v1, 1 learner + N actor processes over RPC): throughput and time to solve.

Four parts, all in one run, each configuration a fresh ``disttrain rl`` job (learner and actors share this
machine's cores, so more actors is not more compute here); its figures come from the run's summary.json:

1. Throughput: env steps/s with 1, 2 and 4 actors (chunk 50, inference on the actors), fixed-length runs
   (``--train.max-env-steps N --train.solve-return 0``). The learner's replay-ratio flow control (8 transitions trained
   on per env step) holds the actors back, so this is the rate of the whole job, training included.
2. ``--rl.chunk 1`` (one RPC per env step, the PyTorch RPC tutorial's pattern) vs 50 vs 200, 3 actors: env
   steps/s and the ratio to chunk 1. Chunk 1 runs fewer steps (it is slow; steps/s is what is compared).
   Its first 1,000 steps are before learning starts (no updates), a larger share of its shorter run, which
   if anything flatters chunk 1.
3. ``--rl.inference actor`` vs ``--rl.inference learner`` (SEED RL: one RPC per step to the learner's batched
   forward), 3 actors, chunk 50: env steps/s and their ratio.
4. Wall time to solve CartPole (mean return of the last 100 counted episodes >= 475) with the defaults,
   ``disttrain rl --train.seed S`` for seeds 0, 1, 2 (median; goal <= 120 s), against a plain single-process DQN
   loop written here, CleanRL-style (one env; act, step, store, train), with disttrain's maths and defaults:
   ``make_net(4, 2, hidden=128, seed)``, Adam lr 1e-3, gamma 0.99, 3-step returns folded by disttrain's
   ``NStepFolder``, uniform ``ReplayBuffer(100_000)``, ``dqn_step`` (double DQN, smooth L1, grad clip 10,
   weights 1), batch 128, one update every 16 env steps (replay ratio 8) once the replay holds 1,000
   transitions, target copy every 250 updates, one intra-op thread. Exploration is CleanRL's schedule:
   epsilon decays linearly from 1.0 to 0.02 over the first 20% of the step cap (300,000: 60,000 steps), then
   stays at 0.02. As disttrain counts only the episodes of its low-exploration actors (epsilon <= 0.02), the
   baseline counts only episodes begun with epsilon <= 0.02. A baseline that does not solve within the cap
   is reported 'not solved' with its wall time at the cap. In the medians a seed not solved (either system)
   counts as never solving (infinite time and steps): a median is finite only if most seeds solved.
   Both wall times are the training loop only (disttrain: summary.json ``wall_s``, from the learner's loop
   start; baseline: from its first env step, after imports, env, network and replay are set up); the ratio
   disttrain / baseline of the medians has goal <= 0.7. disttrain's whole-command time (process start-up,
   RPC set-up and shutdown included) is reported beside it.

    .venv/bin/python -m benchmarks.bench_rl [--quick] [--seeds 0 1 2] [--run-root DIR]
    .venv/bin/python -m benchmarks.bench_rl --tables-from benchmarks/results/bench_rl.json  # print again
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import json
import math
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections import deque
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
import torch

from benchmarks import _common as C
from disttrain.rl.config import RLConfig, RLTrainConfig
from disttrain.rl.envs import env_spec
from disttrain.rl.nets import make_net
from disttrain.rl.nstep import NStepFolder
from disttrain.rl.replay import ReplayBuffer
from disttrain.rl.updates import dqn_step

SOLVE_GOAL_S = 120.0
RATIO_GOAL = 0.7


@dataclasses.dataclass
class Plan:
    """How long each run is: the full benchmark, or ``--quick`` (a smoke run: short runs, one seed)."""

    steps: int = 40_000  # the fixed-length throughput runs
    chunk1_steps: int = 5_000  # --chunk 1 (one RPC per step)
    learner_steps: int = 10_000  # --inference learner (one RPC per step)
    cap: int = 500_000  # solve runs: env steps before giving up (both systems)
    explore_frac: float = 0.2  # baseline: epsilon reaches 0.02 after this fraction of the cap
    seeds: tuple[int, ...] = (0, 1, 2)
    timeout_s: float = 1200.0


QUICK = Plan(steps=5_000, chunk1_steps=1_000, learner_steps=2_000, cap=30_000, seeds=(0,), timeout_s=600.0)


# -- disttrain rl jobs --------------------------------------------------------------------------------
def log_tails(run_dir: Path, lines: int = 30) -> dict[str, str]:
    """The last lines of every rank's log in a run folder (what to report when a run fails)."""
    logs = sorted((run_dir / "logs").glob("rank*.log")) if (run_dir / "logs").is_dir() else []
    return {p.name: "\n".join(p.read_text(errors="replace").splitlines()[-lines:]) for p in logs}


def run_rl(root: Path, name: str, args: list[str], timeout_s: float) -> dict[str, Any]:
    """One ``disttrain rl`` job: its summary.json plus ``command_s`` (the whole command's wall time), or, if
    it failed or hung, ``error`` with its stderr and the ranks' log tails. On a timeout the job's process
    group (started here) is killed."""
    exe = Path(sys.executable).parent / "disttrain"
    cmd = [str(exe), "rl", *args, "--run.root", str(root), "--run.name", name]
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        out, err = proc.communicate(timeout=timeout_s)
        error = f"exit {proc.returncode}" if proc.returncode else ""
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        error = f"timed out after {timeout_s:.0f} s"
    command_s = time.perf_counter() - t0
    summary_path = root / name / "summary.json"
    if not error and not summary_path.exists():
        error = "no summary.json"
    if error:
        print(f"  {name}: FAILED ({error}); stderr tail:\n{err[-2000:]}", flush=True)
        tails = log_tails(root / name)
        for log, text in tails.items():
            print(f"  --- {name}/logs/{log} (tail) ---\n{text}", flush=True)
        return {
            "error": error,
            "command": cmd,
            "command_s": command_s,
            "stdout": out[-2000:],
            "stderr": err[-4000:],
            "logs": tails,
        }
    summary = json.loads(summary_path.read_text())
    print(
        f"  {name}: {summary['env_steps']:,} env steps in {summary['wall_s']:.1f} s "
        f"({summary['env_steps_per_s']:,.0f}/s), solved {summary['solved']}, command {command_s:.1f} s",
        flush=True,
    )
    return {**summary, "command_s": command_s}


def throughput_runs(root: Path, plan: Plan) -> dict[str, dict[str, Any]]:
    """Parts 1-3: the fixed-length jobs, keyed ``a<actors>-c<chunk>-<inference>``."""
    jobs = [
        (1, 50, "actor", plan.steps),
        (2, 50, "actor", plan.steps),
        (3, 50, "actor", plan.steps),
        (4, 50, "actor", plan.steps),
        (3, 1, "actor", plan.chunk1_steps),
        (3, 200, "actor", plan.steps),
        (3, 50, "learner", plan.learner_steps),
    ]
    runs: dict[str, dict[str, Any]] = {}
    for actors, chunk, inference, steps in jobs:
        key = f"a{actors}-c{chunk}-{inference}"
        args = [
            "--rl.actors",
            str(actors),
            "--rl.chunk",
            str(chunk),
            "--rl.inference",
            inference,
            "--train.max-env-steps",
            str(steps),
            "--train.solve-return",
            "0",
            "--train.seed",
            "0",
        ]
        runs[key] = run_rl(root, key, args, plan.timeout_s)
    return runs


# -- the single-process baseline ----------------------------------------------------------------------
def baseline_dqn(seed: int, cap: int, explore_frac: float) -> dict[str, Any]:
    """CleanRL-style DQN on one CartPole-v1 env in this process, disttrain's defaults and maths (see the module
    docstring); timed from the first env step, set-up excluded."""
    torch.set_num_threads(1)
    d, t = RLConfig(), RLTrainConfig()  # the [rl] and [train] defaults
    env = gym.make(d.env_id)
    spec = env_spec(d.env_id)
    obs_dim, n_actions = spec.obs_dim, spec.n_actions
    net = make_net(obs_dim, n_actions, d.hidden, seed)
    target = copy.deepcopy(net).requires_grad_(False)
    opt = torch.optim.Adam(net.parameters(), lr=d.learning_rate)
    replay = ReplayBuffer(d.capacity_for(image=False), obs_dim, seed=seed)
    folder = NStepFolder(1, d.n_step, d.gamma)
    rng = np.random.default_rng(seed)
    every, ones = round(d.batch / d.samples_per_step), torch.ones(d.batch)
    explore_steps = explore_frac * cap
    counted: deque[float] = deque(maxlen=t.solve_window)
    obs, _ = env.reset(seed=seed)
    step = episodes = updates = 0
    ep_ret, ep_eps, new_episode, solved = 0.0, 1.0, True, False
    t0 = time.perf_counter()
    while step < cap and not solved:
        eps = max(t.eval_eps, 1.0 + (t.eval_eps - 1.0) * step / explore_steps)  # CleanRL's linear_schedule
        if new_episode:
            ep_eps, new_episode = eps, False
        if rng.random() < eps:
            action = int(rng.integers(n_actions))
        else:
            with torch.no_grad():
                action = int(net(torch.from_numpy(obs).float()).argmax())
        nxt, reward, term, trunc, _ = env.step(action)
        folder.add(
            obs[None],
            np.array([action]),
            np.array([reward], dtype=np.float64),
            nxt[None],
            np.array([term]),
            np.array([trunc]),
        )
        step, ep_ret = step + 1, ep_ret + float(reward)
        if term or trunc:
            episodes += 1
            if ep_eps <= t.eval_eps:
                counted.append(ep_ret)
            solved = len(counted) == t.solve_window and statistics.fmean(counted) >= t.solve_return
            (obs, _), ep_ret, new_episode = env.reset(), 0.0, True
        else:
            obs = nxt
        if step % every == 0:
            batch, _ = folder.take()
            if batch is not None:
                replay.add(batch)
            if len(replay) >= d.learning_starts:
                dqn_step(net, target, opt, replay.sample(d.batch)[0], ones)
                updates += 1
                if updates % d.target_every == 0:
                    target.load_state_dict(net.state_dict())
    wall = time.perf_counter() - t0
    ret = statistics.fmean(counted) if counted else float("nan")
    return {
        "solved": solved,
        "wall_s": wall,
        "env_steps": step,
        "episodes": episodes,
        "updates": updates,
        "return": ret,
        "explore_steps": int(explore_steps),
        "env_steps_per_s": step / wall,
    }


def solve_runs(root: Path, plan: Plan) -> dict[str, list[dict[str, Any]]]:
    """Part 4: per seed, disttrain with the defaults and the baseline, alternating which goes first."""
    out: dict[str, list[dict[str, Any]]] = {"disttrain": [], "baseline": []}
    cap_args = [] if plan.cap == RLTrainConfig().max_env_steps else ["--train.max-env-steps", str(plan.cap)]
    for i, seed in enumerate(plan.seeds):
        order = ("disttrain", "baseline") if i % 2 == 0 else ("baseline", "disttrain")
        for system in order:
            if system == "disttrain":
                r = run_rl(root, f"solve-s{seed}", ["--train.seed", str(seed), *cap_args], plan.timeout_s)
            else:
                r = baseline_dqn(seed, plan.cap, plan.explore_frac)
                print(
                    f"  baseline seed {seed}: {r['env_steps']:,} env steps in {r['wall_s']:.1f} s, "
                    f"solved {r['solved']}, return {r['return']:.1f}",
                    flush=True,
                )
            out[system].append({"seed": seed, **r})
    return out


# -- tables -------------------------------------------------------------------------------------------
def rate(r: dict[str, Any]) -> float:
    return float("nan") if "error" in r else float(r["env_steps_per_s"])


def throughput_tables(runs: dict[str, dict[str, Any]]) -> dict[str, float]:
    """Print parts 1-3; return the ratios."""
    rows = []
    for key, r in runs.items():
        a, c, inf = key.split("-")
        if "error" in r:
            rows.append([a[1:], c[1:], inf, "FAILED: " + r["error"], "", "", ""])
        else:
            rows.append([a[1:], c[1:], inf, r["env_steps"], r["wall_s"], r["updates"], rate(r)])
    head = ["actors", "chunk", "inference", "env steps", "loop s", "updates", "env steps/s"]
    C.table(head, rows, title="disttrain rl throughput (fixed-length runs, --solve-return 0, seed 0)")
    c1 = rate(runs["a3-c1-actor"])
    ratios = {f"chunk{c}_over_chunk1": rate(runs[f"a3-c{c}-actor"]) / c1 for c in (50, 200)}
    rows = [
        [
            c,
            runs[f"a3-c{c}-actor"].get("env_steps", ""),
            rate(runs[f"a3-c{c}-actor"]),
            rate(runs[f"a3-c{c}-actor"]) / c1,
        ]
        for c in (1, 50, 200)
    ]
    C.table(
        ["chunk", "env steps", "env steps/s", "x chunk 1"],
        rows,
        title="RPC batching: 3 actors, inference actor (chunk 1 = one RPC per env step)",
    )
    act, lrn = rate(runs["a3-c50-actor"]), rate(runs["a3-c50-learner"])
    ratios["learner_over_actor_inference"] = lrn / act
    C.table(
        ["inference", "env steps/s", "x actor"],
        [["actor", act, 1.0], ["learner", lrn, lrn / act]],
        title="Where the network acts: 3 actors, chunk 50",
    )
    return ratios


def _to_solve(runs: list[dict[str, Any]], key: str) -> float:
    """Median over seeds of ``key`` for solving: a run that did not solve within the cap (or failed) counts as
    never solving (infinite), so the median is finite only if more than half the seeds solved."""
    xs = [float(r[key]) if r.get("solved") else math.inf for r in runs]
    return statistics.median(xs) if xs else math.nan


def solve_tables(solve: dict[str, list[dict[str, Any]]], plan: Plan) -> dict[str, float | None]:
    """Print part 4, per seed then the medians; return the medians and the ratio (None: never solved)."""
    rows = []
    for system, runs in solve.items():
        for r in runs:
            if "error" in r:
                rows.append([system, r["seed"], "FAILED: " + r["error"], "", "", "", "", "", r["command_s"]])
                continue
            rows.append(
                [
                    system,
                    r["seed"],
                    "yes" if r["solved"] else "no",
                    r["wall_s"],
                    r["env_steps"],
                    r["episodes"],
                    r["updates"],
                    r["return"],
                    r.get("command_s", ""),
                ]
            )
    head = ["system", "seed", "solved", "loop s", "env steps", "episodes", "updates", "return", "command s"]
    title = (
        f"Solving CartPole-v1 (mean of the last 100 counted episodes >= 475; cap {plan.cap:,} steps; baseline "
        f"epsilon 1 -> 0.02 over {int(plan.explore_frac * plan.cap):,} steps)"
    )
    C.table(head, rows, title=title)
    dt, base = solve["disttrain"], solve["baseline"]
    med = {
        "disttrain_wall_s": _to_solve(dt, "wall_s"),
        "baseline_wall_s": _to_solve(base, "wall_s"),
        "disttrain_command_s": _to_solve(dt, "command_s"),
        "disttrain_env_steps": _to_solve(dt, "env_steps"),
        "baseline_env_steps": _to_solve(base, "env_steps"),
    }
    med["ratio"] = med["disttrain_wall_s"] / med["baseline_wall_s"]  # inf / inf: nan (neither solves)
    n = len(plan.seeds)
    solved_dt, solved_b = (sum(bool(r.get("solved")) for r in runs) for runs in (dt, base))
    rows = [
        [
            "disttrain loop (median)",
            med["disttrain_wall_s"],
            f"<= {SOLVE_GOAL_S:.0f} s",
            C.verdict(med["disttrain_wall_s"], SOLVE_GOAL_S, higher_is_better=False),
            f"{solved_dt}/{n}",
            med["disttrain_env_steps"],
        ],
        ["disttrain whole command (median)", med["disttrain_command_s"], "", "", "", ""],
        ["baseline loop (median)", med["baseline_wall_s"], "", "", f"{solved_b}/{n}", med["baseline_env_steps"]],
        [
            "ratio disttrain / baseline",
            med["ratio"],
            f"<= {RATIO_GOAL}",
            C.verdict(med["ratio"], RATIO_GOAL, higher_is_better=False),
            "",
            "",
        ],
    ]
    title = f"Time to solve, median of seeds {', '.join(map(str, plan.seeds))} (a seed not solved counts as inf)"
    C.table(["time to solve", "seconds / ratio", "goal", "", "solved", "env steps (median)"], rows, title=title)
    return {k: v if math.isfinite(v) else None for k, v in med.items()}


def report(
    runs: dict[str, dict[str, Any]],
    solve: dict[str, list[dict[str, Any]]],
    plan: Plan,
    total: float,
    replay: bool = False,
) -> dict[str, Any]:
    """All tables, at the end; the figures they derive."""
    print()
    ratios = throughput_tables(runs)
    print()
    med = solve_tables(solve, plan)
    now = "" if replay else f"; load average now {os.getloadavg()[0]:.2f}"
    print(f"\ntotal benchmark time {total:.0f} s{now}", flush=True)
    return {"ratios": ratios, "solve_medians": med}


def main(argv: list[str]) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="a smoke run: short runs, one seed, a 30,000-step cap")
    p.add_argument("--seeds", type=int, nargs="+", help="seeds of the solve runs (default 0 1 2; --quick: 0)")
    p.add_argument("--run-root", type=Path, help="keep the run folders here (default: a temporary folder)")
    p.add_argument("--tables-from", type=Path, help="run nothing: print a results JSON's tables (and update it)")
    args = p.parse_args(argv)
    if args.tables_from:
        data = json.loads(args.tables_from.read_text())
        plan = Plan(**data["plan"] | {"seeds": tuple(data["plan"]["seeds"])})
        data.update(report(data["throughput"], data["solve"], plan, data["total_s"], replay=True))
        args.tables_from.write_text(json.dumps(data, indent=2) + "\n")
        return
    plan = QUICK if args.quick else Plan()
    if args.seeds:
        plan = dataclasses.replace(plan, seeds=tuple(args.seeds))
    C.one_thread()
    C.print_machine()
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="disttrain-rl-bench-") as tmp:
        root = args.run_root or Path(tmp)
        root.mkdir(parents=True, exist_ok=True)
        print(f"run folders under {root}", flush=True)
        runs = throughput_runs(root, plan)
        solve = solve_runs(root, plan)
    total = time.perf_counter() - t0
    figures = report(runs, solve, plan, total)
    data = {"quick": args.quick, "plan": dataclasses.asdict(plan), "throughput": runs, "solve": solve}
    C.write_results("bench_rl", {**data, **figures, "total_s": total})


if __name__ == "__main__":
    main(sys.argv[1:])
