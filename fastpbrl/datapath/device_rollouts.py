"""The on-device data path of agents that learn from their own rollouts
(``Agent.learns_from == 'rollout'``: PPO, A2C) in environments written in
JAX (host-side driver; the work is ``fastpbrl.learner.collect.rollout`` and
``PopulationLearner.update_with_rollouts``).

::

  learner call = jit(scan over I iterations:
                   every member behaves in its E envs for T steps
                     with its current policy          (collect.rollout)
                   -> one iteration of agent.update on that [T, E] rollout)

with ``T = rollout_length``, ``E = num_envs`` (the agent's config) and ``I
x T x E`` = the learner's steps per call (``steps_per_call``): an
on-policy member's update steps are the env steps it learned from. No
transition or parameter crosses to the host inside a call; after it, only
the ``[I, T, N, E]`` episode flags and returns do.

:class:`DeviceRollouts` implements ``fastpbrl.datapath.protocol.DataPath``
with the host-side parts of ``fastpbrl.datapath.device_family.DeviceEnvs``
(counters, episodes, evaluations, restarts, checkpoints, wait
statistics), as ``DevicePipeline`` does for replay agents. What differs from it:

* **Synchronous.** The policy that collects an iteration's rollout is the
  one that learns from it (``Rollout.log_prob`` is the learning policy's),
  within a call and across calls.
* **No replay, no warm-up.** A member acts with its policy from its first
  step; every call learns from the data it collects (nothing is owed at
  the end of the budget), and PBT's exploit has no data to copy.
* **Resume.** Each checkpoint holds the envs' states, keys and counters
  (``checkpoint_state``): a resumed run is the run never stopped, bit for
  bit, with or without ``--checkpoint-replay`` (there is no replay).
* **Several processes** as ``DevicePipeline``: the envs are global arrays
  split by member with the learner's mesh.
"""

from __future__ import annotations

import dataclasses
import logging
from typing import Sequence

import jax
import numpy as np

from fastpbrl.core.types import LearnerCall
from fastpbrl.datapath.common import NoReplay
from fastpbrl.datapath.device_family import DeviceEnvs, host_key
from fastpbrl.envs import jax_envs
from fastpbrl.learner import collect

log = logging.getLogger(__name__)


class DeviceRollouts(DeviceEnvs):
  """Envs and rollouts of a population of rollout agents on the device
  (host-side driver, not jittable): a ``fastpbrl.datapath.protocol.DataPath``,
  built by ``fastpbrl.datapath.factory.create`` for a JAX env and an agent that
  learns from its own rollouts."""

  def __init__(self, env: jax_envs.JaxEnv, agent, learner, num_members: int,
               config, *, seed: int = 0,
               resume_env_steps: Sequence[int] | None = None,
               processes=None, saved_state: dict | None = None):
    """Args:
      env: the JAX env every member acts in.
      agent: the population's agent (``learns_from == 'rollout'``: its
        ``behave``, ``update`` and config's ``rollout_length`` and
        ``num_envs``).
      learner: the run's ``PopulationLearner``; its fused call is compiled
        here, ``learner.num_steps / (T x E)`` iterations per call.
      num_members: ``N``.
      config: a ``fastpbrl.datapath.common.PipelineConfig`` (steps per
        call, evaluation; its warm-up and replay settings are not used).
      seed: the run's seed (env resets, behaviour sampling).
      resume_env_steps: ``[N]`` env steps of every member at the
        checkpoint a resume starts from (None: a new run).
      saved_state: ``checkpoint_state()`` of the run being resumed: the
        envs, keys and counters continue exactly where they were
        (``restored_exactly``).
      processes: the run's ``fastpbrl.devices.distributed.Processes`` (None: one
        process).
    """
    if agent.learns_from != 'rollout':
      raise ValueError(f'DeviceRollouts needs an agent that learns from its '
                       f'rollouts; {agent.name!r} learns from '
                       f'{agent.learns_from}')
    self.replay = NoReplay()
    # No warm-up of random actions and no refill: a rollout member acts
    # with its policy from its first step.
    super().__init__(
        env, agent, learner, num_members,
        dataclasses.replace(config, warmup_steps=0, refill_steps=0),
        envs_per_member=int(agent.config.num_envs), seed=seed,
        resume_env_steps=resume_env_steps, replay_state=None,
        processes=processes, carried_env_steps=0.0, saved_state=saved_state)
    log.info('on-device rollouts: %s, %d members x %d envs; a learner call '
             'is %d iterations of %d steps', env.env_id, num_members,
             self.envs_per_member, self.iterations,
             agent.config.rollout_length)

  def _compile_learner(self, learner) -> None:
    self.iterations = learner.iterations(self.config.num_steps)
    learner.compile_with_rollouts(self.agent, self.env, self.iterations)

  def _initial_envs(self, replay_state: dict | None) -> collect.EnvsState:
    del replay_state  # there is none
    n, e = self.num_members, self.envs_per_member

    def build(key):
      return self._placed(collect.init(self.env, n, e, None, 0, key))

    return jax.jit(build)(host_key(self._seed))

  def _resumes_exactly(self, saved_state, replay_state) -> bool:
    del replay_state  # the envs and counters are all there is
    return saved_state is not None

  # ------------------------------------------------------------ the loop

  def learn(self, learner, state, hparams, actor_hparams, *,
            shared_critic: bool, should_stop=None) -> LearnerCall:
    """``fastpbrl.datapath.protocol.DataPath.learn``: the fused call, every time
    (members ``behave`` with ``actor_hparams``); nothing is waited for, so
    it never returns None. Every member's update steps are the call's env
    steps."""
    del should_stop  # nothing to wait for
    state, metrics = self._fused_call(
        learner.update_with_rollouts, learner, state, hparams, actor_hparams,
        learner.num_steps)
    return LearnerCall(state, metrics, learner.num_steps * (
        np.zeros(self.num_members, np.int64) if shared_critic
        else self.population_active))

  # ------------------------------------------------------- rule actions

  def copy_member_data(self, dst_indices, src_indices) -> None:
    """Nothing to copy: a member's data is the rollout it collects next,
    with the policy PBT's exploit gave it (its envs go on as they were)."""
    del dst_indices, src_indices

  # ---------------------------------------------------------------- stats

  def update_steps_owed(self, env_steps: int) -> int:
    """0: every call learns from the env steps it collected."""
    del env_steps
    return 0

  def replay_bytes(self) -> int:
    return 0
