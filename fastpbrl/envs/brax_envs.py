"""The ``brax`` family of JAX envs: ``--env brax:NAME`` is Brax's
environment ``NAME`` (ant, halfcheetah, hopper, ...) as a
``fastpbrl.envs.jax_envs.JaxEnv`` (host-side construction; the functions
it returns are pure).

The adapter steps Brax's env itself, without its ``EpisodeWrapper`` (which
resets automatically and reports the time limit as ``done``; see
``fastpbrl.envs.jax_envs``). Brax is imported when an env is made (the
``brax`` extra).
"""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
from acme import specs

from fastpbrl.envs.jax_envs import JaxEnv, JaxEnvError, register, spec_of

BRAX_EXTRA = "pip install 'fastpbrl[brax]'"
# Brax's tasks have no time limit of their own; 1,000 steps is what its
# training code (``brax.envs.training.EpisodeWrapper``) and gymnasium's
# MuJoCo tasks use.
BRAX_EPISODE_STEPS = 1000


@register('brax')
def make(env_id: str, name: str) -> JaxEnv:
  """Brax's env ``name`` (the family's ``make``).

  Raises:
    JaxEnvError: Brax is missing or has no env ``name``.
  """
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

  return JaxEnv(env_id, spec_of(observations, actions), BRAX_EPISODE_STEPS,
                reset, step)
