"""The envs one actor steps: a batch of one gymnasium env per member.

Host-side module (gymnasium, numpy; nothing here is jittable).

An :class:`EnvBatch` holds ``M`` environments made by the same ``env_fn``
and steps them together: :meth:`EnvBatch.step` takes the ``[M, ...]``
actions and returns the ``[M, ...]`` results of one step of every env.
The contract, which the actor relies on and ``tests/test_env_batch.py``
checks for every batch against gymnasium's own ``step``:

* ``step`` returns gymnasium's observation, reward, ``terminated`` and
  ``truncated`` for each env, the time limit of ``gymnasium.make`` (its
  ``TimeLimit`` wrapper) included; where an episode ended, the observation
  is its real last one. The batch does NOT reset an env whose episode
  ended: the actor records the episode and calls :meth:`EnvBatch.reset`.
* ``reset(j, seed)`` resets env ``j`` through gymnasium (its wrappers and
  its ``np_random``), so a seed gives the initial state it gives
  ``gymnasium.make(...).reset(seed=seed)``.
* ``step(actions, active)`` steps only the envs ``active`` flags (the
  evaluation envs whose episode is still under way); the others are left
  as they are, time limit included, and their rows of the result mean
  nothing.

:class:`SerialEnvs` serves every env: it calls each env's ``step`` in
turn. The vectorized batches of ``fastpbrl.actors.vector_envs`` serve the
envs they know with one numpy computation for all ``M`` envs.
"""

from __future__ import annotations

import abc
from typing import Mapping, NamedTuple, Sequence

import gymnasium as gym
import numpy as np

from fastpbrl.envs import params as env_params


class EnvStep(NamedTuple):
  """One step of every env of a batch."""

  observation: np.ndarray  # [M, ...]; an ended episode's last observation
  reward: np.ndarray  # [M] float64
  terminated: np.ndarray  # [M] bool
  truncated: np.ndarray  # [M] bool
  true_objective: np.ndarray  # [M] info['true_objective'], NaN where none


class EnvBatch(abc.ABC):
  """``M`` environments stepped together (module docstring: the contract)."""

  def __init__(self, envs: Sequence[gym.Env]):
    if not envs:
      raise ValueError('an env batch needs at least one env')
    self.envs = list(envs)

  @property
  def size(self) -> int:
    return len(self.envs)

  def reset(self, j: int, seed: int | None = None) -> np.ndarray:
    """Resets env ``j`` (with ``seed``, or continuing its generator);
    returns its first observation."""
    return self.envs[j].reset(seed=seed)[0]

  @abc.abstractmethod
  def step(self, actions: np.ndarray,
           active: np.ndarray | None = None) -> EnvStep:
    """Steps every env (or those ``active``, ``[M]`` bool, flags) with its
    row of ``actions`` (the env's units)."""

  def set_env_params(self, values: Mapping[str, np.ndarray],
                     which: Sequence[int] | None = None) -> None:
    """Env ``j`` (each of ``which``; default: every env) acts with
    ``{name: values[name][j]}`` from its next step (``set_env_params`` of
    an env with parameters, ``fastpbrl.envs.params``); nothing for ``{}``."""
    if not values:
      return
    for j in range(self.size) if which is None else which:
      env_params.setter(self.envs[j])(
          {name: float(v[j]) for name, v in values.items()})

  def close(self) -> None:
    for env in self.envs:
      try:
        env.close()
      except Exception:  # closing is best effort at shutdown
        pass


class SerialEnvs(EnvBatch):
  """Any gymnasium envs, each stepped by its own ``step`` in turn."""

  def __init__(self, envs: Sequence[gym.Env]):
    super().__init__(envs)
    space = self.envs[0].observation_space
    self._obs = np.zeros((self.size, *space.shape), space.dtype)

  def step(self, actions: np.ndarray,
           active: np.ndarray | None = None) -> EnvStep:
    m = self.size
    reward = np.zeros(m, np.float64)
    terminated = np.zeros(m, bool)
    truncated = np.zeros(m, bool)
    objective = np.full(m, np.nan)
    for j in stepped(m, active):
      obs, reward[j], terminated[j], truncated[j], info = self.envs[j].step(
          actions[j])
      self._obs[j] = obs
      objective[j] = true_objective(info)
    return EnvStep(self._obs.copy(), reward, terminated, truncated, objective)


def stepped(size: int, active: np.ndarray | None):
  """The envs a step with ``active`` steps: all of ``size``, or those it
  flags."""
  return range(size) if active is None else np.flatnonzero(active)


def true_objective(info: dict) -> float:
  """``info['true_objective']`` as a float, NaN when the env reports none."""
  value = info.get('true_objective') if isinstance(info, dict) else None
  return float('nan') if value is None else float(value)
