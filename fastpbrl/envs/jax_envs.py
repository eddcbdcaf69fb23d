"""Environments written in JAX (gymnax, Brax), for the on-device data path.

An ``--env`` id ``provider:name`` whose provider is one of ``PROVIDERS``
(``gymnax:Pendulum-v1``, ``brax:hopper``) names a pure-JAX environment.
The run then steps it inside the learner's compiled call
(``fastpbrl.learner.collect``) instead of in actor processes. Everything here is
host-side construction; what it returns is pure functions.

The contract every provider's adapter fills, :class:`JaxEnv`:

* ``reset(key) -> (env_state, observation)``: a new episode;
* ``step(env_state, action, key) -> (env_state, observation, reward,
  terminated)``: one step, with **no automatic reset and no time limit**;
  ``action`` is in the env's own units (``fastpbrl.learner.collect`` scales the
  agents' ``[-1, 1]`` actions to the bounds of ``env_spec``, as the
  actors do with ``scale_action``); ``terminated`` is a true end of the
  episode (a fallen hopper), never a time limit;
* ``max_episode_steps``: the time limit, applied by ``fastpbrl.learner.collect`` as
  a truncation, as gymnasium's ``TimeLimit`` does.

Keeping termination and truncation apart is why the adapters do not use
the providers' own episode wrappers: gymnax's ``step`` and Brax's
``EpisodeWrapper`` reset automatically and report the time limit as
``done``, so the real next observation of a truncated step, which the TD
target bootstraps from, would be lost.

:class:`GymnasiumView` wraps a ``JaxEnv`` as a ``gymnasium.Env`` (one
instance, jitted reset and step), so that the host-side tools that play
episodes one at a time (``fastpbrl evaluate``, ``fastpbrl.load_policy``,
videos) take these ids unchanged.
"""

from __future__ import annotations

import functools
from typing import Any, Callable, NamedTuple

import gymnasium as gym
import jax
import jax.numpy as jnp
import numpy as np
from acme import specs

from fastpbrl.envs import shaping

GYMNAX_EXTRA = "pip install 'fastpbrl[gymnax]'"
BRAX_EXTRA = "pip install 'fastpbrl[brax]'"
# Brax's tasks have no time limit of their own; 1,000 steps is what its
# training code (``brax.envs.training.EpisodeWrapper``) and gymnasium's
# MuJoCo tasks use.
BRAX_EPISODE_STEPS = 1000
# gymnax applies its time limit in ``step_env`` (``done`` once ``state.time``
# reaches ``params.max_steps_in_episode``); the adapter steps with this limit
# instead, so that ``done`` is a termination only.
_NO_TIME_LIMIT = 2**30
# gymnax envs that fetch data from the internet when made.
_GYMNAX_DOWNLOADS = ('MNISTBandit-bsuite',)


class JaxEnvError(ValueError):
  """An env id that cannot be made; the message names ``--env``."""


class JaxEnv(NamedTuple):
  """A pure-JAX environment, as ``fastpbrl.learner.collect`` steps it.

  An env with parameters searched as hyperparameters
  (``fastpbrl.envs.params``) also gives ``env_params`` (``(name,
  EnvParam)`` pairs), ``with_params(env_state, values) -> env_state`` (the
  state acting with ``{name: scalar}``) and, for its fitness,
  ``objective(env_state)``: the task's own score of the episode so far
  (the true objective a shaped reward departs from).
  """

  env_id: str
  env_spec: specs.EnvironmentSpec
  max_episode_steps: int
  reset: Callable[[jax.Array], tuple[Any, jax.Array]]
  step: Callable[[Any, jax.Array, jax.Array], tuple[Any, jax.Array,
                                                    jax.Array, jax.Array]]
  env_params: tuple = ()
  with_params: Callable[[Any, dict], Any] | None = None
  objective: Callable[[Any], jax.Array] | None = None


def provider_of(env_id: str) -> str | None:
  """The provider of a JAX env id (``'gymnax'``), or None for any other."""
  prefix, sep, _ = env_id.partition(':')
  return prefix if sep and prefix in PROVIDERS else None


def is_jax_env(env_id: str) -> bool:
  """Whether ``env_id`` names a JAX environment (``gymnax:...``,
  ``brax:...``)."""
  return provider_of(env_id) is not None


@functools.cache
def make(env_id: str) -> JaxEnv:
  """The ``JaxEnv`` of ``env_id`` (cached: its functions are pure).

  Raises:
    JaxEnvError: not a JAX env id, an unknown name, a missing extra, or a
      space fastpbrl's agents cannot serve; one line naming ``--env``.
  """
  provider = provider_of(env_id)
  if provider is None:
    raise JaxEnvError(f'--env {env_id!r} is not a JAX env id; those start '
                      f'with one of {", ".join(f"{p}:" for p in PROVIDERS)}')
  return PROVIDERS[provider](env_id, env_id.partition(':')[2])


# ------------------------------------------------------------------ gymnax


def _gymnax(env_id: str, name: str) -> JaxEnv:
  try:
    import gymnax  # noqa: PLC0415 (optional: the gymnax extra)
  except ImportError as e:
    raise JaxEnvError(f'--env {env_id!r} needs gymnax ({e}): '
                      f'{GYMNAX_EXTRA}') from None
  if name not in gymnax.registered_envs or name in _GYMNAX_DOWNLOADS:
    known = [k for k in gymnax.registered_envs if k not in _GYMNAX_DOWNLOADS]
    why = ('downloads its data at run time' if name in _GYMNAX_DOWNLOADS
           else 'is not a gymnax env')
    raise JaxEnvError(f'--env {env_id!r}: {name} {why}; gymnax has '
                      f'{", ".join(known)}')
  env, params = gymnax.make(name)
  observations = _gymnax_observations(env_id, env.observation_space(params))
  actions = _gymnax_actions(env_id, env.action_space(params))
  untimed = params.replace(max_steps_in_episode=_NO_TIME_LIMIT)

  def reset(key):
    obs, state = env.reset_env(key, params)
    return state, obs.astype(observations.dtype).reshape(observations.shape)

  def step(state, action, key):
    obs, state, reward, done, _ = env.step_env(key, state, action, untimed)
    return (state, obs.astype(observations.dtype).reshape(observations.shape),
            jnp.asarray(reward, jnp.float32), jnp.asarray(done, bool))

  return JaxEnv(env_id, _spec(observations, actions),
                int(params.max_steps_in_episode), reset, step)


def _gymnax_observations(env_id: str, space) -> specs.Array:
  shape = getattr(space, 'shape', None)
  if type(space).__name__ != 'Box' or shape is None:
    raise JaxEnvError(f'--env {env_id!r}: observation space '
                      f'{type(space).__name__} is not supported: fastpbrl '
                      'needs a Box observation')
  return specs.Array(tuple(shape), np.float32, name='observation')


def _gymnax_actions(env_id: str, space) -> specs.Array:
  kind = type(space).__name__
  if kind == 'Discrete':
    return specs.DiscreteArray(int(space.n), name='action')
  shape = tuple(np.shape(np.zeros(space.shape))) if kind == 'Box' else None
  if kind != 'Box' or len(shape) != 1:
    raise JaxEnvError(f'--env {env_id!r}: action space {kind} '
                      f'{shape or ""} is not supported: use a 1-D Box or a '
                      'Discrete action space')
  low = np.broadcast_to(np.asarray(space.low, np.float32), shape)
  high = np.broadcast_to(np.asarray(space.high, np.float32), shape)
  return specs.BoundedArray(shape, np.float32, low, high, name='action')


# -------------------------------------------------------------------- brax


def _brax(env_id: str, name: str) -> JaxEnv:
  try:
    from brax import envs as brax_envs  # noqa: PLC0415 (the brax extra)
  except ImportError as e:
    raise JaxEnvError(f'--env {env_id!r} needs Brax ({e}): '
                      f'{BRAX_EXTRA}') from None
  known = sorted(brax_envs._envs)  # noqa: SLF001 (Brax lists no other way)
  if name not in known:
    raise JaxEnvError(f'--env {env_id!r}: Brax has no {name!r}; it has '
                      f'{", ".join(known)}')
  env = brax_envs.get_environment(name)
  n = int(env.action_size)
  observations = specs.Array((int(env.observation_size),), np.float32,
                             name='observation')
  # Brax's actuators take actions in [-1, 1] (their control ranges).
  actions = specs.BoundedArray((n,), np.float32, -np.ones(n, np.float32),
                               np.ones(n, np.float32), name='action')

  def reset(key):
    state = env.reset(key)
    return state, jnp.asarray(state.obs, jnp.float32)

  def step(state, action, key):
    del key  # Brax's dynamics are deterministic
    state = env.step(state, action)
    return (state, jnp.asarray(state.obs, jnp.float32),
            jnp.asarray(state.reward, jnp.float32),
            jnp.asarray(state.done) > 0)

  return JaxEnv(env_id, _spec(observations, actions), BRAX_EPISODE_STEPS,
                reset, step)


# ------------------------------------------------------------------ shaped


class ShapedState(NamedTuple):
  """The state of a shaped env: the task's own, the member's shaping
  coefficient and the unshaped return of the episode so far."""

  inner: Any
  energy_bonus: jax.Array
  true_return: jax.Array


def _shaped(env_id: str, name: str) -> JaxEnv:
  """gymnax's ``name`` with ``fastpbrl.envs.shaping``'s energy bonus, its
  coefficient an env parameter (``fastpbrl.envs.params``)."""
  if name not in shaping.SHAPED_TASKS:
    raise JaxEnvError(f'--env {env_id!r}: no shaped version of {name}; '
                      f'shaped tasks: {", ".join(shaping.SHAPED_TASKS)}')
  inner = _gymnax(env_id, name)
  default = shaping.ENV_PARAMS['energy_bonus'].default

  def energy(state):
    return shaping.energy(state.position, state.velocity, jnp.sin)

  def reset(key):
    state, obs = inner.reset(key)
    return ShapedState(state, jnp.float32(default), jnp.float32(0)), obs

  def step(state, action, key):
    env_state, obs, reward, terminated = inner.step(state.inner, action, key)
    bonus = state.energy_bonus * (energy(env_state) - energy(state.inner))
    new = ShapedState(env_state, state.energy_bonus,
                      state.true_return + reward)
    return new, obs, (reward + bonus).astype(jnp.float32), terminated

  def with_params(state, values):
    return state._replace(
        energy_bonus=jnp.asarray(values['energy_bonus'], jnp.float32))

  return inner._replace(
      reset=reset, step=step, env_params=tuple(shaping.ENV_PARAMS.items()),
      with_params=with_params, objective=lambda state: state.true_return)


PROVIDERS: dict[str, Callable[[str, str], JaxEnv]] = {
    'gymnax': _gymnax, 'brax': _brax, 'shaped': _shaped}


def _spec(observations, actions) -> specs.EnvironmentSpec:
  return specs.EnvironmentSpec(
      observations=observations, actions=actions,
      rewards=specs.Array((), np.float32, name='reward'),
      discounts=specs.BoundedArray((), np.float32, 0.0, 1.0, name='discount'))


# ------------------------------------------------------ gymnasium's view


class GymnasiumView(gym.Env):
  """One instance of a ``JaxEnv`` as a ``gymnasium.Env`` (jitted reset and
  step, numpy in and out, the time limit as ``truncated``).

  For the host-side tools that play episodes one at a time; training on a
  JAX env steps it on the device instead (``fastpbrl.learner.collect``).
  """

  metadata = {'render_modes': []}

  def __init__(self, env_id: str):
    self.jax_env = make(env_id)
    spec = self.jax_env.env_spec
    self.observation_space = gym.spaces.Box(
        -np.inf, np.inf, spec.observations.shape, np.float32)
    if isinstance(spec.actions, specs.DiscreteArray):
      self.action_space = gym.spaces.Discrete(spec.actions.num_values)
    else:
      self.action_space = gym.spaces.Box(spec.actions.minimum,
                                         spec.actions.maximum,
                                         spec.actions.shape, np.float32)
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
