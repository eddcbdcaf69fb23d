"""The on-device data path: environments written in JAX stepped inside the
learner's compiled call (host-side driver; the work is ``fastpbrl.learner.collect``
and ``PopulationLearner.update_with_envs``).

::

  learner call = jit(scan over G groups:
                   every member acts in its E envs for K steps   (collect.run)
                   -> transitions into its ring on the device
                   -> U update steps on batches sampled from it)

with ``G * U`` = the learner's steps per call and ``G * K * E`` = the env
steps per member a call needs at the update-to-data ratio (``ceil(S /
ratio)``, rounded up to whole batches of ``E`` envs). ``G`` is
``--interleave``: 1 by default (act for the call's env steps, then
update, as Brax's and PureJaxRL's off-policy loops do; members act with
policies at most one call old, as the actors do), up to one update after
each env step (TD3's reference loop). On a 2-core CPU, TD3 with 64x64
networks, ``G = 50`` made a call 30% slower at 4 members and 8% at 64
than ``G = 1``: each group adds the overhead of its small operations. No transition, batch
or parameter crosses to the host inside a call; after it, only the
``[G * K, N, E]`` episode flags and returns do, to log episodes and feed
the rule.

:class:`DevicePipeline` implements ``fastpbrl.datapath.protocol.DataPath``, as
``fastpbrl.datapath.actor_replay.Pipeline`` does, so the loop, the rules, the logs and the
checkpoints do not know which path runs. What differs, by design:

* **Warm-up.** Before the first learner call every member takes
  ``--warmup-steps`` random-action steps (collect-only calls); with
  ``--warmup-counts-as-data`` (the default) the learner then catches up
  with update-only calls, sampled from the device replay, until it has
  ``ratio x`` the data, as the actor path's rate limiter lets it.
* **Policies are never stale.** Members act with their parameters of the
  moment, also between the groups of a call (the actor path acts with
  parameters up to a call or two old). A policy version is one learner call.
* **Determinism.** Everything is a function of ``--seed``: two runs with the
  same settings on the same device take the same decisions.
* **Resume.** Each checkpoint holds the envs' states, keys and counters
  (``checkpoint_state``). With ``--checkpoint-replay`` a resumed run
  continues them with the replay: it is the run never stopped, bit for
  bit, over one process or several. Without the replay a resumed run
  starts new episodes and refills the replay with the restored policies
  (episodes cut by the stop are not logged).
* **Several processes** (``fastpbrl.launch``, ``fastpbrl.devices.distributed``).
  The envs and rings are global arrays over every process's devices, split
  by member with the learner's mesh: each device steps its own members'
  envs, and the one program is the single-process program partitioned
  over the processes. Every process drives the same calls (they are
  collectives). What the loop sees is this process's members, as with the
  actor path: ``env_steps``, ``last_active`` and the episode records are
  its rows (member numbers from 0), ``restart_members`` and
  ``copy_member_data`` take its rows, ``publish`` its rows of the
  policies; the pipeline gathers them into the global arrays.

The host-side parts that do not touch the replay (counters, episode
records, evaluations, restarts, checkpoints of the envs and counters,
wait statistics) are :class:`DeviceEnvs`, which
``fastpbrl.datapath.device_rollouts.DeviceRollouts`` (the on-device path of agents
that learn from their own rollouts) shares.
"""

from __future__ import annotations

import functools
import logging
import math
import os
import time
from typing import Any, NamedTuple, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from fastpbrl.core.types import EpisodeRecord
from fastpbrl.core.types import LearnerCall, ReplaySample
from fastpbrl.datapath.actor_replay import PipelineConfig, replay_call
from fastpbrl.devices import distributed
from fastpbrl.devices import sharding
from fastpbrl.envs import jax_envs
from fastpbrl.learner import collect
from fastpbrl.learner.collect import Plan
from fastpbrl.replay import device as device_replay
from fastpbrl.replay.buffers import (CLEAR_NEEDS_PER_MEMBER, Replay,
                                     bytes_per_transition, format_bytes,
                                     transition_fields)

log = logging.getLogger(__name__)


class EnvCall(NamedTuple):
  """``DevicePipeline.next_batch``'s answer for a call that collects its
  own data: the loop runs it with ``DevicePipeline.run_call``."""

  calls: int  # the pipeline's learner calls before this one


class _ReplayView:
  """The device rings as ``Saver`` and a resume read them
  (``Replay.state_dict``'s format: the rings cut to the rows written)."""

  def __init__(self, pipeline: 'DevicePipeline'):
    self._pipeline = pipeline

  def state_dict(self) -> dict:
    """This process's rings (over several processes, each saves its own
    members' with ``fastpbrl.run.checkpoint.ProcessReplayFiles``); every
    process must call it, at the same point."""
    replay = self._pipeline.envs.replay
    # Every member's sizes (gathered over several processes), so that all
    # processes cut their rings alike: the cut is one program over all.
    size = sharding.whole_value(replay.size)
    rows = int(size.max()) if size.size else 0
    per_member = size.ndim == 1
    local = distributed.to_local(replay._replace(data={
        k: v[:, :rows] if per_member else v[:rows]
        for k, v in replay.data.items()}))
    return {'data': local.data, 'pos': local.pos.astype(np.int64),
            'size': local.size.astype(np.int64),
            'inserted': self._pipeline.env_steps.copy()}

  state_rows = staticmethod(Replay.state_rows)


class DeviceEnvs:
  """What both on-device data paths share (host-side driver, not
  jittable): the population's JAX envs on the device, and the host's view
  of them: counters in env steps, episode records, evaluations, restarts,
  checkpoints of the envs and counters, and wait statistics.
  :class:`DevicePipeline` adds a replay (agents that learn from replay),
  ``fastpbrl.datapath.device_rollouts.DeviceRollouts`` rollouts (agents that learn
  from their own); each compiles its learner call (``_compile_learner``),
  builds its envs (``_initial_envs``) and says when a resume continues it
  exactly (``_resumes_exactly``)."""

  def __init__(self, env: jax_envs.JaxEnv, agent, learner, num_members: int,
               config, *, envs_per_member: int, seed: int,
               resume_env_steps: Sequence[int] | None,
               replay_state: dict | None, processes,
               carried_env_steps: float | Sequence[float],
               saved_state: dict | None):
    """Args: as :class:`DevicePipeline`'s."""
    config.validate(num_members)
    self.config, self.env, self.agent = config, env, agent
    self.num_members, self.envs_per_member = num_members, envs_per_member
    # One process: Processes hands every value back as it is.
    self._processes = processes or distributed.Processes(None, num_members)
    self._local = self._processes.local
    self._mesh = getattr(learner, 'mesh', None)
    _check_memory(self.replay_bytes(), config, num_members)
    self._compile_learner(learner)
    self.publish_every_version = False
    self._seed = int(seed)
    self._warmup_length = np.broadcast_to(
        np.asarray(config.warmup_steps, np.int64), (num_members,)).copy()
    self._start_counters(resume_env_steps, replay_state is not None,
                         carried_env_steps)
    self._episodes: list[EpisodeRecord] = []
    self._params = self._actor_hparams = None
    self._busy = self._idle = 0.0
    self._idle_since: float | None = None
    self._busy_since: float | None = None
    self.envs = _unaliased(self._initial_envs(replay_state))
    self.restored_exactly = self._resumes_exactly(saved_state, replay_state)
    if self.restored_exactly:
      self._restore(saved_state)
    self._compile_host_calls()

  # ------------------------------------------------ what a path defines

  def _compile_learner(self, learner) -> None:
    """Compiles the learner's call that steps the envs."""
    raise NotImplementedError

  def _initial_envs(self, replay_state: dict | None) -> collect.EnvsState:
    """The envs of a new run (a resume's are restored over them), built
    by one jitted call placed on the mesh."""
    raise NotImplementedError

  def _resumes_exactly(self, saved_state: dict | None,
                       replay_state: dict | None) -> bool:
    """True when ``saved_state`` (and ``replay_state``) continue this path
    exactly (``restored_exactly``)."""
    raise NotImplementedError

  def replay_bytes(self) -> int:
    """Bytes of the replay on the device (refused over the memory's
    ``DEVICE_MEMORY_FRACTION``)."""
    raise NotImplementedError

  # ----------------------------------------------------------- building

  def _start_counters(self, resume_env_steps, has_replay: bool,
                      carried_env_steps) -> None:
    """Every member's counters (the same in every process; the loop reads
    this process's rows: ``env_steps``, ``last_active``), in env steps of
    the whole run: a resumed run's continue from ``resume_env_steps``."""
    n, config = self.num_members, self.config
    resumed = resume_env_steps is not None
    warmup = self._warmup_length
    self._steps = (np.zeros(n, np.int64) if not resumed else np.broadcast_to(
        np.asarray(resume_env_steps, np.int64), (n,)).copy())
    # Where this pipeline started: the loop counts from there.
    self._origin = self._steps.copy()
    # Env steps before the learner may start, and the data the
    # update-to-data ratio counts from: a resume's refill is data, and so
    # are the steps before it that earned update steps not taken yet
    # (``carried_env_steps``). Every member takes the same env steps.
    start = int(self._steps.min())
    refill = (warmup if not resumed or config.refill_steps is None
              else config.refill_steps)
    self._learn_after = self._steps + (0 if has_replay else refill)
    self._data_from = (
        start - float(np.min(carried_env_steps)) if resumed else
        0 if config.warmup_counts_as_data else int(self._learn_after.max()))
    self._random_left = np.zeros(n, np.int64) if resumed else warmup.copy()
    self._active = np.ones(n, bool)
    self.update_steps = 0
    self.calls = 0
    self.policy_version = 0
    self._start_version = np.zeros((n, self.envs_per_member), np.int64)
    interval = config.eval_interval
    # The next --eval-every boundary after the start.
    self._next_eval = (start // interval + 1) * interval if interval else None

  # The host counters a checkpoint keeps (``checkpoint_state``).
  _SAVED_COUNTERS = ('_steps', '_learn_after', '_random_left', '_active',
                     '_start_version')

  def checkpoint_state(self) -> dict:
    """What a resume needs, beside the replay, to continue this data
    path exactly: the envs' states and keys, and the counters, as whole
    numpy arrays (gathered over several processes: every process must
    call it)."""
    leaves = jax.tree.leaves(self.envs._replace(replay=None))
    return {'envs': {f'{i:04d}': sharding.whole_value(x)
                     for i, x in enumerate(leaves)},
            **{name.lstrip('_'): np.asarray(getattr(self, name)).copy()
               for name in self._SAVED_COUNTERS},
            'data_from': np.asarray(self._data_from, np.float64),
            'counts': np.asarray([
                self.update_steps, self.calls, self.policy_version,
                -1 if self._next_eval is None else self._next_eval,
                self._seed], np.int64)}

  def _restore(self, saved: dict) -> None:
    """The envs and counters of ``checkpoint_state`` (see ``__init__``)."""
    envs = self.envs._replace(replay=None)
    leaves, treedef = jax.tree.flatten(envs)
    saved_leaves = [saved['envs'][k] for k in sorted(saved['envs'])]
    if len(saved_leaves) != len(leaves) or any(
        np.shape(a) != np.shape(b) for a, b in zip(saved_leaves, leaves)):
      raise ValueError('--resume: the checkpoint\'s env states do not fit '
                       'this env and population; resume with the settings '
                       'of the saving run')
    # Each leaf placed as the fresh one is (over several processes each
    # places its own members' rows).
    restored = jax.tree.unflatten(treedef, [
        sharding.placed_like(np.asarray(x, like.dtype), like)
        for x, like in zip(saved_leaves, leaves)])
    self.envs = _unaliased(restored._replace(replay=self.envs.replay))
    for name in self._SAVED_COUNTERS:
      setattr(self, name, np.asarray(saved[name.lstrip('_')]).copy())
    self._origin = self._steps.copy()
    self._data_from = float(saved['data_from'])
    (self.update_steps, self.calls, version, next_eval,
     self._seed) = (int(x) for x in saved['counts'])
    # The run publishes the restored policies once before its first call:
    # that publish gives them the version they had.
    self.policy_version = version - 1
    self._next_eval = None if next_eval < 0 else next_eval

  def _placed(self, envs: collect.EnvsState) -> collect.EnvsState:
    """Inside a jitted call: ``envs`` pinned to the learner's mesh (the
    layout ``update_with_envs`` gives them), unchanged without one."""
    if self._mesh is None:
      return envs
    return sharding.constrain(envs, self._mesh, self.num_members,
                              collect.per_member_leaves(envs))

  def _compile_host_calls(self) -> None:
    env, agent = self.env, self.agent
    self._evaluate = jax.jit(functools.partial(collect.evaluate, env, agent),
                             static_argnums=3)
    self._restart = jax.jit(
        lambda envs, flags, warmup: self._placed(collect.restart(
            env, envs, flags, warmup)), donate_argnums=0)
    self._random_states = jax.jit(
        functools.partial(collect.random_states, env), static_argnums=1)

  def _placed_first(self, pair):
    envs, rest = pair
    return self._placed(envs), rest

  # ------------------------------------------------- this process's rows

  @property
  def env_steps(self) -> np.ndarray:
    """Env steps collected per member of this process (its rows), since
    this pipeline started (a resumed run's count from zero again)."""
    return (self._steps - self._origin)[self._local]

  @property
  def last_active(self) -> np.ndarray:
    """Per member of this process: True where the last call kept its
    updates (it was not warming up after a restart)."""
    return self._active[self._local]

  @property
  def population_active(self) -> np.ndarray:
    """``last_active`` of every member: the same in every process, so the
    loop needs no gather for it."""
    return self._active.copy()

  # ------------------------------------------------------------ the loop

  def publish(self, policy_params: Any, actor_hparams: Any) -> int:
    """The policies and acting hyperparameters of the next calls' warm-up
    and evaluations (the fused call acts with the state it updates)."""
    self._params, self._actor_hparams = policy_params, actor_hparams
    self.policy_version += 1
    return self.policy_version

  def publish_async(self, policy_params: Any, actor_hparams: Any) -> None:
    self.publish(policy_params, actor_hparams)

  def wait_published(self, timeout: float | None = None) -> bool:
    del timeout  # nothing is published in the background
    return True

  def _fused_call(self, call, learner, state, hparams, actor_hparams,
                  env_steps: int):
    """Runs a fused learner call (``learner.update_with_envs`` or
    ``update_with_rollouts``, acting with ``actor_hparams``) on the envs;
    keeps the new envs, the counters (``env_steps`` per member) and the
    finished episodes, and evaluates when due. Returns ``(state,
    metrics)``."""
    self._mark_busy()
    (state, metrics), envs, episodes = call(
        state, hparams, actor_hparams, self.envs, self._active)
    self.envs = _unaliased(envs)
    self._take_episodes(self._processes.host(episodes))
    self._advance(env_steps)
    self._evaluate_due(state, learner, actor_hparams)
    self._mark_idle()
    return state, metrics

  def _advance(self, steps: int, updated: bool = True) -> None:
    """Counts ``steps`` env steps per member, and a learner call when
    the call also ``updated``."""
    self._steps += steps
    self._random_left = np.maximum(self._random_left - steps, 0)
    if updated:
      self.update_steps += self.config.num_steps
      self.calls += 1

  def _take_episodes(self, episodes: collect.Episodes) -> None:
    """Records of this process's members' episodes from ``[T, N, E]``
    flags and returns (``T`` env steps, the first one right after
    ``self._steps``), numbered from 0 as its rows."""
    shape = (-1, self.num_members, self.envs_per_member)
    first = self._local.start
    done, returns, lengths, objectives = (
        np.asarray(x).reshape(shape)[:, self._local]
        for x in (episodes.done, episodes.episode_return,
                  episodes.episode_length, episodes.true_objective))
    for t, m, e in zip(*np.nonzero(done)):
      self._episodes.append(EpisodeRecord(
          member=int(m), episode_return=float(returns[t, m, e]),
          episode_length=int(lengths[t, m, e]), evaluation=False,
          env_steps=int(self._steps[first + m]
                        + (t + 1) * self.envs_per_member),
          policy_version=self.policy_version,
          start_policy_version=int(self._start_version[first + m, e]),
          true_objective=_objective(objectives[t, m, e])))
      self._start_version[first + m, e] = self.policy_version
    del self._episodes[:-100_000]  # undrained records kept at most

  def _evaluate_due(self, state, learner, actor_hparams) -> None:
    """Every member's evaluation, on the device, once the members passed
    the next ``--eval-every`` boundary."""
    if self._next_eval is None or self._steps.min() < self._next_eval:
      return
    at = self._next_eval
    while self._next_eval <= self._steps.min():
      self._next_eval += self.config.eval_interval
    key = host_key(self._seed, at)
    returns, lengths, objectives = (
        x[self._local] for x in self._processes.host(self._evaluate(
            learner.policy_params(state), actor_hparams, key,
            self.config.eval_episodes)))
    for m in range(returns.shape[0]):
      for k in range(returns.shape[1]):
        self._episodes.append(EpisodeRecord(
            member=m, episode_return=float(returns[m, k]),
            episode_length=int(lengths[m, k]), evaluation=True, env_steps=at,
            policy_version=self.policy_version,
            start_policy_version=self.policy_version,
            true_objective=_objective(objectives[m, k])))

  def evaluate(self, policy_params, actor_hparams, episodes: int,
               seed: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``[N, episodes]`` returns, lengths and true objectives of noise-free
    episodes of ``policy_params`` (this process's rows, as published),
    played on the device (the final evaluation); every member's, in every
    process."""
    key = host_key(seed, 2**30)
    rows = self._processes.global_rows
    return self._processes.host(self._evaluate(
        rows(policy_params), rows(actor_hparams), key, episodes))

  def random_states(self, num_states: int, seed: int) -> np.ndarray:
    """``[num_states, *obs]`` float32 observations of one env visited by
    uniformly random actions from resets, on the device, every key derived
    from ``PRNGKey(seed)`` (``collect.random_states``): the same states for
    the same env and seed."""
    return np.asarray(self._random_states(host_key(seed), num_states))

  def drain_episodes(self) -> list[EpisodeRecord]:
    records, self._episodes = self._episodes, []
    return records

  # ------------------------------------------------------- rule actions

  def restart_members(self, members: Sequence[int] | np.ndarray) -> None:
    """Starts ``members`` (this process's rows) over as new experiments:
    new episodes, an empty ring (if the path has one), the warm-up of
    random actions (if it has one); their updates are discarded until it
    is over. Over several processes every process calls it (with its own
    rows, maybe none)."""
    local = np.zeros(self._local.stop - self._local.start, bool)
    local[np.asarray(members, np.int64).reshape(-1)] = True
    flags = self._processes.members(local)
    if not flags.any():
      return
    self.envs = _unaliased(self._restart(
        self.envs, flags, self._warmup_length.astype(np.int32)))
    self._random_left[flags] = self._warmup_length[flags]
    self._start_version[flags] = self.policy_version + 1

  # ---------------------------------------------------------------- stats

  def env_steps_per_member(self) -> int:
    return int((self._steps - self._origin).min())

  def _mark_busy(self) -> None:
    now = time.monotonic()
    if self._idle_since is not None:
      self._idle += now - self._idle_since
      self._idle_since = None
    self._busy_since = now

  def _mark_idle(self) -> None:
    now = time.monotonic()
    if self._idle_since is None and self._busy_since is not None:
      self._busy += now - self._busy_since
    self._idle_since = now

  def wait_fraction(self) -> float:
    """Fraction of wall time the device had no call to run (the host was
    logging, checkpointing or deciding), since the first call."""
    total = self._busy + self._idle
    return self._idle / total if total else 0.0

  def reset_wait_stats(self) -> None:
    """Restarts ``wait_fraction`` from now."""
    self._busy = self._idle = 0.0
    self._idle_since = None
    self._busy_since = time.monotonic()

  def close(self) -> None:
    self.envs = None  # frees the device arrays



class DevicePipeline(DeviceEnvs):
  """Envs, replay and acting of a population on the device (host-side
  driver, not jittable): a ``fastpbrl.datapath.protocol.DataPath``, built by
  ``fastpbrl.datapath.factory.create`` from the run's settings."""

  replay_on_device = True

  def __init__(self, env: jax_envs.JaxEnv, agent, learner, num_members: int,
               config, *, envs_per_member: int = 1, interleave: int = 1,
               seed: int = 0,
               resume_env_steps: Sequence[int] | None = None,
               replay_state: dict | None = None, processes=None,
               carried_env_steps: float | Sequence[float] = 0.0,
               saved_state: dict | None = None):
    """Args:
      env: the JAX env every member acts in.
      agent: the population's agent (its ``act``).
      learner: the run's learner; its fused call is compiled here.
      num_members: ``N``.
      config: a ``fastpbrl.datapath.actor_replay.PipelineConfig`` (steps per call, batch
        size, ratio, warm-up, replay layout and capacity, evaluation).
      envs_per_member: ``E``, envs each member acts in at once.
      interleave: ``G``, groups of acting then updating per call.
      seed: the run's seed (env resets, exploration, sampling).
      resume_env_steps, replay_state, carried_env_steps: as
        ``Pipeline``'s (``[N]`` steps: every member's, also over several
        processes).
      saved_state: ``checkpoint_state()`` of the run being resumed, with
        its ``replay_state``: the envs, keys and counters continue exactly
        where they were (``restored_exactly``), so the resumed run is the
        run never stopped, bit for bit.
      processes: the run's ``fastpbrl.devices.distributed.Processes`` (None: one
        process); over several, the learner's mesh spans them all and the
        loop sees this process's members (see the module's docstring).
    """
    self._interleave = interleave
    self.replay = _ReplayView(self)
    super().__init__(
        env, agent, learner, num_members, config,
        envs_per_member=envs_per_member, seed=seed,
        resume_env_steps=resume_env_steps, replay_state=replay_state,
        processes=processes, carried_env_steps=carried_env_steps,
        saved_state=saved_state)
    log.info('on-device data path: %s, %d members x %d envs; a learner call '
             'is %d groups of %d env steps and %d update steps',
             env.env_id, num_members, envs_per_member, *self.plan)

  def _compile_learner(self, learner) -> None:
    config = self.config
    self.plan = Plan.of(config.num_steps, config.update_to_data_ratio,
                        self.envs_per_member, self._interleave)
    learner.compile_with_envs(self.agent, self.env, *self.plan)

  def _resumes_exactly(self, saved_state, replay_state) -> bool:
    # The envs and counters alone would continue with empty rings.
    return saved_state is not None and replay_state is not None

  def _initial_envs(self, replay_state: dict | None) -> collect.EnvsState:
    """Fresh episodes and empty (or restored) rings, built by one jitted
    call placed on the mesh: over several processes each builds only its
    members' rows."""
    config, n = self.config, self.num_members
    fields = transition_fields(self.env.env_spec)

    def build(random_left, key, replay):
      if replay is None:
        replay = device_replay.init_state(config.layout, fields, n,
                                          config.replay_capacity)
      return self._placed(collect.init(self.env, n, self.envs_per_member,
                                       replay, random_left, key))

    replay = (None if replay_state is None else
              self._restored_replay(replay_state, fields))
    # Host values (the same in every process) for the jitted calls:
    # numpy, never an array placed on one device.
    return jax.jit(build)(np.asarray(self._random_left, np.int32),
                          host_key(self._seed), replay)

  def _restored_replay(self, replay_state: dict, fields):
    """The rings of this process's ``replay_state`` (``_ReplayView``'s
    format) at full capacity: numpy in one process, global arrays over
    several (each process gives its members' rings; a shared ring is
    whole, and the same, in each)."""
    config = self.config
    per_member = config.layout != 'shared'
    rows = self._processes.local_count if per_member else self.num_members
    like = jax.eval_shape(lambda: device_replay.init_state(
        config.layout, fields, rows, config.replay_capacity))
    replay = device_replay.state_of_dict(like, replay_state)
    log.info('replay restored: %s transitions per ring',
             np.asarray(replay.size).tolist())
    if not self._processes.several:
      return replay
    return distributed.to_global(
        replay, self._mesh, self.num_members,
        per_member=jax.tree.map(lambda _: per_member, replay))

  def _compile_host_calls(self) -> None:
    super()._compile_host_calls()
    env, agent, plan = self.env, self.agent, self.plan
    steps = plan.groups * plan.env_steps
    self._collect = jax.jit(
        lambda envs, params, hparams: self._placed_first(collect.run(
            env, agent, params, hparams, envs, steps)),
        donate_argnums=0)
    self._copy = jax.jit(
        lambda envs, dst, src: self._placed(envs._replace(
            replay=device_replay.copy_members(envs.replay, dst, src))),
        donate_argnums=0)
    self._split_key = jax.jit(_split_key)

  def next_batch(self, timeout: float | None = None, should_stop=None):
    """What the next learner call runs on: the warm-up first (collect-only
    calls), then an update-only call (a ``ReplaySample``) while the
    learner is behind the ratio, else an ``EnvCall`` (``run_call``).
    Returns None once ``should_stop()`` is True."""
    del timeout  # nothing here waits on another process
    self._mark_busy()
    while (self._steps < self._learn_after).any():
      # Every process collects alike; a stop is agreed on after the call.
      if (should_stop is not None and should_stop()
          and not self._processes.several):
        return None
      self._collect_only()
    data = int(self._steps.min()) - self._data_from
    self._active = self._random_left == 0
    if self.update_steps + self.config.num_steps <= (
        self.config.update_to_data_ratio * data):
      # Update-only: the loop runs it as learner.update on the device
      # replay; counted here, as nothing else reports it back.
      self.envs, key = self._split_key(self.envs)
      self.update_steps += self.config.num_steps
      self.calls += 1
      self._mark_idle()
      return ReplaySample(self.envs.replay, key)
    return EnvCall(self.calls)

  def run_call(self, learner, state, hparams, actor_hparams):
    """Runs the fused learner call; returns ``(state, metrics)`` and keeps
    the new envs, counters and finished episodes."""
    return self._fused_call(
        learner.update_with_envs, learner, state, hparams, actor_hparams,
        self.plan.env_steps_per_call(self.envs_per_member))

  def learn(self, learner, state, hparams, actor_hparams, *,
            shared_critic: bool, should_stop=None):
    """``fastpbrl.datapath.protocol.DataPath.learn``: the warm-up's collect-only
    calls, then the fused call (``run_call``, acting with
    ``actor_hparams``) or an update-only call on the device replay, as
    :meth:`next_batch` decides. Members warming up after a restart keep
    their state."""
    work = self.next_batch(should_stop=should_stop)
    processes = self._processes
    if processes.any(work is None):
      return None  # a signal arrived during the warm-up
    if isinstance(work, EnvCall):  # the call steps the envs and collects
      state, metrics = self.run_call(learner, state, hparams, actor_hparams)
      return LearnerCall(state, metrics, learner.num_steps * (
          np.zeros(self.num_members, np.int64) if shared_critic
          else self.population_active))
    return replay_call(learner, state, hparams, work, None if shared_critic
                       else processes.members(self.last_active))

  def _collect_only(self) -> None:
    rows = self._processes.global_rows
    envs, episodes = self._collect(self.envs, rows(self._params),
                                   rows(self._actor_hparams))
    self.envs = _unaliased(envs)
    self._take_episodes(self._processes.host(episodes))
    self._advance(self.plan.env_steps_per_call(self.envs_per_member),
                  updated=False)

  # ------------------------------------------------------- rule actions

  def restart_members(self, members: Sequence[int] | np.ndarray) -> None:
    """As ``DeviceEnvs.restart_members``: new episodes, an empty ring and
    a warm-up of random actions."""
    if self.config.layout != 'per_member':
      raise ValueError(CLEAR_NEEDS_PER_MEMBER)
    super().restart_members(members)

  def copy_member_data(self, dst_indices, src_indices) -> None:
    """Member ``dst[k]`` gets member ``src[k]``'s ring, both numbered from
    this process's first member (``Processes.local_pairs``: a source may
    be another process's member; the copy is one program over the global
    rings). Every process calls it, with its own pairs, maybe none."""
    if self.config.layout != 'per_member':
      raise ValueError('copy_member_data needs layout="per_member"; the '
                       f'{self.config.layout} layout has no per-member data')
    first = self._local.start
    source = np.arange(first, self._local.stop)  # global member numbers
    source[np.asarray(dst_indices, np.int64)] = (
        np.asarray(src_indices, np.int64) + first)
    source = self._processes.members(source)
    dst = np.flatnonzero(source != np.arange(self.num_members))
    if not dst.size:
      return
    self.envs = self._copy(self.envs, dst.astype(np.int32),
                           source[dst].astype(np.int32))

  # ---------------------------------------------------------------- stats

  def update_steps_owed(self, env_steps: int) -> int:
    """See ``DataPath.update_steps_owed``: the update-only calls a run
    whose budget ends at ``env_steps`` (this path's count) takes before it
    stops (a resume's refill may pass its budget)."""
    steps = min(int(self._steps.min()), int(self._origin.min()) + env_steps)
    if steps < int(self._learn_after.max()):
      return 0
    earned = np.floor(self.config.update_to_data_ratio
                      * (steps - self._data_from) + 1e-9)
    return max(0, int(earned) - self.update_steps)

  def replay_bytes(self) -> int:
    rows = self.config.replay_capacity * (
        self.num_members if self.config.layout == 'per_member' else 1)
    return rows * bytes_per_transition(transition_fields(self.env.env_spec))

def _check_memory(nbytes: int, config: PipelineConfig, n: int) -> None:
  """Refuses (a ValueError naming the flag) a replay larger than
  ``DEVICE_MEMORY_FRACTION`` of the device's memory (of the machine's, on
  the CPU backend), before anything is allocated."""
  memory = device_replay.device_memory_bytes()
  if memory is None:
    try:
      memory = os.sysconf('SC_PAGE_SIZE') * os.sysconf('SC_PHYS_PAGES')
    except (ValueError, OSError):
      return
  limit = int(memory * device_replay.DEVICE_MEMORY_FRACTION)
  if nbytes > limit:
    rings = (f'{n} members x {config.replay_capacity}' if
             config.layout == 'per_member' else f'{config.replay_capacity}')
    raise ValueError(
        f'--replay-capacity {config.replay_capacity}: the on-device replay '
        f'({rings} transitions) needs {format_bytes(nbytes)}, more than '
        f'{device_replay.DEVICE_MEMORY_FRACTION:.0%} of the device\'s '
        f'{format_bytes(memory)}; lower --replay-capacity')


def _unaliased(envs: collect.EnvsState) -> collect.EnvsState:
  """``envs`` with no buffer in two leaves. An env's state may hold one
  array twice (Brax's reset returns the same zero as reward and done), and
  XLA may return one buffer for two equal outputs; a buffer donated twice
  to the next call would fail, so a repeated one is copied (a check of a
  few dozen pointers per call)."""
  seen = set()

  def own(x):
    if not isinstance(x, jax.Array):
      return x
    pointer = x.addressable_shards[0].data.unsafe_buffer_pointer()
    if pointer in seen:
      return jnp.copy(x)
    seen.add(pointer)
    return x

  return jax.tree.map(own, envs)


def host_key(seed: int, data: int | None = None) -> np.ndarray:
  """``PRNGKey(seed)`` (folded with ``data``) as numpy."""
  key = jax.random.PRNGKey(seed)
  if data is not None:
    key = jax.random.fold_in(key, data)
  return np.asarray(key)


def _split_key(envs: collect.EnvsState):
  key, sample_key = jax.random.split(envs.key)
  return envs._replace(key=key), sample_key


def _objective(value) -> float:
  """An episode's true objective as its record holds it: the record's own
  default (one NaN object, so that records of an env without one compare
  equal) where the env reports none."""
  value = float(value)
  return value if math.isfinite(value) else (
      EpisodeRecord._field_defaults['true_objective'])
