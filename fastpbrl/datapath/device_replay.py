"""The off-policy on-device data path: environments written in JAX stepped
inside the learner's compiled call (host-side driver; the work is
``fastpbrl.learner.collect`` and ``PopulationLearner.update_with_envs``).

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
than ``G = 1``: each group adds the overhead of its small operations. No
transition, batch or parameter crosses to the host inside a call; after
it, only the ``[G * K, N, E]`` episode flags and returns do, to log
episodes and feed the rule.

:class:`DevicePipeline` implements ``fastpbrl.datapath.protocol.DataPath``,
as ``fastpbrl.datapath.actor_replay.Pipeline`` does, so the loop, the
rules, the logs and the checkpoints do not know which path runs. What
differs, by design:

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
* **Several processes** (``fastpbrl.launch``,
  ``fastpbrl.devices.distributed``). The envs and rings are global arrays
  over every process's devices, split by member with the learner's mesh:
  each device steps its own members' envs, and the one program is the
  single-process program partitioned over the processes. Every process
  drives the same calls (they are collectives). What the loop sees is
  this process's members, as with the actor path: ``env_steps``,
  ``last_active`` and the episode records are its rows (member numbers
  from 0), ``restart_members`` and ``copy_member_data`` take its rows,
  ``publish`` its rows of the policies; the pipeline gathers them into
  the global arrays.

The host-side parts that do not touch the replay (counters, episode
records, evaluations, restarts, checkpoints of the envs and counters,
wait statistics) are its base, ``DeviceEnvs``
(``fastpbrl.datapath.device_family``), which
``fastpbrl.datapath.device_rollouts.DeviceRollouts`` (the on-device path
of agents that learn from their own rollouts) shares.
"""

from __future__ import annotations

import logging
from typing import NamedTuple, Sequence

import jax
import numpy as np

from fastpbrl.core.types import LearnerCall, ReplaySample
from fastpbrl.datapath.common import replay_call
from fastpbrl.datapath.device_family import DeviceEnvs, host_key, unaliased
from fastpbrl.devices import distributed
from fastpbrl.devices import sharding
from fastpbrl.envs import jax_envs
from fastpbrl.learner import collect
from fastpbrl.learner.collect import Plan
from fastpbrl.replay import device as device_replay
from fastpbrl.replay.buffers import (CLEAR_NEEDS_PER_MEMBER, Replay,
                                     bytes_per_transition, transition_fields)

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
      config: a ``fastpbrl.datapath.common.PipelineConfig`` (steps per
        call, batch size, ratio, warm-up, replay layout and capacity,
        evaluation); its ``batch_size`` is also the learner's where the
        learner has none.
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
    if learner.batch_size is None:  # its fused call samples the rings
      learner.batch_size = config.batch_size
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
    self.envs = unaliased(envs)
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


def _split_key(envs: collect.EnvsState):
  key, sample_key = jax.random.split(envs.key)
  return envs._replace(key=key), sample_key

