"""The off-policy data path of gymnasium envs: actors, replay, limiter,
prefetch (host-side: processes, threads, shared memory, numpy; nothing
here is jittable).

::

  with Pipeline('HalfCheetah-v5', functools.partial(agents.make_agent, 'td3'),
                learner.policy_params(state), hparams, PipelineConfig(),
                seed=seed) as pipeline:
    while training:
      batch = pipeline.next_batch()            # Transition [N, S, B, ...]
      state, metrics = learner.update(state, hparams, batch)
      pipeline.publish(learner.policy_params(state), hparams)
      for record in pipeline.drain_episodes():
        ...                                    # returns, lengths, evals

What runs where:

* ``P`` actor processes (spawned) step the members' environments and act with
  the newest published parameters (``fastpbrl.actors``);
* in this process, one reader thread per actor inserts its chunks into the
  replay and counts env steps; a prefetch thread samples the next call's
  ``[N, S, B, ...]`` batch once the update-to-data rate limiter allows it and
  places it on the device (``fastpbrl.replay``).

What it shares with the on-policy actor path (the env, the param store
and publishing, restart requests, episode records, evaluations, shutdown)
is ``fastpbrl.datapath.actor_family.ActorPath``, its base.

:meth:`Pipeline.next_batch` never hangs silently: it raises
:class:`~fastpbrl.actors.ActorDiedError` once an actor died for good (a dead
actor is restarted ``max_actor_restarts`` times first, each death being
reported in the log and in :attr:`Pipeline.failures`), and
``PipelineStalledError`` when no transitions arrived for
``stall_timeout_s`` seconds. :meth:`Pipeline.close` (also run by the context
manager and at interpreter exit) stops everything and unlinks all shared
memory, also after Ctrl-C or an exception in the training loop.
"""

from __future__ import annotations

import collections
import logging
import time
from typing import Any, Callable, Sequence

import jax
import numpy as np
from acme import specs

from fastpbrl.actors.pool import ActorFailure, ActorPool
from fastpbrl.core.types import ReplaySample, Transition
from fastpbrl.datapath.actor_family import (ActorPath, PipelineStalledError,
                                            chunk_episodes)
from fastpbrl.datapath.common import PipelineConfig, replay_call
from fastpbrl.replay import device as device_replay
from fastpbrl.replay.buffers import (CLEAR_NEEDS_PER_MEMBER, Replay,
                                     bytes_per_transition, format_bytes,
                                     make_replay, transition_fields)
from fastpbrl.replay.prefetch import Prefetcher, WaitStats
from fastpbrl.replay.rate_limiter import RateLimiter

logger = logging.getLogger(__name__)

REPLAY_STREAM = 0  # spawn_key[0] of the replay sampler's seed sequence


class Pipeline(ActorPath):
  """Actors + replay + rate limiter + prefetch, for one population run."""

  _CLOSED = 'the pipeline is closed'

  def __init__(self, env: str | Callable[[], Any],
               agent_fn: Callable[[specs.EnvironmentSpec], Any],
               policy_params: Any, actor_hparams: Any,
               config: PipelineConfig = PipelineConfig(), seed: int = 0,
               device=None, resume_env_steps: Sequence[int] | None = None,
               replay_state: dict | None = None, mesh=None,
               carried_env_steps: float | Sequence[float] = 0.0,
               processes=None, agent=None,
               publish_every_version: bool = False):
    """Starts the actors, reader threads and prefetch thread.

    Args:
      env: a gymnasium id (``'HalfCheetah-v5'``) or a picklable callable
        returning a new environment.
      agent_fn: picklable ``env_spec -> Agent``, e.g.
        ``functools.partial(fastpbrl.agents.make_agent, 'td3')``; each actor
        process builds its agent with it.
      policy_params: the members' initial policy parameters ``[N, ...]``
        (``learner.policy_params(state)``), published as version 1; or a
        tree of ``jax.ShapeDtypeStruct`` giving only the layout, in which
        case actors wait for the first :meth:`publish` once warmed up.
      actor_hparams: the hyperparameters ``[N]`` passed to ``agent.act``
        (e.g. the population's ``TD3HParams``), values or layout as above.
      config: the pipeline settings.
      seed: the run seed; env resets, exploration, warm-up actions and
        replay sampling all derive from it.
      device: where batches are placed (``jax.device_put``'s default if None).
      resume_env_steps: ``[N]`` training env steps each member collected
        before a resume. The actors' counters continue from them (evaluation
        schedule, exploration schedule) and the members act with the
        published (restored) policies from the first step: no random
        warm-up. Without ``replay_state`` the learner waits for
        ``warmup_steps`` new steps per member (collected by those policies:
        the replay's refill); :attr:`env_steps` counts from zero again.
      carried_env_steps: a resumed run's data that earned update steps the
        run had not taken at its checkpoint (``resume.carried_env_steps``):
        the learner takes them once the refill is in, so a resumed run
        takes as many update steps in all as one never stopped.
      mesh: the learner's population mesh (``fastpbrl.devices.sharding``), if
        any: a device replay is then split over it like the members.
      replay_state: a ``Replay.state_dict()`` restored into the replay
        before any actor starts (a resume with ``--checkpoint-replay``); the
        learner then continues at once, at the target ratio of new data.
      processes: the run's ``fastpbrl.devices.distributed.Processes`` (None: one
        process); over several this pipeline holds the members
        ``processes.local`` and ``learn`` makes its batches global.
      agent: the agent ``evaluate`` plays (None: ``agent_fn(env_spec)``).
      publish_every_version: every ``publish_async`` becomes a version,
        none is superseded (a run over several processes, whose rules
        compare versions across them).
    """
    self._prefetcher = self._limiter = None  # read by close
    self.replay_on_device = False
    super().__init__(env, agent_fn, policy_params, actor_hparams, config,
                     seed=seed, processes=processes, agent=agent,
                     publish_every_version=publish_every_version)
    n = self.num_members
    self._init_host_state()
    resumed = resume_env_steps is not None
    if resumed:
      resume_env_steps = np.broadcast_to(
          np.asarray(resume_env_steps, np.int64), (n,)).copy()
    try:
      fields = transition_fields(self.env_spec)
      self._start_replay_and_store(fields, device, mesh, replay_state,
                                   resumed, carried_env_steps)
      self._start_actors(agent_fn, fields, device, resume_env_steps)
    except BaseException:
      self.close()
      raise

  def _init_host_state(self) -> None:
    """Sets the restart bookkeeping of the replay's data and the replay
    sampler's generator (``ActorPath`` keeps the restart requests)."""
    n = self.num_members
    # Per member: the restart count the replay's data belongs to, and the
    # transitions of that restart inserted so far.
    self._data_restart = np.zeros(n, np.int64)
    self._fresh = np.zeros(n, np.int64)
    self._batch_active: collections.deque = collections.deque()
    self.last_active = np.ones(n, bool)  # of the batch next_batch returned
    self._batches_taken = 0  # batches next_batch returned, since the start
    self._rng = np.random.default_rng(
        np.random.SeedSequence(self.seed, spawn_key=(REPLAY_STREAM,)))

  def _start_replay_and_store(self, fields, device, mesh,
                              replay_state: dict | None, resumed: bool,
                              carried_env_steps) -> None:
    """Makes the replay (restoring ``replay_state``), the rate limiter and
    the param store (``_create_store``)."""
    config = self.config
    self.replay = self._make_replay(fields, device, mesh)
    if replay_state is not None:
      self.replay.load_state_dict(replay_state)
      logger.info('replay restored: %s transitions per ring',
                  self.replay.sizes().tolist())
    self._limiter = RateLimiter(
        self.num_members, config.update_to_data_ratio,
        0 if replay_state is not None else
        config.warmup_steps if not resumed or config.refill_steps is None
        else config.refill_steps,
        config.env_steps_ahead(),
        # A resume's refill is data: what the run's own warm-up did not
        # count is left out of the carried steps instead.
        warmup_is_data=config.warmup_counts_as_data or resumed,
        carried_env_steps=carried_env_steps)
    self._create_store()

  def _start_actors(self, agent_fn, fields, device,
                    resume_env_steps: np.ndarray | None) -> None:
    """Makes the actor pool and the prefetcher, logs the setup, and starts
    the actors, then the prefetch thread."""
    config, n = self.config, self.num_members
    resumed = resume_env_steps is not None
    self._pool = ActorPool(
        env_fn=self._env_fn, agent_fn=agent_fn, transition_fields=fields,
        num_members=n, store=self._store, sink=self._insert, seed=self.seed,
        num_processes=config.num_actor_processes,
        chunk_steps=config.chunk_steps, queue_chunks=config.queue_chunks,
        warmup_steps=config.warmup_steps,
        eval_interval=config.eval_interval,
        eval_episodes=config.eval_episodes,
        max_restarts=config.max_actor_restarts, prng_impl=config.prng_impl,
        vectorized_envs=config.vectorized_envs,
        shutdown_grace_s=config.shutdown_grace_s,
        admit=self._limiter.wait_to_insert,
        initial_env_steps=resume_env_steps if resumed else 0,
        random_until=resume_env_steps if resumed else None,
        hang_timeout_s=config.actor_hang_timeout_s)
    self._prefetcher = Prefetcher(
        self._sample, self._limiter, config.num_steps,
        depth=config.prefetch_depth, device=device)
    logger.info('pipeline: %d members over %d actor processes, %s '
                'replay, update-to-data ratio %g, warm-up %s env steps per '
                'member', n, self._pool.num_processes, config.layout,
                config.update_to_data_ratio, config.warmup_steps)
    self._pool.start()
    self._prefetcher.start()

  # ------------------------------------------------------ background work

  def _insert(self, actor_id: int, members: np.ndarray, chunk) -> None:
    """Reader-thread sink: one chunk into the replay and the counters."""
    del actor_id
    steps, num_episodes = int(chunk['meta'][0]), int(chunk['meta'][1])
    counts, starts = chunk['restart_count'], chunk['restart_at']
    with self._lock:
      renewed = counts > self._data_restart[members]
      for j in np.flatnonzero(renewed):
        # The member's first data of a new restart: an empty replay, and
        # only the rows from the restart on.
        m = int(members[j])
        self.replay.clear([m])
        self._data_restart[m] = counts[j]
        self._fresh[m] = 0
      # Data of an older restart than the replay's (still in flight when
      # the replay was emptied) is dropped.
      current = counts == self._data_restart[members]
    keep = current & ~renewed
    if keep.all():
      self.replay.insert(members, chunk, steps)
    elif keep.any():
      self.replay.insert(members[keep], {k: v[keep] for k, v in chunk.items()
                                         if np.ndim(v) >= 2}, steps)
    for j in np.flatnonzero(renewed & current):
      first = int(starts[j])
      self.replay.insert(members[j:j + 1],
                         {k: v[j:j + 1, first:steps] for k, v in chunk.items()
                          if np.ndim(v) >= 2}, steps - first)
    with self._lock:
      self._fresh[members[keep]] += steps
      for j in np.flatnonzero(renewed & current):
        self._fresh[members[j]] += steps - int(starts[j])
    # Counted only once the data is in the replay, so the limiter never
    # lets the learner sample ahead of it.
    self._limiter.add_env_steps(members, steps)
    self._last_progress = time.monotonic()
    if num_episodes:
      self._episodes.extend(chunk_episodes(chunk))

  def _active(self) -> tuple[np.ndarray, np.ndarray]:
    """``[N]``: members whose replay holds their current restart's data,
    past its warm-up (always, for members never restarted); and the
    restart requests that mask was computed under, read under the same
    lock, so a restart requested while a batch is being sampled always
    makes that batch's mask stale (see ``next_batch``)."""
    with self._lock:
      requests = self._restart_requests.copy()
      return ((requests == 0)
              | ((self._data_restart == requests)
                 & (self._fresh >= self.config.warmup_steps))), requests

  def _make_replay(self, fields, device, mesh) -> Replay:
    """The host or the device replay, as ``config.replay_location`` and
    ``choose_replay_location`` decide; the choice is logged."""
    config, n = self.config, self.num_members
    rings = n if config.layout == 'per_member' else 1
    nbytes = bytes_per_transition(fields) * config.replay_capacity * rings
    target = device if device is not None else jax.devices()[0]
    where, why = device_replay.choose_replay_location(
        config.replay_location, target.platform, nbytes,
        device_replay.device_memory_bytes(target))
    logger.info('replay on the %s (%s): %s of %s', where, why,
                format_bytes(nbytes), target)
    self.replay_on_device = where == 'device'
    if self.replay_on_device:
      # Not committed to a device: the learner places it with its other
      # arguments (replicated over a mesh).
      self._sample_key = jax.random.PRNGKey(
          np.random.SeedSequence(self.seed, spawn_key=(REPLAY_STREAM,)
                                 ).generate_state(1)[0])
      self._samples = 0
      return device_replay.DeviceReplay(config.layout, fields, n,
                                        config.replay_capacity, device=target,
                                        mesh=mesh)
    return make_replay(config.layout, fields, n, config.replay_capacity)

  def _sample(self) -> Transition | jax.Array:
    """Prefetch thread: the next call's batch (host replay), or the key
    the call samples its batch with (device replay)."""
    active, requests = self._active()
    if self.replay_on_device:
      with self._lock:
        self._batch_active.append((active, requests))
      self._samples += 1
      return jax.random.fold_in(self._sample_key, self._samples)
    if active.all():
      batch = self.replay.sample(self._rng, self.config.num_steps,
                                 self.config.batch_size)
    else:
      batch = self.replay.sample(self._rng, self.config.num_steps,
                                 self.config.batch_size, inactive=~active)
    # One mask per sampled batch, in the prefetch queue's order, with the
    # restart requests it was computed under (see next_batch): not those
    # of now, which a restart during the sampling may already have raised.
    with self._lock:
      self._batch_active.append((active, requests))
    return batch

  # -------------------------------------------------------------- learner

  def next_batch(self, timeout: float | None = None,
                 should_stop: Callable[[], bool] | None = None
                 ) -> Transition | None:
    """The next learner call's batch, ``[N, S, B, ...]`` on the device.

    Blocks while the rate limiter holds the learner back (including the
    warm-up).

    Args:
      timeout: seconds to wait at most (``None``: as long as transitions
        keep arriving).
      should_stop: polled while waiting (every 0.25 s); once it returns
        True, ``next_batch`` returns None (a signal asked the run to stop).

    Raises:
      ActorDiedError: an actor died and was not restarted.
      PipelineStalledError: no transitions arrived for ``stall_timeout_s``.
      TimeoutError: no batch within ``timeout``.
      PrefetchError: sampling failed.
    """
    start = time.monotonic()
    while True:
      if should_stop is not None and should_stop():
        return None
      self._check()
      try:
        batch = self._prefetcher.get(timeout=0.25)
      except TimeoutError:
        if self.replay_on_device:
          self.replay.flush()  # keeps the staging area free during warm-up
      else:
        self._batches_taken += 1
        with self._lock:
          active, requests = self._batch_active.popleft()
          # A batch sampled before a member's restart holds the old
          # experiment's data: the restarted member must not learn from it.
          self.last_active = active & (requests == self._restart_requests)
        if self.replay_on_device:
          # Staged inserts go to the device now, from this (the learner's)
          # thread; the call samples from everything the limiter counted.
          self.replay.flush()
          return ReplaySample(self.replay.state, batch)
        return batch
      now = time.monotonic()
      if timeout is not None and now - start >= timeout:
        raise TimeoutError(
            f'no batch within {timeout} s; {self._progress_text()}')
      idle = now - max(self._last_progress, start)
      if idle > self.config.stall_timeout_s:
        raise PipelineStalledError(
            f'no transitions arrived for {idle:.0f} s (stall_timeout_s='
            f'{self.config.stall_timeout_s}); {self._progress_text()}')

  def learn(self, learner, state, hparams, actor_hparams, *,
            shared_critic: bool,
            should_stop: Callable[[], bool] | None = None):
    """``fastpbrl.datapath.protocol.DataPath.learn``: the learner's call on
    the next batch (:meth:`next_batch`; the actors act with the published
    hyperparameters, not ``actor_hparams``). Members restarted and still
    warming up keep their state (``last_active``)."""
    del actor_hparams
    batch = self.next_batch(should_stop=should_stop)
    processes = self._processes
    if processes.any(batch is None):
      return None  # a signal arrived while waiting (in any process)
    if not self.replay_on_device:
      # This process's rows; a device replay's rings are global already.
      batch = processes.global_rows(batch)
    return replay_call(learner, state, hparams, batch,
                       None if shared_critic
                       else processes.members(self.last_active))

  def restart_members(self, members: Sequence[int] | np.ndarray) -> None:
    """Starts ``members`` over as new experiments (HyperTrick's restarted
    slots): with the next :meth:`publish`, their actors begin a fresh
    episode and a warm-up of ``warmup_steps`` random-action steps; their
    replay is emptied when the first transitions of the restart arrive
    (anything older still in flight is dropped); and until they have
    ``warmup_steps`` new transitions, ``last_active`` is False for them, so
    the learner discards their updates.

    Needs the per-member replay layout.
    """
    if self.replay.layout != 'per-member':
      raise ValueError(CLEAR_NEEDS_PER_MEMBER)
    super().restart_members(members)

  def copy_member_data(self, dst_indices: Sequence[int] | np.ndarray,
                       src_indices: Sequence[int] | np.ndarray) -> None:
    """PBT exploit option: member ``dst[k]`` gets member ``src[k]``'s replay
    data (see ``PerMemberReplay.copy_members``)."""
    if self.replay.layout != 'per-member':
      raise ValueError('copy_member_data needs layout="per_member"; the '
                       f'{self.config.layout} layout has no per-member data')
    self.replay.copy_members(dst_indices, src_indices)

  # ---------------------------------------------------------------- stats

  def wait_stats(self) -> WaitStats:
    """How much the learner waited for data (see ``WaitStats``)."""
    return self._prefetcher.stats()

  def wait_fraction(self) -> float:
    """Fraction of wall time the learner waited for data since its first
    batch (or since :meth:`reset_wait_stats`)."""
    return self._prefetcher.stats().wait_fraction

  def reset_wait_stats(self) -> None:
    """Restarts the wait statistics from now (e.g. once the learner is warm)."""
    self._prefetcher.reset_stats()

  @property
  def env_steps(self) -> np.ndarray:
    """``[N]`` env steps collected (inserted into the replay) per member."""
    return self._limiter.env_steps

  @property
  def update_steps(self) -> int:
    """Update steps sampled for, per member."""
    return self._limiter.update_steps

  def env_steps_per_member(self) -> int:
    """Env steps collected by the member that has collected the fewest."""
    return int(self._limiter.env_steps.min())

  def update_steps_owed(self, env_steps: int) -> int:
    """See ``DataPath.update_steps_owed``: the rate limiter's count of the
    update steps earned, less those of the batches the learner took. The
    limiter counts a batch's update steps when the prefetch thread samples
    it, so the batches still queued at the end of the budget are owed:
    without them a run would end up to ``prefetch_depth + 1`` calls short
    of what its data earned."""
    return self._limiter.update_steps_owed(
        env_steps, taken=self._batches_taken * self.config.num_steps)

  def update_to_data_ratio(self) -> float:
    """Achieved ratio: update steps per env step of the slowest member."""
    return self._limiter.ratio()

  @property
  def failures(self) -> list[ActorFailure]:
    """Every actor death so far (restarted or not)."""
    return list(self._pool.failures)

  @property
  def dropped_episodes(self) -> int:
    return self._episodes.dropped

  def _progress_text(self) -> str:
    steps = self._limiter.env_steps
    needed = self._limiter.env_steps_needed(self.config.num_steps)
    return (f'env steps per member {steps.tolist()}, the next learner call '
            f'needs {needed} per member; actors:\n'
            f'{self._pool.describe_status()}')

  # ------------------------------------------------------------- shutdown

  def _close_threads(self) -> None:
    """The publisher and prefetch threads, then the rate limiter."""
    try:
      super()._close_threads()
      if self._prefetcher is not None:
        self._prefetcher.close()
    finally:
      if self._limiter is not None:
        self._limiter.close()
