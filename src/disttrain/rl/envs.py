"""Gymnasium environments for the actors: checked once (an unknown id or an unsupported space is one line),
then stepped as a vector of environments that reset themselves in the same step an episode ends."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from disttrain.errors import ConfigError


@dataclass(frozen=True)
class EnvSpec:
    obs_dim: int
    n_actions: int


def _gym() -> Any:
    try:
        import gymnasium
    except ImportError:
        raise ConfigError("disttrain rl needs gymnasium, an optional part: pip install 'disttrain[rl]'") from None
    return gymnasium


def env_spec(env_id: str) -> EnvSpec:
    """The observation width and number of actions of ``env_id``; ConfigError if it cannot be used."""
    gym = _gym()
    try:
        env = gym.make(env_id)
    except Exception as e:  # gymnasium's NameNotFound / VersionNotFound / missing extras
        raise ConfigError(f"rl.env_id {env_id!r}: {str(e).splitlines()[0]}") from None
    obs, act = env.observation_space, env.action_space
    env.close()
    if not isinstance(act, gym.spaces.Discrete):
        raise ConfigError(f"rl.env_id {env_id!r} has actions {act}; disttrain rl needs a discrete action space")
    if not isinstance(obs, gym.spaces.Box) or len(obs.shape) != 1:
        raise ConfigError(f"rl.env_id {env_id!r} observes {obs}; disttrain rl needs a vector (1-d Box) observation")
    return EnvSpec(int(obs.shape[0]), int(act.n))


def make_vec(env_id: str, n: int, seed: int) -> Any:
    """``n`` copies of ``env_id`` stepped together; when one ends, ``info["final_obs"]`` holds its last
    observation and the returned one is already the next episode's first."""
    gym = _gym()
    env = gym.make_vec(
        env_id,
        num_envs=n,
        vectorization_mode="sync",
        vector_kwargs={"autoreset_mode": gym.vector.AutoresetMode.SAME_STEP},
    )
    env.action_space.seed(seed)
    return env
