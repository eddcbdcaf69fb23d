"""The on-policy data path of gymnasium envs: actor processes collect each
member's rollouts, the learner learns from them (host-side; not jittable).

For agents that learn from their own rollouts (``Agent.learns_from ==
rollout'``: PPO, A2C) on envs stepped by actor processes. It shares the
off-policy path's machinery (``fastpbrl.datapath.actor_family.ActorPath``,
its base, and ``fastpbrl.actors``): the actor processes, their env
batches, the param store, the shared-memory channels, restarts of dead or
hung actors, episode records and evaluation episodes (``--eval-every``).
What differs is the protocol::

  learner                                actor of member m
  publish version v  ------------------> waits for a version > its last
                                         T steps with v (agent.behave:
                                         actions and their log-probs)
  waits for every member's  <----------- one chunk [T] of version v
  rollout of version v                   waits for v + 1 ...
  one learner call on Rollout[N, 1, T, 1]
  publish version v + 1 -------------->  ...

**Synchronous iterations**, as Stable-Baselines3's PPO and the PPO paper
(Schulman et al., 2017, Algorithm 1): every rollout a member learns from
was collected entirely by the policy version it learns with. So nothing is
stale (PPO's clipped ratio starts at exactly 1 in each iteration, as the
paper assumes) and each member's env-step count is exact (``T`` per
iteration). The cost: the actors idle while the learner updates, and the
learner idles while the actors step (the wall time of an iteration is the
sum of both, not the larger). The next step, not built: APPO-style bounded
lag, where actors collect version ``v + 1``'s rollout with ``v`` while the
learner runs, corrected by the ratio to the behaviour log-prob that
``Rollout.log_prob`` already carries.

Limits of this path (each refused with one line):

* one env per member (``num_envs`` 1): the actors host one training env
  per member; several would need a member's envs batched apart from the
  other members' (JAX envs have them,
  ``fastpbrl.datapath.device_rollouts``);
* one iteration per learner call (``--steps-per-call`` = ``rollout_length
  x num_envs``): a call's second iteration would learn from a rollout the
  first iteration's policy did not collect, which synchronous collection
  rules out.

There is no replay: ``copy_member_data`` does nothing (an exploited member
learns from its next own rollout, collected by its new weights), a
restarted member starts new episodes with its next policy (no warm-up,
nothing to empty), the checkpoint holds no data and a resume starts new
episodes (``restored_exactly`` False), as the off-policy actors' does.
Over several processes (``fastpbrl.devices.distributed``) each holds its
members' actors, and ``learn`` makes the rollout global.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any, Callable, Optional, Sequence

import numpy as np

from fastpbrl.actors.pool import ActorPool
from fastpbrl.agents.base import rollout_steps
from fastpbrl.core.types import LearnerCall, Rollout
from fastpbrl.datapath.actor_family import (ActorPath, PipelineStalledError,
                                            chunk_episodes)
from fastpbrl.datapath.common import NoReplay, PipelineConfig, replay_call
from fastpbrl.devices.distributed import Processes
from fastpbrl.replay.buffers import transition_fields

logger = logging.getLogger(__name__)


def rollout_fields(env_spec) -> dict:
  """Per-step ``name -> (shape, dtype)`` of a ``Rollout``: the replay's
  transition fields and the behaviour policy's ``log_prob``."""
  return {**transition_fields(env_spec), 'log_prob': ((), np.dtype(np.float32))}


def check_rollout_settings(agent_config, num_steps: int,
                           agent: str = 'the agent') -> None:
  """Raises ValueError (one line, starting with the flag to change) for
  what this path refuses: ``num_envs`` > 1 (an agent setting, so the
  line names ``--agent``) and more than one iteration per call."""
  if int(agent_config.num_envs) != 1:
    raise ValueError(
        f'--agent {agent}: num_envs must be 1 with actor processes (one env '
        f'per member), got {agent_config.num_envs}; JAX envs run several')
  per_iteration = rollout_steps(agent_config)
  if num_steps != per_iteration:
    raise ValueError(
        f'--steps-per-call must be rollout_length x num_envs = '
        f'{per_iteration} with actor processes (synchronous iterations: one '
        f'rollout per learner call), got {num_steps}')


class ActorRollouts(ActorPath):
  """Synchronous on-policy rollouts from actor processes (see the module);
  a ``fastpbrl.datapath.protocol.DataPath``."""

  def __init__(self, env: str | Callable[[], Any],
               agent_fn: Callable[..., Any], policy_params: Any,
               actor_hparams: Any, config: PipelineConfig, *,
               rollout_length: int, seed: int = 0,
               resume_env_steps: Sequence[int] | None = None,
               processes: Processes | None = None, agent=None,
               publish_every_version: bool = False):
    """Starts the actors; they wait for the first :meth:`publish`.

    Args:
      env: a gymnasium id or a picklable callable returning a new env.
      agent_fn: picklable ``env_spec -> Agent`` (a rollout agent), each
        actor process builds its agent with it.
      policy_params, actor_hparams: the members' ``[N]`` layout
        (``jax.ShapeDtypeStruct`` leaves) or values, as ``Pipeline``'s.
      config: the actor settings of ``PipelineConfig`` (processes,
        evaluation, restarts, hang and stall timeouts, vectorized envs);
        its ``num_steps`` is the learner call's env steps per member, which
        must be ``rollout_length`` (``check_rollout_settings``). Replay,
        warm-up and ratio settings do not apply: an on-policy member acts
        with its policy from the first step.
      rollout_length: ``T``, env steps per member per rollout.
      seed: the run seed (env resets, sampling keys: ``Actor``'s streams).
      resume_env_steps: ``[N]`` env steps of each member at the checkpoint
        a resume starts from (the actors' evaluation schedule continues
        from them; :attr:`env_steps` counts from zero).
      processes: the run's ``fastpbrl.devices.distributed.Processes``
        (None: one).
      agent: the agent ``evaluate`` plays (None: ``agent_fn(env_spec)``).
      publish_every_version: every ``publish_async`` becomes a version,
        none is superseded (a run over several processes, whose rules
        compare versions across them).
    """
    if int(rollout_length) != config.num_steps:
      raise ValueError(f'--steps-per-call must be rollout_length = '
                       f'{rollout_length} with actor processes, got '
                       f'{config.num_steps}')
    self.replay = NoReplay()
    self.rollout_length = int(rollout_length)
    super().__init__(env, agent_fn, policy_params, actor_hparams, config,
                     seed=seed, processes=processes, agent=agent,
                     publish_every_version=publish_every_version)
    self._init_host_state()
    try:
      self._create_store()
      self._start_actors(resume_env_steps)
    except BaseException:
      self.close()
      raise

  def _init_host_state(self) -> None:
    """The rollout buffers and counters."""
    n = self.num_members
    fields = rollout_fields(self.env_spec)
    self._fields = fields
    t = self.rollout_length
    # Each member's newest rollout not taken by the learner yet, and the
    # policy version it was collected with (0: none waiting).
    self._buffers = {k: np.zeros((n, t, *shape), dtype)
                     for k, (shape, dtype) in fields.items()}
    self._ready = np.zeros(n, np.int64)
    self._cond = threading.Condition()
    self._env_steps = np.zeros(n, np.int64)
    self._discarded_steps = 0
    self._learned_version = 0  # the version of the last rollout learned
    self._waited_s = 0.0
    self._first_learn: float | None = None

  def _start_actors(self, resume_env_steps) -> None:
    config, n = self.config, self.num_members
    resumed = resume_env_steps is not None
    initial = (np.broadcast_to(np.asarray(resume_env_steps, np.int64), (n,))
               if resumed else 0)
    self._pool = ActorPool(
        env_fn=self._env_fn, agent_fn=self._agent_fn,
        transition_fields=self._fields, num_members=n, store=self._store,
        sink=self._insert, seed=self.seed,
        num_processes=config.num_actor_processes,
        chunk_steps=self.rollout_length,
        queue_chunks=2,  # one rollout in flight per actor, and room
        warmup_steps=0, eval_interval=config.eval_interval,
        eval_episodes=config.eval_episodes,
        max_restarts=config.max_actor_restarts, prng_impl=config.prng_impl,
        vectorized_envs=config.vectorized_envs,
        shutdown_grace_s=config.shutdown_grace_s, admit=self._admit,
        initial_env_steps=initial, random_until=0,
        hang_timeout_s=config.actor_hang_timeout_s, on_policy=True)
    logger.info('on-policy actors: %d members over %d actor processes, '
                'rollouts of %d steps, synchronous', n,
                self._pool.num_processes, self.rollout_length)
    self._pool.start()

  # ------------------------------------------------------ reader threads

  def _admit(self, members: np.ndarray, steps: int, timeout: float) -> bool:
    """A chunk goes in once its members' last rollouts were taken."""
    del steps
    with self._cond:
      return self._cond.wait_for(lambda: not self._ready[members].any(),
                                 timeout)

  def _insert(self, actor_id: int, members: np.ndarray, chunk) -> None:
    """Reader-thread sink: a chunk is one rollout of each of its members."""
    del actor_id
    steps, version = int(chunk['meta'][0]), int(chunk['meta'][2])
    with self._cond:
      for k, buffer in self._buffers.items():
        buffer[members] = chunk[k][:, :steps]
      self._ready[members] = version
      self._last_progress = time.monotonic()
      self._cond.notify_all()
    if int(chunk['meta'][1]):
      self._episodes.extend(chunk_episodes(chunk))

  # ------------------------------------------------------------ learner

  def next_rollout(self, should_stop: Callable[[], bool] | None = None,
                   timeout: float | None = None) -> Rollout | None:
    """Every member's rollout of the newest published version, ``[N, T,
    ...]`` numpy arrays; None once ``should_stop()`` turned True while it
    waited (polled every 0.25 s). A rollout of an older version (an actor
    restarted after it sent one) is discarded.

    Raises:
      RuntimeError: no version newer than the last learned one was
        published (the loop publishes after every learner call).
      ActorDiedError: an actor died and was not restarted.
      PipelineStalledError: no rollout arrived for ``stall_timeout_s``.
      TimeoutError: none within ``timeout`` seconds.
    """
    start = time.monotonic()
    if self._first_learn is None:
      self._first_learn = start
    while not self.wait_published(0.25):
      if should_stop is not None and should_stop():
        return None
      self._check()
    version = self._store.version
    if version <= self._learned_version:
      raise RuntimeError(
          f'no policy newer than version {self._learned_version} was '
          'published since the last rollout: the on-policy actors wait for '
          'it (publish after every learner call)')
    with self._cond:
      while True:
        stale = (self._ready > 0) & (self._ready < version)
        if stale.any():
          self._discard(stale, version)
        if (self._ready == version).all():
          break
        self._cond.wait(0.25)
        now = time.monotonic()
        if should_stop is not None and should_stop():
          self._waited_s += now - start
          return None
        self._check()
        idle = now - max(self._last_progress, start)
        if idle > self.config.stall_timeout_s:
          raise PipelineStalledError(
              f'no rollout arrived for {idle:.0f} s (stall_timeout_s='
              f'{self.config.stall_timeout_s}); waiting for version '
              f'{version}, members have {self._ready.tolist()}; actors:\n'
              f'{self._pool.describe_status()}')
        if timeout is not None and now - start >= timeout:
          raise TimeoutError(f'no rollout within {timeout} s')
      rollout = Rollout(**{k: v.copy() for k, v in self._buffers.items()})
      self._ready[:] = 0
      # Counted when learned, not when received: the rollout the actors
      # collect after the loop's last publish (at the end of the budget,
      # or while a checkpoint is written) is never learned from, and a
      # checkpoint's env steps, which a resume's actors continue from,
      # must be those the learner took.
      self._env_steps += self.rollout_length
      self._cond.notify_all()  # the readers' admit
    self._learned_version = version
    self._waited_s += time.monotonic() - start
    return rollout

  def _discard(self, stale: np.ndarray, version: int) -> None:
    """Drops rollouts older than ``version`` (caller holds ``_cond``)."""
    steps = int(stale.sum()) * self.rollout_length
    self._discarded_steps += steps
    logger.warning('discarding rollouts of members %s: collected by '
                   'versions %s, the learner needs version %d',
                   np.flatnonzero(stale).tolist(),
                   self._ready[stale].tolist(), version)
    self._ready[stale] = 0
    self._cond.notify_all()

  def learn(self, learner, state, hparams, actor_hparams, *,
            shared_critic: bool,
            should_stop: Optional[Callable[[], bool]] = None
            ) -> Optional[LearnerCall]:
    """``DataPath.learn``: waits for every member's rollout of the newest
    published version, then runs ``learner``'s call on it as ``Rollout[N,
    1, T, 1, ...]`` (one iteration of one env per member). The actors act
    with the published hyperparameters, not ``actor_hparams``."""
    del actor_hparams
    rollout = self.next_rollout(should_stop)
    processes = self._processes
    if processes.any(rollout is None):
      return None  # a signal arrived while waiting (in any process)
    # [N, T, ...] -> [N, I = 1, T, E = 1, ...]
    rollout = Rollout(*(x[:, None, :, None] for x in rollout))
    n = self.num_members
    return replay_call(
        learner, state, hparams, processes.global_rows(rollout),
        None if shared_critic else processes.members(np.ones(n, bool)))

  # ---------------------------------------------------- what happened

  @property
  def env_steps(self) -> np.ndarray:
    """``[N]`` env steps per member of the rollouts the learner took
    (``next_rollout``; not those discarded as stale, nor one received but
    not taken yet; a resumed run's count from zero)."""
    with self._cond:
      return self._env_steps.copy()

  def env_steps_per_member(self) -> int:
    return int(self.env_steps.min())

  def update_steps_owed(self, env_steps: int) -> int:
    """0: a learner call takes each rollout as it arrives, and no data
    is left over (an on-policy member's update steps are its env steps)."""
    del env_steps
    return 0

  @property
  def discarded_steps(self) -> int:
    """Env steps of rollouts discarded as stale (see ``next_rollout``)."""
    return self._discarded_steps

  # ---------------------------------------------------- rule actions

  def copy_member_data(self, dst_indices: Sequence[int],
                       src_indices: Sequence[int]) -> None:
    """Nothing: there is no replay. An exploited member learns from the
    next rollout its new weights collect."""
    del dst_indices, src_indices

  # --------------------------------------------- stats, checkpoints

  def wait_fraction(self) -> float:
    """Fraction of wall time since the first ``learn`` that the learner
    waited for rollouts (the actors' share of a synchronous iteration)."""
    if self._first_learn is None:
      return 0.0
    wall = time.monotonic() - self._first_learn
    return min(1.0, self._waited_s / wall) if wall > 0 else 0.0
