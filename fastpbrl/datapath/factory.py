"""The one factory from a run's settings to a data path (host-side; not
jittable). What a path is, and what the loop may ask of it: ``protocol``.

A data path turns the members' policies into what the learner learns
from, and tells the loop what happened on the way: finished episodes and
env steps. The loop (``fastpbrl.run.loop``), the rules, the logs and the
checkpoints talk to it only through :class:`DataPath`, so they never know
which path runs. Four implement it today, in ``fastpbrl.datapath``:

* ``actor_replay.Pipeline``: off-policy, gymnasium envs: actor processes
  -> replay -> prefetch -> learner call;
* ``actor_rollouts.ActorRollouts``: on-policy, gymnasium envs: actor
  processes -> one synchronous rollout per member -> learner call;
* ``device_replay.DevicePipeline``: off-policy, JAX envs: envs, rings and
  acting inside the learner's compiled call;
* ``device_rollouts.DeviceRollouts``: on-policy, JAX envs: envs, rollouts
  and updates inside the learner's compiled call.

The two gymnasium paths derive from ``actor_family.ActorPath``, the two
JAX ones from ``device_family.DeviceEnvs``; all four read a
``common.PipelineConfig``.

:func:`create` builds the path of the run's kind
(``fastpbrl.datapath.kinds.kind_of``: the env's kind and what the agent
learns from), the one place that branches on the path, and holds the
one mapping from a ``RunConfig`` to a ``PipelineConfig``. It passes each
path all it needs through its constructor.

**Adding a path** (on-policy rollouts for PPO: actors or on-device
envs collect ``T`` steps x ``E`` envs per member with the newest policy,
the learner runs GAE and epochs of minibatches) is a class with the
methods below, its row in ``kinds``, and one branch in :func:`create`,
nothing else. What it
implements, member for member:

* ``learn``: collect a rollout (or take one the actors sent), run the
  learner's call on it, say which members' updates count; ``None`` when a
  stop came while it waited.
* ``drain_episodes`` / ``env_steps`` / ``env_steps_per_member``: the
  episodes its rollouts finished and the env steps they took.
* ``publish`` / ``publish_async`` / ``wait_published`` /
  ``policy_version``: the policies its next rollouts act with (how stale
  a rollout may be is its decision, documented and measured).
* ``copy_member_data`` / ``restart_members``: what PBT's exploit and
  HyperTrick's restarts ask (a rollout path has no replay to copy: it may
  do nothing, or raise the ``ValueError`` of a layout without per-member
  data).
* ``evaluate`` / ``random_states``: episodes of given policies, and states
  visited by random actions (CEM-RL's mean policy, DvD's probe states).
* ``wait_fraction``, ``checkpoint_state`` / ``restored_exactly`` /
  ``replay``, ``close``: statistics, checkpoints and shutdown.

Over several processes (``fastpbrl.devices.distributed``) a data path holds
this process's members: counters, episodes and rule actions are its rows
(numbered from 0); ``learn`` and ``evaluate`` take and give the whole
population's arrays, and every process must call them at the same point.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

import jax
import numpy as np

from fastpbrl import agents as agents_lib
from fastpbrl.datapath.actor_replay import Pipeline
from fastpbrl.datapath.actor_rollouts import (ActorRollouts,
                                              check_rollout_settings)
from fastpbrl.datapath.common import PipelineConfig
from fastpbrl.datapath.device_replay import DevicePipeline
from fastpbrl.datapath.device_rollouts import DeviceRollouts
from fastpbrl.datapath.kinds import kind_of
from fastpbrl.datapath.protocol import DataPath
from fastpbrl.devices.distributed import Processes
from fastpbrl.envs import jax_envs
from fastpbrl.learner.population import population_hparams


def pipeline_seed(seed: int, calls: int, process: int = 0) -> int:
  """The pipeline's seed: the run's own, or for a run resumed after
  ``calls`` learner calls, fresh streams derived from both (never another
  run seed's streams, as ``seed + calls`` would be); process ``p > 0`` of
  a multi-process run (whose pipeline numbers its members from 0 too)
  gets streams of its own the same way."""
  if calls == 0 and process == 0:
    return seed
  entropy = [seed, calls] + ([process] if process else [])
  return int(np.random.SeedSequence(entropy).generate_state(1)[0])


def pipeline_config(run_config, agent, learner, *, shared_replay: bool,
                    replay_location: str,
                    refill_steps: int | None = None) -> PipelineConfig:
  """The data path's settings of a run's (``fastpbrl.config.fields.RunConfig``,
  resolved): the one mapping, for every path."""
  n = int(run_config.population_size)
  return PipelineConfig(
      num_steps=learner.num_steps,
      batch_size=learner.batch_size or agent.config.batch_size,
      layout='shared' if shared_replay else 'per_member',
      replay_capacity=run_config.replay_capacity,
      update_to_data_ratio=run_config.update_to_data_ratio,
      warmup_steps=run_config.warmup_steps,
      warmup_counts_as_data=run_config.warmup_counts_as_data,
      num_actor_processes=(None if run_config.num_actors is None else
                           min(run_config.num_actors, n)),
      eval_interval=run_config.eval_every,
      eval_episodes=run_config.eval_episodes,
      vectorized_envs=run_config.vector_envs,
      actor_hang_timeout_s=run_config.actor_timeout,
      replay_location=replay_location, refill_steps=refill_steps)


def create(run_config, agent, learner, *, shared_replay: bool, calls: int = 0,
           processes=None, resume_env_steps=None, carried_env_steps=0.0,
           refill_steps: int | None = None,
           replay_state: dict | None = None,
           saved_state: dict | None = None) -> DataPath:
  """The data path of a run's settings; nothing is published yet.

  Args:
    run_config: the run's ``fastpbrl.config.fields.RunConfig`` as
      ``fastpbrl.config.derived.resolved`` completes it (what a run
      uses; the settings sit above the data paths, so they are resolved
      by the caller).
    agent: the population's agent (``fastpbrl.agents.make_agent`` of
      ``run_config.agent``; actors rebuild it from that name).
    learner: the run's learner (steps and batch size per call; the
      on-device path compiles its fused call).
    shared_replay: one replay for all members (CEM-RL, DvD).
    calls: the learner calls of the checkpoint a resume starts from (0:
      a new run): its streams are new ones (``pipeline_seed``).
    processes: the run's ``fastpbrl.devices.distributed.Processes`` (None: one).
    resume_env_steps: ``[N]`` env steps of every member at the checkpoint
      a resume starts from (None: a new run).
    carried_env_steps: a resume's data that earned update steps not taken
      yet (``resume.carried_env_steps``), scalar or ``[N]``.
    refill_steps: a resume's refill of the replay, per member
      (``PipelineConfig.refill_steps``; None: ``--warmup-steps``).
    replay_state: this process's restored replay (``--checkpoint-replay``).
    saved_state: the checkpoint's ``checkpoint_state()``.

  Raises:
    ValueError: a setting refused once sizes are known (its message starts
      with the flag).
  """
  _check_resolved(run_config)
  n = int(run_config.population_size)
  processes = processes or Processes(None, n)
  kind = kind_of(agent, run_config.env)
  if kind.name == 'device_rollouts':
    # Rollouts collected and learned from inside the learner call; E is
    # the agent's num_envs.
    config = pipeline_config(run_config, agent, learner, shared_replay=False,
                             replay_location='device')
    return DeviceRollouts(
        jax_envs.make(run_config.env), agent, learner, n, config,
        seed=pipeline_seed(run_config.seed, calls),
        resume_env_steps=resume_env_steps, processes=processes,
        saved_state=saved_state)
  if kind.name == 'device_replay':  # stepped inside the learner call
    # The fused call samples the rings with config.batch_size where the
    # learner has no batch size of its own (DevicePipeline gives it that).
    config = pipeline_config(run_config, agent, learner,
                             refill_steps=refill_steps,
                             shared_replay=shared_replay,
                             replay_location='device')
    return DevicePipeline(
        jax_envs.make(run_config.env), agent, learner, n, config,
        envs_per_member=run_config.envs_per_member,
        interleave=run_config.interleave,
        # One program over every process: one seed.
        seed=pipeline_seed(run_config.seed, calls),
        resume_env_steps=resume_env_steps, replay_state=replay_state,
        processes=processes, carried_env_steps=carried_env_steps,
        saved_state=saved_state)
  if kind.name == 'actor_rollouts':  # on-policy, actor processes
    return _actor_rollouts(
        run_config, agent, learner, processes,
        seed=pipeline_seed(run_config.seed, calls, processes.index),
        resume_env_steps=resume_env_steps)
  return _actors(run_config, agent, learner, processes,
                 shared_replay=shared_replay,
                 seed=pipeline_seed(run_config.seed, calls, processes.index),
                 resume_env_steps=resume_env_steps,
                 carried_env_steps=carried_env_steps,
                 replay_state=replay_state, refill_steps=refill_steps)


def check_agent(run_config, agent) -> None:
  """Refuses, before a run folder exists, an agent config the path of
  ``run_config`` cannot run (the actors' rollouts take whole iterations).

  Raises:
    ValueError: one line naming the setting.
  """
  if kind_of(agent, run_config.env).name == 'actor_rollouts':
    check_rollout_settings(agent.config, agent.config.steps_per_call,
                           run_config.agent)


# Settings ``fastpbrl.config.derived.resolved`` fills from the budget: a
# path needs every one of them set.
_DERIVED = ('eval_every', 'warmup_steps')


def _check_resolved(run_config) -> None:
  unset = [name for name in _DERIVED if getattr(run_config, name) is None]
  if unset:
    raise ValueError(f'create takes a resolved config '
                     f'(fastpbrl.config.derived.resolved); {unset[0]} is '
                     'unset')


def _actors(run_config, agent, learner, processes, *, shared_replay: bool,
            seed: int, resume_env_steps, carried_env_steps,
            replay_state, refill_steps) -> Pipeline:
  """This process's actors, replay and prefetch: its members' rows of the
  counters; over several processes host batches (made global in
  ``learn``) and a host replay."""
  local, several = processes.local, processes.several
  if several:
    run_config = dataclasses.replace(run_config, replay_location='host')
  ref = _actor_agent_ref(run_config, agent)
  n = processes.local_count
  policy_layout, hparams_layout = _store_layout(agent, n)
  config = pipeline_config(
      dataclasses.replace(run_config, population_size=n), agent, learner,
      shared_replay=shared_replay, refill_steps=refill_steps,
      replay_location=run_config.replay_location)
  return Pipeline(
      run_config.env,
      functools.partial(agents_lib.make_agent, ref, config=agent.config),
      policy_layout, hparams_layout, config, seed=seed,
      # Several processes: host batches, made global by learn.
      device=jax.local_devices(backend='cpu')[0] if several else None,
      resume_env_steps=(None if resume_env_steps is None
                        else np.asarray(resume_env_steps)[local]),
      replay_state=replay_state,
      mesh=None if several else getattr(learner, 'mesh', None),
      carried_env_steps=(carried_env_steps if np.ndim(carried_env_steps) == 0
                         else np.asarray(carried_env_steps)[local]),
      processes=processes, agent=agent,
      # Over several processes every version counts alike in all of them.
      publish_every_version=several)


def _actor_agent_ref(run_config, agent) -> str:
  """The ``--agent`` string the actor processes rebuild ``agent`` from."""
  ref = run_config.agent
  if agents_lib.get(ref).name != agent.name:
    raise ValueError(f'the actors rebuild agents from the registry, and '
                     f'{ref!r} names agent {agents_lib.get(ref).name!r}, '
                     f'not {agent.name!r}')
  return ref


def _store_layout(agent, n: int) -> tuple[Any, Any]:
  """The ``[n]`` layouts (``jax.ShapeDtypeStruct``) of the policies and
  hyperparameters the actors read."""
  hparams = population_hparams(agent, n)

  def policy_layout(hp):
    keys = jax.random.split(jax.random.PRNGKey(0), n)
    return jax.vmap(agent.policy_params)(jax.vmap(agent.init)(keys, hp))

  return (jax.eval_shape(policy_layout, hparams),
          jax.eval_shape(lambda hp: hp, hparams))


def _actor_rollouts(run_config, agent, learner, processes, *, seed: int,
                    resume_env_steps) -> ActorRollouts:
  """This process's on-policy actors (``fastpbrl.datapath.actor_rollouts``)."""
  ref = _actor_agent_ref(run_config, agent)
  check_rollout_settings(agent.config, learner.num_steps, ref)
  n = processes.local_count
  policy_layout, hparams_layout = _store_layout(agent, n)
  config = pipeline_config(
      dataclasses.replace(run_config, population_size=n), agent, learner,
      shared_replay=False, replay_location='host')
  return ActorRollouts(
      run_config.env,
      functools.partial(agents_lib.make_agent, ref, config=agent.config),
      policy_layout, hparams_layout, config,
      rollout_length=agent.config.rollout_length, seed=seed,
      resume_env_steps=(None if resume_env_steps is None
                        else np.asarray(resume_env_steps)[processes.local]),
      processes=processes, agent=agent,
      # Over several processes every version counts alike in all of them.
      publish_every_version=processes.several)
