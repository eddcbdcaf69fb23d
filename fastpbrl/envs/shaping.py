"""Reward shaping with a searched coefficient: the library's example of
environment parameters (``fastpbrl.envs.params``), the same task on both
data paths.

MountainCar-v0 (Moore 1990; gymnasium's, and gymnax's port of it, with the
same dynamics): an underpowered car in a valley, -1 reward a step until it
reaches the flag on the right hill, at most 200 steps. An agent that never
reaches the flag sees the same return, -200, whatever it does, so PPO at
its defaults rarely learns it.

The shaped task adds an energy bonus, ``energy_bonus x (phi(s') -
phi(s))``, where ``phi`` is the car's mechanical energy (kinetic plus
potential, in the task's own units; ``energy``), scaled so that standing
at the bottom is about -0.25 and the flag at full speed about 1.
Pumping the car up the hills gains energy, so the bonus rewards the
swinging that reaches the flag long before the flag is reached.

It is potential-based shaping (Ng, Harada and Russell 1999, with the
undiscounted difference ``phi(s') - phi(s)``: the bonus of an episode sums
to ``energy_bonus x (phi(last) - phi(first))``), so it changes which
behaviour is learnt first, not which is best. The true objective, the
unshaped return, is what ``--true-objective`` selects members on: each
episode reports it, ``info['true_objective']`` through the actors,
``objective`` on the device.

Ids: ``fastpbrl.envs.shaping:ShapedMountainCar-v0`` (gymnasium, through the
actors: ``EnergyShaping``) and ``shaped:MountainCar-v0`` (gymnax, on the
device; the ``gymnax`` extra): ``shaped`` is a JAX env family
(``fastpbrl.envs.jax_envs``), registered here, the example of one that
declares env parameters (``make_shaped``). The parameter is
``energy_bonus``, the hyperparameter ``env_energy_bonus``: 0 (no shaping)
by default, searched over ``[0, 100]``.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import gymnasium as gym
import jax
import jax.numpy as jnp
import numpy as np

from fastpbrl.core import search_space as ss
from fastpbrl.envs import gymnax_envs
from fastpbrl.envs.jax_envs import JaxEnv, JaxEnvError, register
from fastpbrl.envs.params import EnvParam

# MountainCar's gravity term (gymnasium's ``gravity``, gymnax's
# ``EnvParams.gravity``): the hill's height is sin(3 x) / 3 in the units in
# which velocity changes by ``GRAVITY x height'`` a step.
GRAVITY = 0.0025
# phi of standing on the flag's hill top at the velocity limit: the scale.
_SCALE = 0.5 * 0.07**2 + GRAVITY * np.sin(3 * 0.5) / 3

ENV_PARAMS = {
    'energy_bonus': EnvParam(
        default=0.0,
        domain=ss.HParamDomain(
            'weight of the bonus for the mechanical energy a step gains '
            '(potential-based reward shaping)', 'reward per unit of energy',
            low=0.0),
        prior=ss.Uniform(0.0, 100.0)),
}
SHAPED_TASKS = ('MountainCar-v0',)


def energy(position, velocity, sin=np.sin):
  """``phi``: the car's kinetic plus potential energy, scaled (``sin``:
  ``jax.numpy.sin`` for jax arrays)."""
  return (0.5 * velocity**2 + GRAVITY * sin(3 * position) / 3) / _SCALE


class EnergyShaping(gym.Wrapper):
  """MountainCar-v0 with the energy bonus (the module docstring); its
  ``energy_bonus`` is set by ``set_env_params`` (the actors call it with
  their member's value), and each episode's unshaped return goes to
  ``info['true_objective']`` at its last step."""

  env_params = ENV_PARAMS

  def __init__(self, env: gym.Env):
    super().__init__(env)
    self.energy_bonus = ENV_PARAMS['energy_bonus'].default
    self._true_return = 0.0

  def set_env_params(self, values) -> None:
    """Takes ``{'energy_bonus': float}`` from the next step on."""
    self.energy_bonus = float(values['energy_bonus'])

  def reset(self, **kwargs):
    self._true_return = 0.0
    return self.env.reset(**kwargs)

  def step(self, action):
    before = energy(*self.env.unwrapped.state)
    obs, reward, terminated, truncated, info = self.env.step(action)
    after = energy(*self.env.unwrapped.state)
    self._true_return += float(reward)
    if terminated or truncated:
      info = {**info, 'true_objective': self._true_return}
    return (obs, float(reward) + self.energy_bonus * (after - before),
            terminated, truncated, info)


class ShapedState(NamedTuple):
  """The state of a shaped JAX env: the task's own, the member's shaping
  coefficient and the unshaped return of the episode so far."""

  inner: Any
  energy_bonus: jax.Array
  true_return: jax.Array


@register('shaped')
def make_shaped(env_id: str, name: str) -> JaxEnv:
  """The ``shaped`` family's ``make``: gymnax's ``name`` with the energy
  bonus, its coefficient an env parameter (``fastpbrl.envs.params``); the
  env's ``objective`` is the unshaped return.

  Raises:
    JaxEnvError: no shaped version of ``name``, or gymnax is missing.
  """
  if name not in SHAPED_TASKS:
    raise JaxEnvError(f'--env {env_id!r}: no shaped version of {name}; '
                      f'shaped tasks: {", ".join(SHAPED_TASKS)}')
  inner = gymnax_envs.make(env_id, name)
  default = ENV_PARAMS['energy_bonus'].default

  def state_energy(state):
    return energy(state.position, state.velocity, jnp.sin)

  def reset(key):
    state, obs = inner.reset(key)
    return ShapedState(state, jnp.float32(default), jnp.float32(0)), obs

  def step(state, action, key):
    env_state, obs, reward, terminated = inner.step(state.inner, action, key)
    bonus = state.energy_bonus * (state_energy(env_state)
                                  - state_energy(state.inner))
    new = ShapedState(env_state, state.energy_bonus,
                      state.true_return + reward)
    return new, obs, (reward + bonus).astype(jnp.float32), terminated

  def with_params(state, values):
    return state._replace(
        energy_bonus=jnp.asarray(values['energy_bonus'], jnp.float32))

  return inner._replace(
      reset=reset, step=step, env_params=tuple(ENV_PARAMS.items()),
      with_params=with_params, objective=lambda state: state.true_return)


def _make_shaped_mountain_car(**kwargs) -> gym.Env:
  return EnergyShaping(gym.make('MountainCar-v0', **kwargs))


if 'ShapedMountainCar-v0' not in gym.registry:
  gym.register(id='ShapedMountainCar-v0',
               entry_point=_make_shaped_mountain_car)
