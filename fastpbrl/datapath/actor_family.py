"""What both gymnasium data paths share (host-side; not jittable): the
members' envs stepped by actor processes (``fastpbrl.actors``) that act
with the policies a ``ParamStore`` holds.

:class:`ActorPath` is the base of both: the off-policy
``fastpbrl.datapath.actor_replay.Pipeline`` (actors -> replay ->
prefetch) and the on-policy
``fastpbrl.datapath.actor_rollouts.ActorRollouts`` (one synchronous
rollout per member). It holds what they do alike: probing the env and the
population's layout, the store the actors read (policies, acting
hyperparameters, restart requests) and publishing to it, restart
requests, episode records, evaluations and random states played here on
the host, and shutdown. Beside it, the kit it is built from:
:class:`EpisodeBuffer`, :func:`chunk_episodes`, :class:`AsyncPublisher`,
:func:`probe_env_spec`, :func:`population_layout`, :func:`make_gym_env`.
"""

from __future__ import annotations

import atexit
import collections
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
from fastpbrl.actors.pool import ActorPool
from fastpbrl.core.types import EpisodeRecord, make_env_spec
from fastpbrl.datapath.common import PipelineConfig
from fastpbrl.datapath.evaluation import evaluate_population
from fastpbrl.devices.distributed import Processes
from fastpbrl.envs import params as env_params

logger = logging.getLogger(__name__)


class PipelineStalledError(TimeoutError):
  """No data arrived for ``stall_timeout_s`` while the learner waited."""


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




class PublishError(RuntimeError):
  """The publisher thread failed; the original exception is ``__cause__``."""


class AsyncPublisher:
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


def probe_env_spec(env_fn: Callable[[], Any]) -> specs.EnvironmentSpec:
  """The spec of one environment ``env_fn`` builds (and closes again)."""
  probe = env_fn()
  try:
    return make_env_spec(probe)
  finally:
    probe.close()


def population_layout(policy_params: Any,
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


def make_gym_env(env_id: str):
  """A new gymnasium env of ``env_id`` (``fastpbrl.envs.gym.make_env``)."""
  # Imported here: only the code that makes envs needs gymnasium.
  from fastpbrl.envs.gym import make_env
  return make_env(env_id)


class ActorPath:
  """Host-side (not jittable): the base of both gymnasium data paths (see
  the module). A subclass sets what its :meth:`close` reads beyond this
  class's before calling ``__init__``, then starts its store
  (:meth:`_create_store`) and actors, closing itself if that fails."""

  # The actors' envs live in their processes: a resume starts new
  # episodes, with new policy versions (``DevicePipeline``'s continue).
  restored_exactly = False
  _CLOSED = 'the data path is closed'  # what _check raises once closed

  def __init__(self, env: str | Callable[[], Any],
               agent_fn: Callable[[specs.EnvironmentSpec], Any],
               policy_params: Any, actor_hparams: Any,
               config: PipelineConfig, *, seed: int, processes, agent,
               publish_every_version: bool):
    """Probes the env, validates ``config`` for the population's size and
    sets the host state both paths keep; registers :meth:`close` at exit
    and removes shared memory dead runs left.

    Args:
      env, agent_fn, policy_params, actor_hparams, config, seed, processes,
        agent: as the subclass's.
      publish_every_version: every ``publish_async`` becomes a version,
        none is superseded (a run over several processes, whose rules
        compare versions across them).
    """
    self._closed = False
    self._pool = self._store = None
    self._publisher: AsyncPublisher | None = None
    self.publish_every_version = publish_every_version
    self.config = config
    self.seed = int(seed)
    self._env_fn = (functools.partial(make_gym_env, env)
                    if isinstance(env, str) else env)
    self.env_spec = probe_env_spec(self._env_fn)
    self._agent_fn, self._agent = agent_fn, agent
    tree, has_values, n = population_layout(policy_params, actor_hparams)
    self.num_members = n
    # One process: Processes hands every value back as it is.
    self._processes = processes or Processes(None, n)
    config.validate(n)
    # Restarts (``restart_members``): requested per member, published to
    # the actors beside the parameters.
    self._restart_requests = np.zeros(n, np.int64)
    self._lock = threading.Lock()  # guards the restart requests
    # The store's layout, with the restart requests appended, and whether
    # it holds values (published as version 1) or layouts only.
    self._store_tree = (*tree, self._restart_requests.copy() if has_values
                        else jax.ShapeDtypeStruct((n,), np.int64))
    self._store_has_values = has_values
    self._episodes = EpisodeBuffer(config.max_episode_records)
    self._last_progress = time.monotonic()
    atexit.register(self.close)
    swept = shm.sweep_stale_segments()
    if swept:
      logger.info('removed %d shared-memory segments left by dead runs: %s',
                  len(swept), ', '.join(swept))

  def _create_store(self) -> None:
    """The param store the actors read, holding the initial values as
    version 1 if ``__init__`` got values."""
    self._store = ParamStore.create(self._store_tree)
    if self._store_has_values:
      self._store.write(self._store_tree)

  # -------------------------------------------------------- policies

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
    is replaced by the next (the mailbox holds one), so nothing queues
    up. The restart requests (:meth:`restart_members`) go out with the
    parameters submitted after them, as with :meth:`publish`.

    Raises (on a later call, or in :meth:`wait_published`) what the
    publisher thread failed with.
    """
    self._check()
    with self._lock:
      restarts = self._restart_requests.copy()
    if self._publisher is None:
      self._publisher = AsyncPublisher(self._store.write,
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

  # ---------------------------------------------------- rule actions

  def restart_members(self, members: Sequence[int] | np.ndarray) -> None:
    """``members`` start new episodes with the next :meth:`publish`: the
    request goes to their actors beside the parameters (the off-policy
    path adds a warm-up and empties their replay)."""
    members = np.asarray(members, np.int64).reshape(-1)
    n = self.num_members
    if members.size and (members.min() < 0 or members.max() >= n):
      raise ValueError(f'members must be in [0, {self.num_members}); got '
                       f'{members.tolist()}')
    with self._lock:
      self._restart_requests[members] += 1

  # ---------------------------------------------------- what happened

  def drain_episodes(self) -> list[EpisodeRecord]:
    """Every episode finished since the last drain, oldest first."""
    return self._episodes.drain()

  # ------------------------------------------------- asked by rules

  def evaluate(self, policy_params: Any, actor_hparams: Any, episodes: int,
               seed: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``[N, episodes]`` returns, lengths and true objectives (every
    member's, in every process) of noise-free episodes of ``policy_params``
    (this process's rows), played here on the host by
    ``evaluation.evaluate_population``, each member seeded by its
    population index. Needs no actor: works after :meth:`close`."""
    if self._agent is None:
      self._agent = self._agent_fn(self.env_spec)
    local = self._processes.local
    return self._processes.members(evaluate_population(
        self._agent, self._env_fn, policy_params, actor_hparams, episodes,
        seed, members=list(range(local.start, local.stop))))

  def random_states(self, num_states: int, seed: int) -> np.ndarray:
    """``[num_states, *obs]`` float32 observations of one env visited by
    uniformly random actions (``numpy`` generator of ``seed``) from a reset
    seeded by ``seed``, each later reset by a seed that generator draws:
    the same states for the same env and seed. Played here on the host."""
    rng = np.random.default_rng(seed)
    env = self._env_fn()
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

  # --------------------------------------------- stats, checkpoints

  def checkpoint_state(self) -> None:
    """Nothing beside the replay (if the path has one): a resume starts
    new episodes (``restored_exactly``)."""
    return None

  @property
  def pool(self) -> ActorPool:
    return self._pool

  def _check(self) -> None:
    """Raises what stops this path: it was closed, an actor died for good
    (``ActorDiedError``), or the publisher thread failed."""
    if self._closed:
      raise RuntimeError(self._CLOSED)
    self._pool.check()
    if self._publisher is not None:
      self._publisher.check()

  # -------------------------------------------------------- shutdown

  def close(self) -> None:
    """Stops the publisher, the actors and what :meth:`_close_threads`
    adds, and unlinks shared memory (idempotent; also at interpreter
    exit)."""
    if self._closed:
      return
    self._closed = True
    atexit.unregister(self.close)
    try:
      self._close_threads()
    finally:
      try:
        if self._pool is not None:
          self._pool.close()
      finally:
        if self._store is not None:
          self._store.close()

  def _close_threads(self) -> None:
    """Stops this path's threads, before its actors and store: the
    publisher's."""
    if self._publisher is not None:
      self._publisher.close()

  def __enter__(self) -> 'ActorPath':
    return self

  def __exit__(self, *exc) -> None:
    self.close()
