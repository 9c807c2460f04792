"""The RL pieces in one process: n-step folding, the Ape-X ladder, learner-side batched inference against
actor-side inference, and the learner's checkpoint round trip."""

from __future__ import annotations

import re
import sys
import threading
from pathlib import Path

import numpy as np
import pytest
import torch

from disttrain.errors import ConfigError
from disttrain.rl import state
from disttrain.rl.config import RLConfig, RLJobConfig, RLTrainConfig
from disttrain.rl.envs import EnvSpec, env_spec
from disttrain.rl.learner import Learner
from disttrain.rl.nets import choose, make_net
from disttrain.rl.nstep import NStepFolder

pytestmark = pytest.mark.timeout(60)


def test_n_step_returns_bootstrap_on_time_limits_and_not_on_terminal_states() -> None:
    g = 0.5
    f = NStepFolder(2, n=2, gamma=g)
    obs = [np.full((2, 1), float(t)) for t in range(4)]
    no = np.array([False, False])
    f.add(obs[0], np.array([0, 1]), np.array([1.0, 10.0]), obs[1], no, no)
    f.add(obs[1], np.array([0, 1]), np.array([2.0, 20.0]), obs[2], np.array([True, False]), no)
    f.add(obs[2], np.array([0, 1]), np.array([3.0, 30.0]), obs[3], no, np.array([False, True]))
    batch, episodes = f.take()
    assert batch is not None
    got = sorted(
        zip(
            batch["obs"][:, 0].tolist(),
            batch["reward"].tolist(),
            batch["next_obs"][:, 0].tolist(),
            batch["done"].tolist(),
            batch["discount"].tolist(),
            strict=True,
        )
    )
    # env 0: terminal after 2 steps (no bootstrap); then one step of a new episode still pending
    # env 1: full 2-step returns, then a time limit (bootstrapped from the final observation, g^1)
    assert (0.0, 1.0 + g * 2.0, 2.0, 1.0, g**2) in got and (1.0, 2.0, 2.0, 1.0, g) in got
    assert (0.0, 10.0 + g * 20.0, 2.0, 0.0, g**2) in got
    assert (1.0, 20.0 + g * 30.0, 3.0, 0.0, g**2) in got and (2.0, 30.0, 3.0, 0.0, g) in got
    assert len(got) == 5 and sorted(episodes) == [(3.0, 2), (60.0, 3)]


def test_the_exploration_ladder_spans_eps_base_to_near_greedy() -> None:
    cfg = RLConfig(actors=3)
    eps = [cfg.epsilon(i) for i in range(3)]
    assert eps[0] == pytest.approx(0.4) and eps[2] == pytest.approx(0.4**8) and eps[0] > eps[1] > eps[2]
    assert cfg.epsilon(2, 0) == eps[2]  # explore_steps 0: the ladder from the start
    warm = RLConfig(actors=3, explore_steps=40_000)
    assert warm.epsilon(2, 0) == 1.0 and warm.epsilon(2, 40_000) == pytest.approx(eps[2])
    assert warm.epsilon(0, 20_000) == pytest.approx(0.7) and warm.epsilon(1, 10**9) == eps[1]
    assert RLConfig(algo="reinforce").epsilon(0) == 0.0 and RLConfig(algo="reinforce").learning_rate == 1e-2


def test_the_replay_ratio_defaults_per_environment_and_an_explicit_one_wins() -> None:
    assert RLConfig().samples_per_step == 8.0 and RLConfig(env_id="LunarLander-v3").samples_per_step == 16.0
    assert RLConfig(env_id="LunarLander-v3", replay_ratio=4.0).samples_per_step == 4.0
    with pytest.raises(ValueError, match=r"rl.replay_ratio must be > 0, got 0.0"):
        RLConfig(replay_ratio=0.0)


def test_the_target_network_is_copied_every_n_updates_or_follows_by_polyak_averaging() -> None:
    from disttrain.rl.updates import follow

    net, target = torch.nn.Linear(3, 2), torch.nn.Linear(3, 2)
    before = [p.clone() for p in target.parameters()]
    follow(target, net, 1.0, every=4, step=3)  # not yet
    assert all(torch.equal(a, b) for a, b in zip(target.parameters(), before, strict=True))
    follow(target, net, 1.0, every=4, step=4)
    assert all(torch.equal(a, b) for a, b in zip(target.parameters(), net.parameters(), strict=True))
    target = torch.nn.Linear(3, 2)
    start = [p.clone() for p in target.parameters()]
    for step in (1, 2):
        follow(target, net, 0.25, every=4, step=step)  # every update, a quarter of the way
    for t, s0, n in zip(target.parameters(), start, net.parameters(), strict=True):
        torch.testing.assert_close(t, n + (s0 - n) * 0.75**2)
    with pytest.raises(ConfigError, match=r"rl\.tau must be in"):
        RLConfig(tau=0.0)


def test_learner_side_batched_inference_gives_the_actions_actor_side_inference_gives() -> None:
    cfg = RLConfig(actors=3)
    lr = Learner(RLJobConfig(rl=cfg), EnvSpec(4, 2))
    actor_net = make_net(4, 2, cfg.hidden, RLTrainConfig().seed)  # an actor's copy: the same weights
    pairs = zip(actor_net.state_dict().values(), lr.acting.state_dict().values(), strict=True)
    assert all(torch.equal(a, b) for a, b in pairs)
    obs = [torch.randn(64, 4, generator=torch.Generator().manual_seed(i)) for i in range(3)]
    answers: dict[int, torch.Tensor] = {}

    def ask(i: int) -> None:
        answers[i] = lr.infer(obs[i]).wait()

    threads = [threading.Thread(target=ask, args=(i,)) for i in range(3)]  # three actors at once
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    eps = torch.tensor(cfg.epsilon(1))
    for i in range(3):
        local = choose(actor_net(obs[i]).detach(), eps, "dqn", torch.Generator().manual_seed(7))
        remote = choose(answers[i], eps, "dqn", torch.Generator().manual_seed(7))
        assert torch.equal(local, remote)
        assert torch.allclose(answers[i], actor_net(obs[i]).detach(), atol=1e-6)


def _experience(n: int, seed: int) -> dict[str, object]:
    g = torch.Generator().manual_seed(seed)
    batch = {
        "obs": torch.randn(n, 4, generator=g),
        "action": torch.randint(0, 2, (n,), generator=g),
        "reward": torch.ones(n),
        "next_obs": torch.randn(n, 4, generator=g),
        "done": torch.zeros(n),
        "discount": torch.full((n,), 0.99**3),
    }
    return {"actor": 2, "steps": n, "version": 0, "episodes": [(float(seed), 10)], "batch": batch}


def test_the_learning_rate_decays_to_lr_final_and_the_target_network_follows_by_tau() -> None:
    assert RLConfig().final_learning_rate_for(False) == RLConfig().learning_rate == 5e-4  # the default: constant
    cfg = RLConfig(learning_starts=128, batch=32, lr_final=5e-5, tau=0.005)
    lr = Learner(RLJobConfig(rl=cfg, train=RLTrainConfig(max_env_steps=800)), EnvSpec(4, 2))
    for k in range(4):  # 400 of the 800 env steps
        lr.receive(_experience(100, k))
        lr.drain(0.0)
        while lr.train_once():
            pass
    assert lr.c.updates > 0 and lr.opt.param_groups[0]["lr"] == pytest.approx(5e-4 + (5e-5 - 5e-4) * 0.5)
    lr.receive(_experience(100, 9))
    lr.drain(0.0)
    before = [p.clone() for p in lr.target.parameters()]
    assert lr.train_once()
    for t, b, n in zip(lr.target.parameters(), before, lr.net.parameters(), strict=True):
        torch.testing.assert_close(t, b + 0.005 * (n - b))  # after every update, 0.5% of the way


def test_a_learner_checkpoint_brings_back_replay_counters_and_weights(tmp_path: Path) -> None:
    cfg = RLConfig(actors=3, learning_starts=128, batch=32, replay_capacity=500, prioritized=True)
    a = Learner(RLJobConfig(rl=cfg), EnvSpec(4, 2))
    for k in range(8):
        a.receive(_experience(100, k))
        a.drain(0.0)
        while a.train_once():
            pass
    assert a.c.updates > 0 and len(a.replay) == 500 and a.c.env_steps == 800
    state.save(tmp_path, a)
    b = Learner(RLJobConfig(rl=cfg, train=RLTrainConfig(seed=5)), EnvSpec(4, 2))
    assert state.resume(tmp_path, b) is not None
    for counter in ("env_steps", "episodes", "updates", "version"):
        assert getattr(b.c, counter) == getattr(a.c, counter), counter
    assert list(b.c.returns) == list(a.c.returns) and list(b.c.lengths) == list(a.c.lengths)
    for x, y in zip(a.net.state_dict().values(), b.net.state_dict().values(), strict=True):
        assert torch.equal(x, y)
    for key, value in a.replay.state_dict().items():
        other = b.replay.state_dict()[key]
        assert torch.equal(value, other) if isinstance(value, torch.Tensor) else value == other, key
    sa, sb = a.replay.sample(16), b.replay.sample(16)  # the replay's generator came back too
    assert torch.equal(sa[1], sb[1]) and torch.equal(sa[0]["obs"], sb[0]["obs"])


@pytest.mark.parametrize(
    ("env_id", "message"),
    [
        ("Nope-v0", "rl.env_id 'Nope-v0': Environment `Nope` doesn't exist"),
        ("Pendulum-v1", "disttrain rl needs a discrete action space"),
    ],
)
def test_an_unusable_environment_is_one_clear_error(env_id: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(")", r"\)")):
        env_spec(env_id)
    assert env_spec("CartPole-v1") == EnvSpec(4, 2)


def test_without_gymnasium_disttrain_rl_names_the_install_command(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """gymnasium is the ``rl`` extra, not a dependency of every install: without it, one line and exit 2."""
    from disttrain.cli import main

    monkeypatch.setitem(sys.modules, "gymnasium", None)  # `import gymnasium` raises ImportError
    with pytest.raises(ConfigError, match=r"needs gymnasium, an optional part: pip install 'disttrain\[rl\]'"):
        env_spec("CartPole-v1")
    assert main(["rl", "--run.root", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err == "disttrain: error: disttrain rl needs gymnasium, an optional part: pip install 'disttrain[rl]'\n"
    assert not list(tmp_path.iterdir())  # nothing started, no run folder


def test_every_disttrain_rl_command_in_its_guide_parses() -> None:
    from disttrain.cli.rl import FLAGS
    from disttrain.config import parse_command

    guide = (Path(__file__).resolve().parents[2] / "docs" / "reinforcement-learning.md").read_text()
    bash = "\n".join(re.findall(r"```bash\n(.*?)```", guide, flags=re.S))
    commands = [line.split("#")[0].split()[2:] for line in bash.splitlines() if line.startswith("disttrain rl ")]
    assert len(commands) >= 5
    for argv in commands:
        line = parse_command(RLJobConfig, argv, "disttrain rl", "", FLAGS)
        assert line is not None
        env_spec(line.cfg.rl.env_id)
