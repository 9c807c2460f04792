"""Gymnasium environments for the actors: checked once (an unknown id or an unsupported space is one line),
then stepped as a vector of environments that reset themselves in the same step an episode ends.

Two kinds of observation: a vector (1-d Box: CartPole, LunarLander, ...), used as gymnasium gives it, and
images, the Atari games of ale-py (``ALE/Pong-v5``, ...), which get the standard DQN preprocessing (Mnih et
al. 2015, as CleanRL and SB3 apply it): up to 30 no-op actions at reset, the action repeated for 4 frames
(max-pooled over the last two), 84x84 grey, and the last 4 frames stacked: observations ``(4, 84, 84)``
uint8, kept uint8 all the way to the replay (the Q-network scales them by 1/255 itself). ALE's v5 games skip
4 frames of their own, so they are made with ``frameskip=1`` and the wrapper does the skipping.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from disttrain.errors import ConfigError

FRAME_STACK = 4
SCREEN = 84


@dataclass(frozen=True)
class EnvSpec:
    """What the networks and the replay need to know of an environment."""

    obs_dim: int
    """Numbers in one observation (the product of ``obs_shape``)."""
    n_actions: int
    obs_shape: tuple[int, ...] = ()
    """One observation's shape: ``(obs_dim,)`` for a vector (the default), ``(4, 84, 84)`` for Atari."""
    obs_dtype: str = "float32"
    """How observations travel and are stored: float32 (vectors) or uint8 (images)."""

    def __post_init__(self) -> None:
        if not self.obs_shape:
            object.__setattr__(self, "obs_shape", (self.obs_dim,))

    @property
    def image(self) -> bool:
        """Stacked frames (channels, height, width) rather than a vector."""
        return len(self.obs_shape) == 3


def is_atari(env_id: str) -> bool:
    return env_id.startswith("ALE/")


def _gym() -> Any:
    try:
        import gymnasium
    except ImportError:
        raise ConfigError("disttrain rl needs gymnasium, an optional part: pip install 'disttrain[rl]'") from None
    try:
        import ale_py
    except ImportError:
        pass
    else:
        gymnasium.register_envs(ale_py)  # the ALE/... ids (idempotent)
        ale_py.ALEInterface.setLoggerMode(ale_py.LoggerMode.Error)  # not its banner on every process's stderr
    return gymnasium


def make_one(env_id: str) -> Any:
    """One environment, wrapped as its kind needs (Atari: the DQN preprocessing and a 4-frame stack)."""
    gym = _gym()
    if not is_atari(env_id):
        return gym.make(env_id)
    if env_id not in gym.registry:
        raise ConfigError(
            f"rl.env_id {env_id!r}: no such environment (Atari games need ale-py: pip install 'disttrain[rl]'; "
            "ids look like ALE/Pong-v5)"
        )
    env = gym.make(env_id, frameskip=1)  # the wrapper skips (and max-pools) frames
    env = gym.wrappers.AtariPreprocessing(
        env, noop_max=30, frame_skip=4, screen_size=SCREEN, grayscale_obs=True, terminal_on_life_loss=False
    )
    return gym.wrappers.FrameStackObservation(env, FRAME_STACK)


def env_spec(env_id: str) -> EnvSpec:
    """The observation shape and number of actions of ``env_id``; ConfigError if it cannot be used."""
    gym = _gym()
    try:
        env = make_one(env_id)
    except ConfigError:
        raise
    except Exception as e:  # gymnasium's NameNotFound / VersionNotFound / missing extras
        raise ConfigError(f"rl.env_id {env_id!r}: {str(e).splitlines()[0]}") from None
    obs, act = env.observation_space, env.action_space
    env.close()
    if not isinstance(act, gym.spaces.Discrete):
        raise ConfigError(f"rl.env_id {env_id!r} has actions {act}; disttrain rl needs a discrete action space")
    vector = isinstance(obs, gym.spaces.Box) and len(obs.shape) == 1
    image = isinstance(obs, gym.spaces.Box) and len(obs.shape) == 3 and obs.dtype.name == "uint8"
    if not (vector or image):
        raise ConfigError(
            f"rl.env_id {env_id!r} observes {obs}; disttrain rl needs a vector (1-d Box) observation or stacked "
            "uint8 frames (the Atari games, ALE/...)"
        )
    shape = tuple(int(s) for s in obs.shape)
    return EnvSpec(math.prod(shape), int(act.n), shape, "uint8" if image else "float32")


def make_vec(env_id: str, n: int, seed: int) -> Any:
    """``n`` copies of ``env_id`` stepped together; when one ends, ``info["final_obs"]`` holds its last
    observation and the returned one is already the next episode's first."""
    gym = _gym()
    same_step = gym.vector.AutoresetMode.SAME_STEP
    if is_atari(env_id):
        env = gym.vector.SyncVectorEnv([lambda: make_one(env_id) for _ in range(n)], autoreset_mode=same_step)
    else:
        env = gym.make_vec(env_id, num_envs=n, vectorization_mode="sync", vector_kwargs={"autoreset_mode": same_step})
    env.action_space.seed(seed)
    return env
