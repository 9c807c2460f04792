"""`disttrain rl` on real environments beyond CartPole: LunarLander-v3 (Box2D) and an Atari game (ale-py) with
2 actors as real processes, frames kept uint8 from the actor to the replay, and environments it cannot use
refused in one line."""

from __future__ import annotations

import functools
import importlib.util
import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from disttrain.rl.actor import Actor
from disttrain.rl.config import RLConfig, RLJobConfig
from disttrain.rl.envs import env_spec
from disttrain.rl.nets import NatureCNN, make_net_for
from disttrain.rl.replay import ReplayBuffer
from disttrain.testing.launch import together

from conftest import assert_one_line, disttrain

needs_box2d = pytest.mark.skipif(
    importlib.util.find_spec("Box2D") is None, reason="LunarLander-v3 needs Box2D: pip install 'disttrain[rl]'"
)
needs_ale = pytest.mark.skipif(
    importlib.util.find_spec("ale_py") is None or importlib.util.find_spec("cv2") is None,
    reason="the Atari games need ale-py and OpenCV: pip install 'disttrain[rl]'",
)
FRAMES = (4, 84, 84)


def summary_of(tmp: Path, name: str, *args: str) -> dict[str, Any]:
    proc = disttrain("rl", "--run.root", str(tmp), "--run.name", name, "--rl.actors", "2", *args, timeout=120)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    return json.loads((tmp / name / "summary.json").read_text())


@needs_box2d
@pytest.mark.slow
@pytest.mark.timeout(120)
def test_lunar_lander_runs_with_two_actors_and_the_learner_updates(tmp_path: Path) -> None:
    args = ["--rl.env-id", "LunarLander-v3", "--train.max-env-steps", "3000", "--train.solve-return", "0"]
    s = summary_of(tmp_path, "ll", *args, "--rl.learning-starts", "1000", "--rl.replay-ratio", "2")
    assert s["env_steps"] >= 3000 and s["updates"] > 0 and s["network"] == "Sequential", s
    assert s["replay_obs_dtype"] == "float32" and s["replay_capacity"] == 100_000, s
    assert s["replay_ratio"] == 2.0 and s["config"]["rl"]["replay_ratio"] == 2.0, s  # (LunarLander's default: 16)


@needs_ale
@pytest.mark.slow
@pytest.mark.timeout(120)
def test_pong_runs_with_two_actors_on_the_nature_cnn_and_a_uint8_replay(tmp_path: Path) -> None:
    args = ["--rl.env-id", "ALE/Pong-v5", "--train.max-env-steps", "1200", "--rl.learning-starts", "500"]
    s = summary_of(tmp_path, "pong", *args, "--rl.batch", "32", "--rl.replay-ratio", "1")
    assert s["env_steps"] >= 1200 and s["updates"] > 0 and s["network"] == "NatureCNN", s
    # the default capacity for frames: 20,000 transitions, obs and next_obs as bytes (1.1 GB, not 4x that)
    assert s["replay_obs_dtype"] == "uint8" and s["replay_capacity"] == 20_000, s
    assert s["replay_bytes"] < 20_000 * (2 * np.prod(FRAMES) + 64), s


@needs_ale
@pytest.mark.timeout(60)
def test_an_atari_actor_sends_uint8_frames_and_the_replay_keeps_them() -> None:
    spec = env_spec("ALE/Breakout-v5")
    assert spec.obs_shape == FRAMES and spec.obs_dtype == "uint8" and spec.image
    job = RLJobConfig(rl=RLConfig(env_id="ALE/Breakout-v5", actors=2, envs_per_actor=2, chunk=6))
    actor = Actor(job, 0, spec, rank=1)
    assert isinstance(actor.net, NatureCNN)
    obs, _ = actor.env.reset(seed=0)
    actor.play(obs)
    batch = actor.chunk_item()["batch"]  # what goes over RPC
    assert batch["obs"].dtype == torch.uint8 and batch["next_obs"].dtype == torch.uint8
    assert tuple(batch["obs"].shape[1:]) == FRAMES and len(batch["obs"]) >= 2 * (6 - 2)
    replay = ReplayBuffer(16, spec.obs_shape, obs_dtype=torch.uint8)
    replay.add(batch)
    got, _, _ = replay.sample(4)
    assert got["obs"].dtype == torch.uint8 and replay.nbytes < 16 * (2 * np.prod(FRAMES) + 64)
    q = make_net_for(spec, hidden=128, seed=0)(got["obs"])  # the network takes the bytes itself
    assert q.shape == (4, spec.n_actions) and bool(torch.isfinite(q).all())
    actor.env.close()


@pytest.mark.slow
@pytest.mark.timeout(60)
def test_environments_disttrain_rl_cannot_use_are_one_line(tmp_path: Path) -> None:
    cases = [
        (["--rl.env-id", "ALE/Nope-v5"], "rl.env_id 'ALE/Nope-v5': no such environment"),
        (["--rl.env-id", "NoSuchThing-v1"], "rl.env_id 'NoSuchThing-v1': Environment `NoSuchThing` doesn't exist"),
        (["--rl.env-id", "MountainCarContinuous-v0"], "needs a discrete action space"),
    ]
    if importlib.util.find_spec("ale_py") is not None and importlib.util.find_spec("cv2") is not None:
        cases.append((["--rl.env-id", "ALE/Pong-v5", "--rl.algo", "reinforce"], "need --rl.algo dqn"))
    procs = together(
        *(functools.partial(disttrain, "rl", *args, "--run.root", str(tmp_path), timeout=60) for args, _ in cases)
    )
    for (_, message), proc in zip(cases, procs, strict=True):
        assert_one_line(proc, message)
