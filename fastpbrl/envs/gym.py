"""Environment construction: a gymnasium id to a ready environment.

Host-side module (gymnasium wrappers, numpy; nothing here is jittable:
``GymnasiumView`` jits a JAX env's own functions).

:func:`make_env` is the one place where fastpbrl turns an ``--env`` id into
an environment: the run's spec probe (``run.make_env_spec``), every actor
(``pipeline``) and the learner-side evaluation (``evaluation``) call it, so
that they all see the same observations.

A JAX env id (``gymnax:Pendulum-v1``, ``fastpbrl.envs.jax_envs``) gives one
instance of it as a gymnasium env (``GymnasiumView``: training steps those
on the device; the host-side tools that play episodes one at a time,
``fastpbrl evaluate``, ``fastpbrl.load_policy`` and videos, take these ids
unchanged).
Most ids go straight to ``gymnasium.make``. Atari ids (the ``ALE/``
namespace of ale-py, e.g. ``ALE/Pong-v5``, and ale-py's older ``...-v4``
ids) get the preprocessing of Nature DQN (Mnih et al. 2015, "Human-level
control through deep reinforcement learning", Methods, "Preprocessing" and
"Training details"), built from gymnasium's own wrappers:

1. ``gymnasium.make(env_id, frameskip=1)``: the emulator steps one frame;
2. ``AtariPreprocessing(noop_max=30, frame_skip=4, screen_size=84,
   grayscale_obs=True, terminal_on_life_loss=False)``: up to 30 no-ops at
   reset, each action repeated for 4 frames with the max over the last two,
   the luminance rescaled to 84x84 uint8;
3. ``FrameStackObservation(stack_size=4)``: the last 4 frames, ``[4, 84,
   84]``, moved to ``[84, 84, 4]`` (channels last, what the Nature CNN in
   ``agents/networks.py`` takes);
4. ``ClipReward(-1, 1)``: rewards clipped to ``[-1, 1]``. The unclipped
   game score of the episode is put in ``info['true_objective']`` at its
   last step, so that episode records keep it (``--true-objective`` makes
   PBT select on it).

Departures from the paper, each kept from ale-py's ``v5`` protocol
(Machado et al. 2018, "Revisiting the Arcade Learning Environment"):
``v5`` ids repeat the previous action with probability 0.25 ("sticky
actions"; Nature's emulator was deterministic) and cut an episode after
108,000 frames (30 minutes of play) as a truncation; and a lost life does
not end the episode (Nature's training marked it terminal). A ``v4`` id
such as ``PongNoFrameskip-v4`` gives the deterministic emulator.

The ROMs ship inside the ale-py wheel (>= 0.9); nothing is downloaded.
"""

from __future__ import annotations

import functools

import gymnasium as gym
import jax
import jax.numpy as jnp
import numpy as np
from acme import specs

from fastpbrl.core.imports import add_cwd_to_path
from fastpbrl.envs import jax_envs
from fastpbrl.envs import params as env_params
from fastpbrl.envs.jax_envs import is_jax_env

ATARI_EXTRA = "pip install -e '.[atari]' (ale-py and OpenCV)"

FRAME_SKIP = 4  # emulator frames per agent step (Nature's "action repeat")
SCREEN_SIZE = 84  # frames are rescaled to SCREEN_SIZE x SCREEN_SIZE
FRAME_STACK = 4  # frames per observation (Nature's "agent history length")
NOOP_MAX = 30  # most no-op actions at the start of an episode


@functools.cache
def _register_ale() -> bool:
  """Registers ale-py's environments with gymnasium; False without ale-py."""
  try:
    import ale_py  # noqa: PLC0415 (optional: the atari extra)
  except ImportError:
    return False
  gym.register_envs(ale_py)
  return True


def is_atari(env_id: str) -> bool:
  """Whether ``env_id`` is an ale-py (Atari) environment.

  Raises:
    gymnasium.error.DependencyNotInstalled: an ``ALE/`` id without ale-py.
  """
  has_ale = _register_ale()
  if env_id.startswith('ALE/') and not has_ale:
    raise gym.error.DependencyNotInstalled(
        f'{env_id} is an Atari game: {ATARI_EXTRA}')
  if not has_ale:
    return False
  try:
    entry_point = gym.spec(env_id).entry_point
  except gym.error.Error:
    return False
  return isinstance(entry_point, str) and entry_point.startswith('ale_py')


def make_env(env_id: str, **kwargs) -> gym.Env:
  """A new environment for ``env_id``; Atari ids get Nature's preprocessing.

  ``kwargs`` go to ``gymnasium.make`` (``render_mode='rgb_array'`` for
  videos). An id ``module:EnvId`` imports ``module`` first, which registers
  the env (gymnasium's convention).

  Raises:
    gymnasium.error.Error: the id is unknown, or a dependency is missing
      (the message says what to install).
    ImportError: the ``module`` of a ``module:EnvId`` id does not import.
  """
  if is_jax_env(env_id):  # gymnax:..., brax:..., a family's: jitted
    return GymnasiumView(env_id)
  if not is_atari(env_id):
    return gym.make(env_id, **kwargs)
  return atari_preprocessing(gym.make(env_id, frameskip=1, **kwargs))


def atari_preprocessing(env: gym.Env) -> gym.Env:
  """Nature DQN's wrappers (module docstring) around an ALE env that steps
  one frame at a time; observations ``[84, 84, 4]`` uint8."""
  try:
    env = gym.wrappers.AtariPreprocessing(
        env, noop_max=NOOP_MAX, frame_skip=FRAME_SKIP, screen_size=SCREEN_SIZE,
        grayscale_obs=True, terminal_on_life_loss=False, scale_obs=False)
  except gym.error.DependencyNotInstalled as e:  # OpenCV, for the rescale
    raise gym.error.DependencyNotInstalled(f'{e}; or {ATARI_EXTRA}') from None
  env = gym.wrappers.FrameStackObservation(env, stack_size=FRAME_STACK)
  stacked = env.observation_space
  env = gym.wrappers.TransformObservation(
      env, _channels_last, gym.spaces.Box(
          low=_channels_last(stacked.low), high=_channels_last(stacked.high),
          dtype=stacked.dtype))
  env = GameScore(env)
  return gym.wrappers.ClipReward(env, min_reward=-1.0, max_reward=1.0)


def _channels_last(frames: np.ndarray) -> np.ndarray:
  """``[stack, H, W]`` to ``[H, W, stack]``."""
  return np.moveaxis(frames, 0, -1)


class GameScore(gym.Wrapper):
  """Puts the episode's sum of (unclipped) rewards in
  ``info['true_objective']`` on its last step.

  Wrapped inside reward clipping, it keeps the game score that Nature DQN
  reports, while the agent learns from (and the logs sum) clipped rewards.
  """

  def __init__(self, env: gym.Env):
    super().__init__(env)
    self._score = 0.0

  def reset(self, **kwargs):
    self._score = 0.0
    return self.env.reset(**kwargs)

  def step(self, action):
    obs, reward, terminated, truncated, info = self.env.step(action)
    self._score += float(reward)
    if terminated or truncated:
      info = {**info, 'true_objective': self._score}
    return obs, reward, terminated, truncated, info


@functools.cache
def parameters_of(env_id: str) -> dict:
  """``{name: EnvParam}`` the env of ``env_id`` declares
  (``fastpbrl.envs.params``: a JAX env's ``env_params``, a gymnasium env's
  or wrapper's); ``{}`` for an env without parameters.

  Raises:
    env_params.DeclarationError: a declaration that contradicts itself.
    What making the env raises (an unknown id, a missing extra).
  """
  if ':' in env_id and not is_jax_env(env_id):
    add_cwd_to_path()  # 'mymod:Point-v0': mymod may sit where it runs
  if is_jax_env(env_id):
    return env_params.declared(jax_envs.make(env_id))
  env = make_env(env_id)
  try:
    return env_params.declared(env)
  finally:
    env.close()


class GymnasiumView(gym.Env):
  """One instance of a ``JaxEnv`` as a ``gymnasium.Env`` (jitted reset and
  step, numpy in and out, the time limit as ``truncated``).

  For the host-side tools that play episodes one at a time; training on a
  JAX env steps it on the device instead (``fastpbrl.learner.collect``).
  """

  metadata = {'render_modes': []}

  def __init__(self, env_id: str):
    self.jax_env = jax_envs.make(env_id)
    spec = self.jax_env.env_spec
    self.observation_space = gym.spaces.Box(
        -np.inf, np.inf, spec.observations.shape, np.float32)
    if isinstance(spec.actions, specs.DiscreteArray):
      self.action_space = gym.spaces.Discrete(spec.actions.num_values)
    else:
      shape = spec.actions.shape  # bounds may be scalars in a family's spec
      self.action_space = gym.spaces.Box(
          np.broadcast_to(spec.actions.minimum, shape),
          np.broadcast_to(spec.actions.maximum, shape), shape, np.float32)
    self._reset = jax.jit(self.jax_env.reset)
    self._step = jax.jit(self.jax_env.step)
    self._key = jax.random.PRNGKey(0)
    self._state = None
    self._t = 0

  def reset(self, *, seed: int | None = None, options=None):
    super().reset(seed=seed)
    if seed is not None:
      self._key = jax.random.PRNGKey(seed)
    self._key, key = jax.random.split(self._key)
    self._state, obs = self._reset(key)
    self._t = 0
    return np.asarray(obs), {}

  def step(self, action):
    if self._state is None:
      raise RuntimeError('call reset() before step()')
    self._key, key = jax.random.split(self._key)
    self._state, obs, reward, terminated = self._step(
        self._state, jnp.asarray(action), key)
    self._t += 1
    truncated = self._t >= self.jax_env.max_episode_steps
    return (np.asarray(obs), float(reward), bool(terminated), truncated, {})
