"""The ``gymnax`` family of JAX envs: ``--env gymnax:NAME`` is gymnax's
environment ``NAME`` (classic control, MinAtar, bsuite, misc) as a
``fastpbrl.envs.jax_envs.JaxEnv`` (host-side construction; the functions
it returns are pure).

The adapter steps gymnax's ``step_env`` with no time limit, so that
``done`` is a termination only, and gives gymnax's own limit as the env's
``max_episode_steps`` (a truncation; see ``fastpbrl.envs.jax_envs``).
gymnax is imported when an env is made (the ``gymnax`` extra).
"""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
from acme import specs

from fastpbrl.envs.jax_envs import JaxEnv, JaxEnvError, register, spec_of

GYMNAX_EXTRA = "pip install 'fastpbrl[gymnax]'"
# gymnax applies its time limit in ``step_env`` (``done`` once ``state.time``
# reaches ``params.max_steps_in_episode``); the adapter steps with this limit
# instead, so that ``done`` is a termination only.
_NO_TIME_LIMIT = 2**30
# gymnax envs that fetch data from the internet when made.
_GYMNAX_DOWNLOADS = ('MNISTBandit-bsuite',)


@register('gymnax')
def make(env_id: str, name: str) -> JaxEnv:
  """gymnax's env ``name`` (the family's ``make``).

  Raises:
    JaxEnvError: gymnax is missing, has no env ``name`` (or one that
      downloads data), or its spaces are not ones fastpbrl serves.
  """
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
  observations = observation_spec(env_id, env.observation_space(params))
  actions = action_spec(env_id, env.action_space(params))
  untimed = params.replace(max_steps_in_episode=_NO_TIME_LIMIT)

  def reset(key):
    obs, state = env.reset_env(key, params)
    return state, obs.astype(observations.dtype).reshape(observations.shape)

  def step(state, action, key):
    obs, state, reward, done, _ = env.step_env(key, state, action, untimed)
    return (state, obs.astype(observations.dtype).reshape(observations.shape),
            jnp.asarray(reward, jnp.float32), jnp.asarray(done, bool))

  return JaxEnv(env_id, spec_of(observations, actions),
                int(params.max_steps_in_episode), reset, step)


def observation_spec(env_id: str, space) -> specs.Array:
  """The observation spec of a gymnax space: a ``Box`` only.

  Raises:
    JaxEnvError: another space.
  """
  shape = getattr(space, 'shape', None)
  if type(space).__name__ != 'Box' or shape is None:
    raise JaxEnvError(f'--env {env_id!r}: observation space '
                      f'{type(space).__name__} is not supported: fastpbrl '
                      'needs a Box observation')
  return specs.Array(tuple(shape), np.float32, name='observation')


def action_spec(env_id: str, space) -> specs.Array:
  """The action spec of a gymnax space: ``Discrete`` or a 1-D ``Box``.

  Raises:
    JaxEnvError: another space.
  """
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
