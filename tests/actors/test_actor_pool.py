"""The actor pool with real spawned processes on a toy environment: chunks for
every member, backpressure, a failing actor's traceback, a killed actor
restarted then fatal, clean shutdown."""

import collections
import functools
import os
import signal
import threading
import time

import gymnasium as gym
import jax
import numpy as np
import pytest

from fastpbrl import agents
from fastpbrl.actors import ActorDiedError, ActorPool, ParamStore, split_members
from fastpbrl.agents.td3 import TD3Config
from fastpbrl.core.types import make_env_spec
from fastpbrl.learner.population import PopulationLearner, population_hparams
from fastpbrl.replay import transition_fields

pytestmark = pytest.mark.slow

CONFIG = TD3Config(hidden_sizes=(8,))


class CountEnv(gym.Env):
  """obs = [steps since reset]; episodes of 10 steps; optionally raises."""

  def __init__(self, crash_after: int | None = None):
    self.observation_space = gym.spaces.Box(-np.inf, np.inf, (1,), np.float32)
    self.action_space = gym.spaces.Box(-1.0, 1.0, (1,), np.float32)
    self.crash_after = crash_after
    self.total = 0
    self.t = 0

  def reset(self, *, seed=None, options=None):
    super().reset(seed=seed)
    self.t = 0
    return np.array([0.0], np.float32), {}

  def step(self, action):
    self.total += 1
    if self.crash_after is not None and self.total > self.crash_after:
      raise RuntimeError(f'env exploded at step {self.total}')
    self.t += 1
    return (np.array([self.t], np.float32), 1.0, self.t == 10, False, {})


def make_env(crash_after=None):
  return CountEnv(crash_after)


class Collector:
  """A sink that checks every chunk and counts steps per member."""

  def __init__(self, n):
    self.steps = np.zeros(n, np.int64)
    self.chunks = 0
    self.lock = threading.Lock()

  def __call__(self, actor_id, members, chunk):
    del actor_id
    t = int(chunk['meta'][0])
    obs, nxt = chunk['observation'][:, :t, 0], chunk['next_observation'][:, :t,
                                                                         0]
    assert (nxt == obs + 1).all()
    assert ((chunk['terminated'][:, :t] == 1) == (nxt == 10)).all()
    with self.lock:
      self.steps[members] += t
      self.chunks += 1


def make_pool(n, sink, store, **kwargs):
  spec = make_env_spec(make_env())
  kwargs.setdefault('env_fn', make_env)
  return ActorPool(
      agent_fn=functools.partial(agents.make_agent, 'td3', config=CONFIG),
      transition_fields=transition_fields(spec), num_members=n, store=store,
      sink=sink, seed=0, chunk_steps=8, poll_s=0.1, **kwargs)


@functools.lru_cache(maxsize=None)
def population_tree(n):
  spec = make_env_spec(make_env())
  agent = agents.make_agent('td3', spec, CONFIG)
  hparams = population_hparams(agent, n)
  learner = PopulationLearner(agent)
  state = learner.init(jax.random.PRNGKey(0), hparams)
  return jax.device_get((learner.policy_params(state), hparams))


def make_store(n):
  tree = population_tree(n)
  store = ParamStore.create(tree)
  store.write(tree)
  return store


def wait_for(condition, timeout, pool=None, what='condition'):
  deadline = time.monotonic() + timeout
  while not condition():
    if pool is not None:
      pool.check()
    if time.monotonic() > deadline:
      status = pool.describe_status() if pool is not None else ''
      raise AssertionError(f'{what} not met within {timeout} s\n{status}')
    time.sleep(0.05)


def our_segments():
  return [f for f in os.listdir('/dev/shm')
          if f.startswith(f'fpbrl_{os.getpid()}_')]


def gone(pid):
  try:
    os.kill(pid, 0)
  except ProcessLookupError:
    return True
  with open(f'/proc/{pid}/status') as f:  # a zombie is gone too
    return 'State:\tZ' in f.read()


def test_split_members():
  assert split_members(5, 2) == [(0, 1, 2), (3, 4)]
  assert split_members(4, 4) == [(0,), (1,), (2,), (3,)]
  with pytest.raises(ValueError, match=r'num_processes must be in \[1, 3\]'):
    split_members(3, 4)


def test_lambdas_are_rejected_before_spawning():
  store = ParamStore.create({'w': np.zeros((1, 2), np.float32)})
  try:
    with pytest.raises(ValueError, match='env_fn must be picklable'):
      make_pool(1, Collector(1), store, env_fn=lambda: make_env())
  finally:
    store.close()


def test_every_member_gets_data_and_close_leaves_nothing():
  n = 3
  collector = Collector(n)
  store = make_store(n)
  try:
    pool = make_pool(n, collector, store, num_processes=2, warmup_steps=16)
    with pool:
      pool.start()
      assert pool.groups == [(0, 1), (2,)]
      wait_for(lambda: (collector.steps >= 200).all(), 60, pool,
               'every member collecting 200 steps')
      pids = pool.pids()
      assert len(set(pids)) == 2
      status = pool.status()
      assert all(s.alive for s in status)
      assert all(s.heartbeat_age_s < 5 for s in status)
      assert len(our_segments()) == 3  # two channels and the store
    assert all(gone(pid) for pid in pids)
    np.testing.assert_array_equal(pool.env_steps, collector.steps)
    assert pool.failures == []
  finally:
    store.close()
  assert our_segments() == []


def test_held_back_chunks_fill_the_channel_and_block_the_actor():
  n, slots = 2, 3
  collector = Collector(n)
  gate = threading.Event()
  store = make_store(n)
  try:
    pool = make_pool(n, collector, store, num_processes=1, queue_chunks=slots,
                     admit=lambda members, steps, timeout: gate.wait(timeout))
    with pool:
      pool.start()
      wait_for(lambda: pool.status()[0].pending == slots, 60, pool,
               'the channel filling up')
      time.sleep(0.5)
      status = pool.status()[0]
      # Bounded: the actor produced exactly what the ring holds, and waits.
      assert status.chunks == slots and status.pending == slots
      assert collector.chunks == 0
      # Alive and beating while it waits (every few ms; a busy machine
      # may delay a beat, not stop them).
      assert status.alive and status.heartbeat_age_s < 30.0
      gate.set()
      wait_for(lambda: collector.chunks > 3 * slots, 30, pool,
               'chunks flowing again')
      assert pool.status()[0].blocked_s > 0.4
  finally:
    store.close()
  assert our_segments() == []


def test_failing_actor_reports_members_and_traceback():
  n = 2
  store = make_store(n)
  failures = []
  try:
    pool = make_pool(n, Collector(n), store, num_processes=1, max_restarts=0,
                     env_fn=functools.partial(make_env, 20),
                     on_failure=failures.append)
    with pool:
      pool.start()
      start = time.monotonic()
      with pytest.raises(ActorDiedError) as info:
        wait_for(lambda: False, 60, pool, 'the failure being reported')
      assert time.monotonic() - start < 30
      message = str(info.value)
      assert 'members [0, 1]' in message
      assert 'RuntimeError: env exploded at step 21' in message
      assert 'Traceback' in message
      assert len(failures) == 1 and not failures[0].restarted
      assert failures[0].members == (0, 1) and failures[0].exitcode == 1
  finally:
    store.close()
  assert our_segments() == []


def test_killed_actor_is_restarted_then_fatal_once_restarts_run_out():
  n = 4
  collector = Collector(n)
  store = make_store(n)
  try:
    pool = make_pool(n, collector, store, num_processes=2, max_restarts=1)
    with pool:
      pool.start()
      wait_for(lambda: (collector.steps > 100).all(), 60, pool,
               'all members running')
      first_pid = pool.pids()[1]
      os.kill(first_pid, signal.SIGKILL)
      wait_for(lambda: len(pool.failures) == 1, 60, pool, 'the kill noticed')
      failure = pool.failures[0]
      assert failure.actor_id == 1 and failure.members == (2, 3)
      assert failure.exitcode == -signal.SIGKILL and failure.restarted
      assert 'SIGKILL' in failure.error
      before = collector.steps.copy()
      wait_for(lambda: (collector.steps[2:] > before[2:] + 100).all(), 60,
               pool, 'the restarted actor producing')
      assert pool.pids()[1] != first_pid
      assert pool.status()[1].restarts == 1
      # The second death of the same actor is fatal.
      os.kill(pool.pids()[1], signal.SIGKILL)
      with pytest.raises(ActorDiedError, match=r'members \[2, 3\]'):
        wait_for(lambda: False, 60, pool, 'the second kill noticed')
      assert not pool.failures[1].restarted
      assert pool.status()[0].alive  # the other actor is unaffected
      other_pid = pool.pids()[0]
    assert gone(other_pid) and gone(first_pid)
  finally:
    store.close()
  assert our_segments() == []


def test_hung_actor_is_detected_by_heartbeat_and_restarted():
  """An actor alive but not stepping (here: SIGSTOP, as a process stuck in
  an env call) is killed once its heartbeat is older than hang_timeout_s,
  then restarted like a dead one."""
  n = 4
  collector = Collector(n)
  store = make_store(n)
  try:
    pool = make_pool(n, collector, store, num_processes=2, max_restarts=1,
                     hang_timeout_s=3.0)
    with pool:
      pool.start()
      wait_for(lambda: (collector.steps > 100).all(), 120, pool,
               'all members running')
      hung_pid = pool.pids()[0]
      os.kill(hung_pid, signal.SIGSTOP)
      wait_for(lambda: len(pool.failures) == 1, 120, pool,
               'the hang noticed')
      failure = pool.failures[0]
      assert failure.members == (0, 1) and failure.restarted
      assert 'hung: no heartbeat for' in failure.error
      assert failure.exitcode == -signal.SIGKILL
      before = collector.steps.copy()
      wait_for(lambda: (collector.steps[:2] > before[:2] + 100).all(), 120,
               pool, 'the restarted actor producing')
      assert pool.pids()[0] != hung_pid
      assert gone(hung_pid)
      assert pool.status()[1].restarts == 0  # the other actor ran on
  finally:
    store.close()
  assert our_segments() == []


def test_starting_actors_leaves_the_parents_environment_alone(monkeypatch):
  """Actors pin their JAX to one CPU thread themselves: the learner
  process's environment, which its other threads (its own JAX) read, is
  never changed, not even for the instant of a spawn."""
  writes = []

  class Recording(collections.UserDict):
    def __setitem__(self, key, value):
      writes.append(key)
      super().__setitem__(key, value)

    def __delitem__(self, key):
      writes.append(key)
      super().__delitem__(key)

  environ = Recording(dict(os.environ))
  writes.clear()  # UserDict's constructor writes each key
  monkeypatch.setattr(os, 'environ', environ)
  n = 2
  collector = Collector(n)
  store = make_store(n)
  try:
    with make_pool(n, collector, store, num_processes=1) as pool:
      pool.start()
      wait_for(lambda: (collector.steps > 50).all(), 120, pool,
               'the actor producing')
  finally:
    store.close()
  assert writes == []
