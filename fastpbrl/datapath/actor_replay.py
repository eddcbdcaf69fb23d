"""The data pipeline a training loop uses: actors, replay, limiter, prefetch.

Host-side module (processes, threads, shared memory, numpy; nothing here is
jittable).

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

:meth:`Pipeline.next_batch` never hangs silently: it raises
:class:`~fastpbrl.actors.ActorDiedError` once an actor died for good (a dead
actor is restarted ``max_actor_restarts`` times first, each death being
reported in the log and in :attr:`Pipeline.failures`), and
:class:`PipelineStalledError` when no transitions arrived for
``stall_timeout_s`` seconds. :meth:`Pipeline.close` (also run by the context
manager and at interpreter exit) stops everything and unlinks all shared
memory, also after Ctrl-C or an exception in the training loop.
"""

from __future__ import annotations

import atexit
import collections
import dataclasses
import functools
import logging
import threading
import time
from typing import Any, Callable, Sequence

import jax
import numpy as np
from acme import specs

from fastpbrl.actors import shm
from fastpbrl.actors.param_store import ParamStore
from fastpbrl.actors.pool import ActorFailure, ActorPool
from fastpbrl.core.types import EpisodeRecord
from fastpbrl.core.types import (LearnerCall, ReplaySample, Transition,
                                 make_env_spec)
from fastpbrl.datapath.evaluation import evaluate_population
from fastpbrl.devices.distributed import Processes
from fastpbrl.envs import params as env_params
from fastpbrl.replay import device as device_replay
from fastpbrl.replay.buffers import (CLEAR_NEEDS_PER_MEMBER, LAYOUTS, Replay,
                                     bytes_per_transition, format_bytes,
                                     make_replay, transition_fields)
from fastpbrl.replay.prefetch import Prefetcher, WaitStats
from fastpbrl.replay.rate_limiter import RateLimiter

logger = logging.getLogger(__name__)


class PipelineStalledError(TimeoutError):
  """No transitions arrived for ``stall_timeout_s`` while the learner waited."""


@dataclasses.dataclass(frozen=True)
class PipelineConfig:
  """Static settings of the data pipeline."""

  num_steps: int = 50
  """Update steps per learner call ``S`` (the learner's ``num_steps``)."""
  batch_size: int = 256
  """Transitions per member per update step ``B``."""
  layout: str = 'per_member'
  """Replay layout: ``per_member`` (PBT, seeds) or ``shared`` (CEM-RL, DvD)."""
  replay_capacity: int = 1_000_000
  """Transitions per ring (per member, or in total for ``shared``)."""
  update_to_data_ratio: float = 1.0
  """Update steps per collected env step, per member (the limiter's cap)."""
  warmup_steps: int | tuple[int, ...] = 10_000
  """Random-action env steps per member before learning (int or N ints)."""
  warmup_counts_as_data: bool = True
  """Whether the warm-up's env steps count toward the update-to-data ratio
  (True: the learner catches up right after the warm-up; False: updates
  start at zero there, as in TD3's and SB3's reference loops)."""
  refill_steps: int | None = None
  """A resume without its replay: env steps per member the restored
  policies collect before learning goes on (None: ``warmup_steps``; the
  run passes what is left of its budget when that is less)."""
  max_env_steps_ahead: int | None = None
  """Env steps a member's actor may run ahead of the learner's needs before
  its data is held back and it blocks; None: ``(prefetch_depth + 2) *
  ceil(num_steps / update_to_data_ratio) + chunk_steps``. At least
  ``ceil(num_steps / update_to_data_ratio) + chunk_steps``."""
  num_actor_processes: int | None = None
  """Actor processes ``P``; default: ``fastpbrl.actors.default_num_processes``
  (available cores minus one; every core on the on-policy path), at most N."""
  chunk_steps: int = 32
  """Env steps per member an actor sends in one chunk."""
  queue_chunks: int = 8
  """Chunks an actor's channel holds before the actor blocks."""
  prefetch_depth: int = 2
  """Learner calls' batches sampled ahead."""
  eval_interval: int = 0
  """Training env steps per member between evaluations (0: none)."""
  eval_episodes: int = 1
  """Noise-free episodes per evaluation."""
  max_actor_restarts: int = 3
  """Restarts per actor process before its death stops the run."""
  stall_timeout_s: float = 300.0
  """``next_batch`` raises if no transitions arrived for this long."""
  prng_impl: str = 'threefry2x32'
  """``jax.random`` implementation of the actors' exploration keys."""
  vectorized_envs: bool = True
  """Actors step their envs as one vectorized batch where
  ``fastpbrl.actors.vector_envs`` has one."""
  max_episode_records: int = 100_000
  """Undrained episode records kept (the oldest are dropped beyond)."""
  shutdown_grace_s: float = 5.0
  """Seconds actors get to stop on ``close`` before SIGKILL."""
  actor_hang_timeout_s: float | None = 120.0
  """An actor alive but without a heartbeat for this long is killed and
  restarted like a dead one (None: never)."""
  replay_location: str = 'auto'
  """``host`` (numpy, sampled by the prefetch thread), ``device`` (sampled
  inside the learner call) or ``auto`` (``choose_replay_location``)."""

  def validate(self, num_members: int) -> None:
    """Raises ValueError naming the first setting out of its range."""

    def need(ok: bool, name: str, allowed: str):
      if not ok:
        raise ValueError(f'{name} must be {allowed}; got '
                         f'{getattr(self, name)!r}')

    need(self.num_steps >= 1, 'num_steps', '>= 1')
    need(self.batch_size >= 1, 'batch_size', '>= 1')
    need(self.layout in LAYOUTS, 'layout', f'one of {LAYOUTS}')
    need(self.replay_location in device_replay.LOCATIONS, 'replay_location',
         f'one of {device_replay.LOCATIONS}')
    need(self.replay_capacity >= 1, 'replay_capacity', '>= 1')
    need(np.isfinite(self.update_to_data_ratio)
         and self.update_to_data_ratio > 0, 'update_to_data_ratio',
         'in (0, inf)')
    warmup = np.asarray(self.warmup_steps)
    need(warmup.ndim == 0 or warmup.shape == (num_members,), 'warmup_steps',
         f'an int or {num_members} ints (one per member)')
    need(bool((warmup >= 0).all()), 'warmup_steps', '>= 0')
    need(self.num_actor_processes is None
         or 1 <= self.num_actor_processes <= num_members,
         'num_actor_processes', f'None or in [1, {num_members}]')
    need(self.chunk_steps >= 1, 'chunk_steps', '>= 1')
    need(self.queue_chunks >= 1, 'queue_chunks', '>= 1')
    need(self.prefetch_depth >= 1, 'prefetch_depth', '>= 1')
    need(self.eval_interval >= 0, 'eval_interval', '>= 0')
    need(self.eval_episodes >= 1, 'eval_episodes', '>= 1')
    need(self.max_actor_restarts >= 0, 'max_actor_restarts', '>= 0')
    need(self.stall_timeout_s > 0, 'stall_timeout_s', '> 0')
    need(self.max_episode_records >= 1, 'max_episode_records', '>= 1')
    need(self.shutdown_grace_s >= 0, 'shutdown_grace_s', '>= 0')
    need(self.actor_hang_timeout_s is None or self.actor_hang_timeout_s > 0,
         'actor_hang_timeout_s', 'None or > 0')
    least = self.steps_per_call_in_env_steps() + self.chunk_steps
    need(self.max_env_steps_ahead is None or self.max_env_steps_ahead >= least,
         'max_env_steps_ahead',
         f'None or >= ceil(num_steps / update_to_data_ratio) + chunk_steps = '
         f'{least} (else the learner could starve)')

  def steps_per_call_in_env_steps(self) -> int:
    """Env steps per member one learner call needs at the target ratio."""
    return int(np.ceil(self.num_steps / self.update_to_data_ratio))

  def env_steps_ahead(self) -> int:
    """``max_env_steps_ahead`` with the default resolved."""
    if self.max_env_steps_ahead is not None:
      return self.max_env_steps_ahead
    return ((self.prefetch_depth + 2) * self.steps_per_call_in_env_steps()
            + self.chunk_steps)


REPLAY_STREAM = 0  # spawn_key[0] of the replay sampler's seed sequence


def chunk_episodes(chunk) -> list[EpisodeRecord]:
  """The episodes an actor's chunk (``fastpbrl.actors.channel``) ended,
  as records (copied out of the chunk's views)."""
  k = int(chunk['meta'][1])
  return [EpisodeRecord(int(m), float(r), int(l), bool(e), int(s), int(v),
                        int(v0), float(o))
          for m, r, l, e, s, v, v0, o in zip(
              chunk['episode_member'][:k], chunk['episode_return'][:k],
              chunk['episode_length'][:k], chunk['episode_evaluation'][:k],
              chunk['episode_env_steps'][:k],
              chunk['episode_policy_version'][:k],
              chunk['episode_start_version'][:k],
              chunk['episode_objective'][:k])]


class EpisodeBuffer:
  """Host-side: the episode records not drained yet, filled by reader
  threads, drained by the loop's; the oldest are dropped (and counted)
  beyond ``maxlen``."""

  def __init__(self, maxlen: int):
    self._records: collections.deque = collections.deque(maxlen=maxlen)
    self._lock = threading.Lock()
    self.dropped = 0

  def extend(self, records: Sequence[EpisodeRecord]) -> None:
    with self._lock:
      overflow = len(self._records) + len(records) - self._records.maxlen
      if overflow > 0:
        if not self.dropped:
          logger.warning('episode records are not being drained; keeping '
                         'the newest %d', self._records.maxlen)
        self.dropped += overflow
      self._records.extend(records)

  def drain(self) -> list[EpisodeRecord]:
    """Every record since the last drain, oldest first."""
    with self._lock:
      records = list(self._records)
      self._records.clear()
    return records


def evaluate_local(agent, env_fn, processes, policy_params: Any,
                   actor_hparams: Any, episodes: int, seed: int
                   ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
  """``[N, episodes]`` returns, lengths and true objectives (every
  member's, in every process) of noise-free episodes of ``policy_params`` (this process's
  rows), played here on the host by ``evaluation.evaluate_population``,
  each member seeded by its population index."""
  local = processes.local
  return processes.members(evaluate_population(
      agent, env_fn, policy_params, actor_hparams, episodes, seed,
      members=list(range(local.start, local.stop))))


def random_states(env_fn, num_states: int, seed: int) -> np.ndarray:
  """``[num_states, *obs]`` float32 observations of one env visited by
  uniformly random actions (``numpy`` generator of ``seed``) from a reset
  seeded by ``seed``, each later reset by a seed that generator draws:
  the same states for the same env and seed. Played here on the host."""
  rng = np.random.default_rng(seed)
  env = env_fn()
  states = []
  try:
    obs, _ = env.reset(seed=seed)
    space = env.action_space
    while len(states) < num_states:
      states.append(np.asarray(obs, np.float32))
      obs, _, terminated, truncated, _ = env.step(
          rng.uniform(space.low, space.high).astype(space.dtype))
      if terminated or truncated:
        obs, _ = env.reset(seed=int(rng.integers(2**31)))
  finally:
    env.close()
  return np.stack(states)


def replay_call(learner, state, hparams, batch,
                active: np.ndarray | None) -> LearnerCall:
  """The learner's call on a replay ``batch`` (or a device replay's key),
  for both data paths: ``active`` (``[N]`` bool) members keep their update
  (those warming up after a restart keep their state), or ``None``: the
  shared critic's population update, which counts as no member's own."""
  if active is None:
    state, metrics = learner.update(state, hparams, batch)
    n = len(jax.tree.leaves(hparams)[0])
    return LearnerCall(state, metrics, np.zeros(n, np.int64))
  state, metrics = learner.update(state, hparams, batch, active)
  return LearnerCall(state, metrics, learner.num_steps * active)


class PolicyPublisher:
  """Host-side: the ``publish`` half of a data path whose actors read a
  ``ParamStore`` of ``(policy_params, actor_hparams, restart_requests)``
  (``Pipeline``, ``fastpbrl.datapath.actor_rollouts.ActorRollouts``). Needs
  ``_store``, ``_publisher`` (None until the first ``publish_async``),
  ``_lock``, ``_restart_requests``, ``publish_every_version`` and
  ``_check()``."""

  def publish(self, policy_params: Any, actor_hparams: Any) -> int:
    """Writes the members' newest parameters for the actors.

    Call after each learner call. Copies to the host (so it waits for that
    call to finish) and returns the new version number.
    """
    self._check()
    if self._publisher is not None:
      self._publisher.wait(None)  # an older asynchronous one lands first
    with self._lock:
      restarts = self._restart_requests.copy()
    return self._store.write((*jax.device_get(
        (policy_params, env_params.for_actors(actor_hparams))), restarts))

  def publish_async(self, policy_params: Any, actor_hparams: Any) -> None:
    """:meth:`publish` off the caller's critical path.

    Starts the device-to-host copies (``copy_to_host_async``) and returns at
    once; a publisher thread waits for them and writes the store. So the
    training loop can dispatch learner call ``k + 1`` while call ``k``'s
    parameters are still being computed and copied: actors then act, for
    up to one call longer, with parameters one call older, which
    off-policy learning (TD3, SAC, DQN; the replay holds far older data)
    tolerates (the on-policy actors wait for the new version instead).
    Only the newest submission counts: one the thread has not taken yet
    is replaced by the next (the mailbox holds one), so nothing queues up. The restart requests (:meth:`restart_members`) go out with
    the parameters submitted after them, as with :meth:`publish`.

    Raises (on a later call, or in :meth:`wait_published`) what the
    publisher thread failed with.
    """
    self._check()
    with self._lock:
      restarts = self._restart_requests.copy()
    if self._publisher is None:
      self._publisher = _AsyncPublisher(self._store.write,
                                        keep_every=self.publish_every_version)
    self._publisher.submit(
        (policy_params, env_params.for_actors(actor_hparams), restarts))

  def wait_published(self, timeout: float | None = None) -> bool:
    """Waits until the newest :meth:`publish_async` is in the store (True),
    or ``timeout`` seconds passed (False)."""
    if self._publisher is None:
      return True
    return self._publisher.wait(timeout)

  @property
  def policy_version(self) -> int:
    return self._store.version


class Pipeline(PolicyPublisher):
  """Actors + replay + rate limiter + prefetch, for one population run."""

  def __init__(self, env: str | Callable[[], Any],
               agent_fn: Callable[[specs.EnvironmentSpec], Any],
               policy_params: Any, actor_hparams: Any,
               config: PipelineConfig = PipelineConfig(), seed: int = 0,
               device=None, resume_env_steps: Sequence[int] | None = None,
               replay_state: dict | None = None, mesh=None,
               carried_env_steps: float | Sequence[float] = 0.0,
               processes=None, agent=None):
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
    """
    self._closed = False
    self._pool = self._prefetcher = self._store = self._limiter = None
    self._publisher: _AsyncPublisher | None = None
    self.replay_on_device = False
    # True: every publish_async becomes a version, none is superseded (a run
    # over several processes, whose rules compare versions across them).
    self.publish_every_version = False
    self.config = config
    self.seed = int(seed)
    self._env_fn = (functools.partial(_make_gym_env, env)
                    if isinstance(env, str) else env)
    self.env_spec = _probe_env_spec(self._env_fn)
    self._agent_fn, self._agent = agent_fn, agent
    tree, has_values, n = _population_layout(policy_params, actor_hparams)
    self.num_members = n
    # One process: Processes hands every value back as it is.
    self._processes = processes or Processes(None, n)
    config.validate(n)
    tree = self._init_host_state(tree, has_values)
    resumed = resume_env_steps is not None
    if resumed:
      resume_env_steps = np.broadcast_to(
          np.asarray(resume_env_steps, np.int64), (n,)).copy()
    try:
      fields = transition_fields(self.env_spec)
      self._start_replay_and_store(fields, tree, has_values, device, mesh,
                                   replay_state, resumed, carried_env_steps)
      self._start_actors(agent_fn, fields, device, resume_env_steps)
    except BaseException:
      self.close()
      raise

  def _init_host_state(self, tree: tuple, has_values: bool) -> tuple:
    """Sets the restart, episode and progress bookkeeping and the replay
    sampler's generator, registers :meth:`close` at exit and removes stale
    shared memory; returns ``tree`` with the restart requests appended (the
    store's layout)."""
    n, config = self.num_members, self.config
    # Restarts (``restart_members``): requested per member, published to the
    # actors beside the parameters; the count the replay's data belongs to;
    # transitions of that restart inserted so far.
    self._restart_requests = np.zeros(n, np.int64)
    self._data_restart = np.zeros(n, np.int64)
    self._fresh = np.zeros(n, np.int64)
    self._batch_active: collections.deque = collections.deque()
    self.last_active = np.ones(n, bool)  # of the batch next_batch returned
    self._batches_taken = 0  # batches next_batch returned, since the start
    tree = (*tree, self._restart_requests.copy() if has_values else
            jax.ShapeDtypeStruct((n,), np.int64))
    self._lock = threading.Lock()
    self._episodes = EpisodeBuffer(config.max_episode_records)
    self._last_progress = time.monotonic()
    self._rng = np.random.default_rng(
        np.random.SeedSequence(self.seed, spawn_key=(REPLAY_STREAM,)))
    atexit.register(self.close)
    swept = shm.sweep_stale_segments()
    if swept:
      logger.info('removed %d shared-memory segments left by dead runs: %s',
                  len(swept), ', '.join(swept))
    return tree

  def _start_replay_and_store(self, fields, tree: tuple, has_values: bool,
                              device, mesh, replay_state: dict | None,
                              resumed: bool, carried_env_steps) -> None:
    """Makes the replay (restoring ``replay_state``), the rate limiter and
    the param store (``tree`` published as version 1 if it holds values)."""
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
    self._store = ParamStore.create(tree)
    if has_values:
      self._store.write(tree)

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

  def _check(self) -> None:
    if self._closed:
      raise RuntimeError('the pipeline is closed')
    self._pool.check()
    if self._publisher is not None:
      self._publisher.check()

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
    """``fastpbrl.datapath.protocol.DataPath.learn``: the learner's call on the next
    batch (:meth:`next_batch`; the actors act with the published
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

  def evaluate(self, policy_params: Any, actor_hparams: Any, episodes: int,
               seed: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``[N, episodes]`` returns, lengths and true objectives (every member's, in every
    process) of noise-free episodes of ``policy_params`` (this process's
    rows), played here on the host by ``evaluation.evaluate_population``,
    each member seeded by its population index. Needs no actor: works
    after :meth:`close`."""
    if self._agent is None:
      self._agent = self._agent_fn(self.env_spec)
    return evaluate_local(self._agent, self._env_fn, self._processes,
                          policy_params, actor_hparams, episodes, seed)

  def random_states(self, num_states: int, seed: int) -> np.ndarray:
    """``[num_states, *obs]`` float32 observations of one env visited by
    uniformly random actions (``numpy`` generator of ``seed``) from a reset
    seeded by ``seed``, each later reset by a seed that generator draws:
    the same states for the same env and seed. Played here on the host."""
    return random_states(self._env_fn, num_states, seed)

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
    members = np.asarray(members, np.int64).reshape(-1)
    if members.size and (members.min() < 0 or members.max() >= self.num_members):
      raise ValueError(f'members must be in [0, {self.num_members}); got '
                       f'{members.tolist()}')
    with self._lock:
      self._restart_requests[members] += 1

  def drain_episodes(self) -> list[EpisodeRecord]:
    """Every episode completed since the last drain, oldest first."""
    return self._episodes.drain()

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

  # The actors' envs live in their processes: a resume starts new
  # episodes, with new policy versions (``DevicePipeline``'s continue).
  restored_exactly = False

  def checkpoint_state(self) -> None:
    """Nothing beside the replay: see ``restored_exactly``."""
    return None

  @property
  def failures(self) -> list[ActorFailure]:
    """Every actor death so far (restarted or not)."""
    return list(self._pool.failures)

  @property
  def pool(self) -> ActorPool:
    return self._pool

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

  def close(self) -> None:
    """Stops actors and threads and unlinks shared memory (idempotent)."""
    if self._closed:
      return
    self._closed = True
    atexit.unregister(self.close)
    try:
      if self._publisher is not None:
        self._publisher.close()
      if self._prefetcher is not None:
        self._prefetcher.close()
    finally:
      try:
        if self._limiter is not None:
          self._limiter.close()
      finally:
        try:
          if self._pool is not None:
            self._pool.close()
        finally:
          if self._store is not None:
            self._store.close()

  def __enter__(self) -> 'Pipeline':
    return self

  def __exit__(self, *exc) -> None:
    self.close()


class PublishError(RuntimeError):
  """The publisher thread failed; the original exception is ``__cause__``."""


class _AsyncPublisher:
  """Host-side (not jittable): a thread writing the newest submitted tree.

  A one-slot mailbox: ``submit`` replaces a submission the thread has not
  taken yet, so at most one tree waits and one is being written.
  """

  def __init__(self, write: Callable[[Any], int],
               name: str = 'fastpbrl-publish', keep_every: bool = False):
    self._write = write
    # keep_every: ``submit`` waits for the thread to take the previous tree
    # instead of replacing it, so every submission becomes a version (the
    # processes of a multi-process run then number versions alike).
    self._keep_every = keep_every
    self._cond = threading.Condition()
    self._pending: Any = None
    self._busy = False
    self._stop = False
    self._error: BaseException | None = None
    self.replaced = 0  # submissions superseded before the thread took them
    self._thread = threading.Thread(target=self._run, name=name, daemon=True)
    self._thread.start()

  def submit(self, tree: Any) -> None:
    for leaf in jax.tree.leaves(tree):
      if isinstance(leaf, jax.Array):
        leaf.copy_to_host_async()  # starts the copy; does not wait
    with self._cond:
      self._raise_if_failed()
      if self._stop:
        raise RuntimeError('the publisher is closed')
      while self._keep_every and self._pending is not None:
        self._cond.wait(0.1)  # the thread takes it within one write
        self._raise_if_failed()
        if self._stop:
          raise RuntimeError('the publisher is closed')
      if self._pending is not None:
        self.replaced += 1
      self._pending = tree
      self._cond.notify_all()

  def _run(self) -> None:
    while True:
      with self._cond:
        while self._pending is None and not self._stop:
          self._cond.wait(0.1)
        if self._stop:
          return
        tree, self._pending, self._busy = self._pending, None, True
        self._cond.notify_all()  # a waiting keep_every submit goes on
      try:
        self._write(jax.device_get(tree))
      except BaseException as e:  # reported by check(), submit() and wait()
        with self._cond:
          self._error = e
          self._stop = True
      finally:
        with self._cond:
          self._busy = False
          self._cond.notify_all()

  def _raise_if_failed(self) -> None:
    if self._error is not None:
      first = (str(self._error).strip().splitlines() or [''])[0]
      raise PublishError(f'publishing parameters failed: '
                         f'{type(self._error).__name__}: {first}'
                         ) from self._error

  def check(self) -> None:
    with self._cond:
      self._raise_if_failed()

  def wait(self, timeout: float | None) -> bool:
    deadline = None if timeout is None else time.monotonic() + timeout
    with self._cond:
      while self._pending is not None or self._busy:
        self._raise_if_failed()
        if self._stop:
          break
        left = None if deadline is None else deadline - time.monotonic()
        if left is not None and left <= 0:
          return False
        self._cond.wait(0.1 if left is None else min(0.1, left))
      self._raise_if_failed()
      return self._pending is None and not self._busy

  def close(self, timeout: float = 5.0) -> None:
    with self._cond:
      self._stop = True
      self._cond.notify_all()
    self._thread.join(timeout)


def _probe_env_spec(env_fn: Callable[[], Any]) -> specs.EnvironmentSpec:
  """The spec of one environment ``env_fn`` builds (and closes again)."""
  probe = env_fn()
  try:
    return make_env_spec(probe)
  finally:
    probe.close()


def _population_layout(policy_params: Any,
                       actor_hparams: Any) -> tuple[tuple, bool, int]:
  """``(policy_params, actor_hparams)`` as the actors read them
  (``env_params.for_actors``; copied to the host if it holds values),
  whether it holds values (not ``jax.ShapeDtypeStruct`` layouts), and the
  population size ``N`` every leaf leads with."""
  tree = (policy_params, env_params.for_actors(actor_hparams))
  has_values = not any(isinstance(x, jax.ShapeDtypeStruct)
                       for x in jax.tree.leaves(tree))
  if has_values:
    tree = jax.device_get(tree)
  shapes = [tuple(x.shape) if hasattr(x, 'shape') else np.shape(x)
            for x in jax.tree.leaves(tree)]
  sizes = {shape[0] if shape else None for shape in shapes}
  if len(sizes) != 1 or None in sizes:
    raise ValueError('policy_params and actor_hparams need one leading '
                     f'population axis on every leaf; got sizes {sizes}')
  return tree, has_values, sizes.pop()


def _make_gym_env(env_id: str):
  from fastpbrl.envs.gym import make_env  # local: only env-making code needs gymnasium
  return make_env(env_id)
