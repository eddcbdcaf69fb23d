"""Data types shared by agents, the learner, the replay and the actors.

Two conventions hold everywhere in fastpbrl:

* **Population axis first.** Every array of a population (training state,
  hyperparameters, batches, metrics) has the population as its leading axis,
  so that a later change can shard that axis over devices without touching
  agent code.
* **Normalised continuous actions.** Continuous-control agents act in
  ``[-1, 1]^d``; :func:`scale_action` maps such an action to the env's bounds
  on the actor side. Exploration and target-smoothing noise scales are
  therefore fractions of the action range, as in the TD3 paper's
  ``0.1 * max_action``.
"""

from __future__ import annotations

from typing import Any, Mapping, NamedTuple

import jax
import numpy as np
from acme import specs

PRNGKey = jax.Array
Params = Any  # a haiku parameter pytree
Metrics = Mapping[str, jax.Array]

POPULATION_AXIS = 'population'
"""Name of the population axis: the learner's ``vmap`` binds it and the
population mesh (``fastpbrl.devices.sharding``) is named after it."""


class Transition(NamedTuple):
  """One environment step, or a batch of them (leading axes ``[..., B]``).

  ``terminated`` and ``truncated`` are kept apart: a TD target bootstraps
  through a time-limit truncation (``next_observation`` is the real next
  state) and never through a termination.
  """

  observation: Any  # [..., *obs_shape], float32 (uint8 for Atari frames)
  action: Any  # [..., action_dim] float32 in [-1, 1], or [...] int32
  reward: Any  # [...] float32
  next_observation: Any  # [..., *obs_shape], same dtype as observation
  terminated: Any  # [...] float32, 1.0 where the episode ended in a terminal state
  truncated: Any  # [...] float32, 1.0 where a time limit cut the episode


class Rollout(NamedTuple):
  """What an on-policy member learns from (``Agent.learns_from ==
  'rollout'``): ``T`` consecutive steps in each of its ``E`` envs, time
  first, ``[T, E, ...]`` on every field (``[I, T, E, ...]`` for the ``I``
  iterations of one learner call, ``[N, I, T, E, ...]`` for a population).

  Each env's steps are in the order it took them, so ``observation[t + 1,
  e]`` is ``next_observation[t, e]`` unless step ``t`` ended the episode
  (the env then reset). ``next_observation`` is the real next state also
  at a time-limit truncation, so the agent bootstraps through truncations
  with its value of that state (as Stable-Baselines3 adds ``discount x
  V(terminal observation)`` to the reward there) and never through a
  termination; the last step bootstraps from ``V(next_observation[T - 1])``.
  ``log_prob`` is the behaviour policy's log-probability of ``action``
  (``Agent.behave``'s), the denominator of PPO's ratio: a rollout collected
  by an older policy than the one that learns from it is corrected by the
  ratio, as in APPO.
  """

  observation: Any  # [T, E, *obs_shape]
  # [T, E, action_dim] float32 as the policy sampled it (a Gaussian's
  # sample, not clipped: the env gets it clipped to [-1, 1] and scaled to
  # its bounds), or [T, E] int32
  action: Any
  reward: Any  # [T, E] float32
  next_observation: Any  # [T, E, *obs_shape]
  terminated: Any  # [T, E] float32
  truncated: Any  # [T, E] float32
  log_prob: Any  # [T, E] float32, of the policy that acted


class ReplaySample(NamedTuple):
  """A learner call's data when the replay lives on the device: the call
  samples its ``[N, S, B, ...]`` batch itself (``fastpbrl.replay.device``).
  Learners take it wherever they take a ``Transition`` batch."""

  replay: Any  # fastpbrl.replay.device.DeviceReplayState (not donated)
  key: Any  # PRNGKey of this call's sampling


class LearnerCall(NamedTuple):
  """One learner call a data path ran
  (``fastpbrl.datapath.protocol.DataPath.learn``)."""

  state: Any  # the population's training state after the call
  metrics: Any  # the call's metrics (device arrays, read back later)
  # [N] int: update steps each member of the whole population kept (0 for
  # a member still warming up after a restart, and under a shared critic,
  # whose update is the population's, not a member's)
  member_update_steps: np.ndarray


def make_env_spec(env) -> specs.EnvironmentSpec:
  """Builds an acme ``EnvironmentSpec`` from a gymnasium environment.

  Args:
    env: a ``gymnasium.Env`` with a ``Box`` observation space and a ``Box`` or
      ``Discrete`` action space.

  Returns:
    The spec, with float32 observations (uint8 kept for image observations),
    ``BoundedArray`` actions for ``Box`` and ``DiscreteArray`` for
    ``Discrete``.

  Raises:
    ValueError: for a space fastpbrl does not support, naming it.
  """
  import gymnasium as gym  # local: the learner does not need gymnasium

  obs_space, act_space = env.observation_space, env.action_space
  if not isinstance(obs_space, gym.spaces.Box):
    raise ValueError(
        f'observation space {obs_space!r} is not supported: fastpbrl needs a '
        'gymnasium.spaces.Box observation (flatten dict observations first)')
  obs_dtype = np.uint8 if obs_space.dtype == np.uint8 else np.float32
  observations = specs.Array(obs_space.shape, obs_dtype, name='observation')
  if isinstance(act_space, gym.spaces.Discrete):
    actions = specs.DiscreteArray(int(act_space.n), name='action')
  elif isinstance(act_space, gym.spaces.Box) and len(act_space.shape) == 1:
    if not (np.all(np.isfinite(act_space.low))
            and np.all(np.isfinite(act_space.high))):
      raise ValueError(
          f'action space {act_space!r} is unbounded: continuous-control '
          'agents need finite action bounds')
    actions = specs.BoundedArray(
        act_space.shape, np.float32, act_space.low.astype(np.float32),
        act_space.high.astype(np.float32), name='action')
  else:
    raise ValueError(
        f'action space {act_space!r} is not supported: use a 1-D Box or a '
        'Discrete action space')
  return specs.EnvironmentSpec(
      observations=observations,
      actions=actions,
      rewards=specs.Array((), np.float32, name='reward'),
      discounts=specs.BoundedArray((), np.float32, 0.0, 1.0, name='discount'))


def scale_action(action: np.ndarray, action_spec: specs.BoundedArray) -> np.ndarray:
  """Maps an action in ``[-1, 1]^d`` to ``[minimum, maximum]`` of the spec."""
  low, high = action_spec.minimum, action_spec.maximum
  # np.clip's values, NaN included, by its two ufuncs: an actor calls this
  # every step, and np.clip's Python wrapper costs more than both.
  action = np.minimum(np.maximum(action, -1.0), 1.0)
  return low + (action + 1.0) * 0.5 * (high - low)


def random_transitions(spec: specs.EnvironmentSpec, leading: tuple,
                       seed: int = 0, terminated_fraction: float = 0.1,
                       truncated_fraction: float = 0.05) -> Transition:
  """Random transitions ``[*leading, ...]`` fitting ``spec``, as numpy arrays.

  For tests and benchmarks of agents (no environment needed): normal
  observations (uniform bytes for image specs), uniform actions in [-1, 1]
  (or uniform discrete actions), normal rewards, and the given fractions of
  terminated and truncated flags.
  """
  rng = np.random.default_rng(seed)
  obs_shape = (*leading, *spec.observations.shape)
  if spec.observations.dtype == np.uint8:
    obs = rng.integers(0, 256, obs_shape, dtype=np.uint8)
    next_obs = rng.integers(0, 256, obs_shape, dtype=np.uint8)
  else:
    obs = rng.standard_normal(obs_shape, np.float32)
    next_obs = rng.standard_normal(obs_shape, np.float32)
  if isinstance(spec.actions, specs.DiscreteArray):
    action = rng.integers(0, spec.actions.num_values, leading).astype(np.int32)
  else:
    action = rng.uniform(-1, 1, (*leading, *spec.actions.shape)).astype(
        np.float32)
  return Transition(
      observation=obs, action=action,
      reward=rng.standard_normal(leading, np.float32),
      next_observation=next_obs,
      terminated=(rng.uniform(size=leading) < terminated_fraction).astype(
          np.float32),
      truncated=(rng.uniform(size=leading) < truncated_fraction).astype(
          np.float32))


class EpisodeRecord(NamedTuple):
  """One completed episode of one member.

  Fields read as attributes (``r.episode_return``) or, for code that treats
  records as rows, by name (``r['episode_return']``).
  """

  member: int
  episode_return: float  # undiscounted sum of env rewards
  episode_length: int  # env steps in the episode
  evaluation: bool  # True: played without exploration noise
  # The member's training env steps when it ended; for an evaluation
  # episode, when its evaluation started: the steps of the policy it played.
  env_steps: int
  policy_version: int  # param store version in use when it ended
  start_policy_version: int = 0  # param store version when it started
  # info['true_objective'] at the episode's end (NaN when the env gives none)
  true_objective: float = float('nan')

  def __getitem__(self, key):
    if isinstance(key, str):
      if key not in self._fields:
        raise KeyError(key)
      return getattr(self, key)
    return tuple.__getitem__(self, key)


def episode_record(record) -> EpisodeRecord:
  """``record`` as an ``EpisodeRecord`` (a dict of its fields, as older
  recordings hold, or one already)."""
  if isinstance(record, EpisodeRecord):
    return record
  return EpisodeRecord(**{k: record[k] for k in EpisodeRecord._fields
                          if k in record})
