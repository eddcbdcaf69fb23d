"""The pipeline end to end: a MuJoCo population run with TD3, the shared
layout through ``datapath.create``, and the lifecycle: a killed actor, a
stalled actor, an exception in the training loop, Ctrl-C, and the learner
process dying."""

import contextlib
import functools
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time

import gymnasium as gym
import jax
import numpy as np
import pytest

from fastpbrl import agents
from fastpbrl.actors import ActorDiedError
from fastpbrl.agents.sac import SACConfig
from fastpbrl.agents.td3 import TD3Config
from fastpbrl.config.derived import resolved
from fastpbrl.config.fields import RunConfig
from fastpbrl.core.types import EpisodeRecord
from fastpbrl.core.types import ReplaySample, make_env_spec
from fastpbrl.datapath import factory as datapath
from fastpbrl.datapath.actor_family import PipelineStalledError
from fastpbrl.datapath.actor_replay import Pipeline
from fastpbrl.datapath.common import PipelineConfig
from fastpbrl.learner.population import PopulationLearner, population_hparams

TD3_SMALL = TD3Config(hidden_sizes=(16,), batch_size=16, steps_per_call=10)


class SleepyEnv(gym.Env):
  """Steps normally, then hangs inside ``step`` (a stuck simulator)."""

  def __init__(self, hang_after: int = 100):
    self.observation_space = gym.spaces.Box(-1.0, 1.0, (2,), np.float32)
    self.action_space = gym.spaces.Box(-1.0, 1.0, (1,), np.float32)
    self.hang_after = hang_after
    self.total = 0

  def reset(self, *, seed=None, options=None):
    super().reset(seed=seed)
    return np.zeros(2, np.float32), {}

  def step(self, action):
    self.total += 1
    if self.total > self.hang_after:
      time.sleep(3600)
    return np.zeros(2, np.float32), 0.0, False, self.total % 20 == 0, {}


def hopper():
  # Short episodes: random Hopper policies fall (terminated) within ~20-60
  # steps; the time limit cuts the others (truncated).
  return gym.make('Hopper-v5', max_episode_steps=40)


def td3_population(env_fn, n, config=TD3_SMALL, seed=0):
  spec = make_env_spec(env_fn())
  agent = agents.make_agent('td3', spec, config)
  hparams = population_hparams(agent, n)
  learner = PopulationLearner(agent)
  state = learner.init(jax.random.PRNGKey(seed), hparams)
  agent_fn = functools.partial(agents.make_agent, 'td3', config=config)
  return learner, state, hparams, agent_fn


def our_segments(pid=None):
  pid = os.getpid() if pid is None else pid
  return [f for f in os.listdir('/dev/shm') if f.startswith(f'fpbrl_{pid}_')]


def gone(pid):
  try:
    os.kill(pid, 0)
  except ProcessLookupError:
    return True
  try:
    with open(f'/proc/{pid}/status') as f:
      return 'State:\tZ' in f.read()  # a zombie is not running either
  except FileNotFoundError:
    return True


def wait_until(condition, timeout):
  deadline = time.monotonic() + timeout
  while not condition():
    if time.monotonic() > deadline:
      return False
    time.sleep(0.1)
  return True


def test_config_validation_names_the_parameter():
  cases = [
      (dict(chunk_steps=0), 'chunk_steps must be >= 1'),
      (dict(layout='ring'), "layout must be one of"),
      (dict(update_to_data_ratio=0.0), r'update_to_data_ratio must be in'),
      (dict(warmup_steps=(1, 2)), 'warmup_steps must be an int or 4 ints'),
      (dict(num_actor_processes=5), r'num_actor_processes must be None or '
       r'in \[1, 4\]'),
      (dict(max_env_steps_ahead=40), r'max_env_steps_ahead must be None or '
       r'>= ceil\(num_steps / update_to_data_ratio\) \+ chunk_steps = 82'),
      (dict(eval_episodes=0), 'eval_episodes must be >= 1'),
  ]
  for kwargs, message in cases:
    with pytest.raises(ValueError, match=message):
      PipelineConfig(**kwargs).validate(4)
  PipelineConfig(warmup_steps=(1, 2, 3, 4)).validate(4)
  assert PipelineConfig(num_steps=50, chunk_steps=32).env_steps_ahead() == 232


def test_unpicklable_agent_fn_fails_before_any_process_starts():
  # Layouts only (ShapeDtypeStruct): nothing is computed or published.
  params = {'w': jax.ShapeDtypeStruct((2, 11, 3), np.float32)}
  hparams = {'noise': jax.ShapeDtypeStruct((2,), np.float32)}
  with pytest.raises(ValueError, match='agent_fn must be picklable'):
    Pipeline(hopper, lambda spec: agents.make_agent('td3', spec), params,
             hparams, PipelineConfig(num_steps=10, batch_size=16,
                                     replay_capacity=100))
  assert our_segments() == []


@pytest.mark.slow
def test_device_replay_and_asynchronous_publishing_end_to_end():
  # The replay on the device (sampled inside the learner call) and the
  # parameters published by the publisher thread, as fastpbrl.run.main does.
  n, target = 4, 1200
  learner, state, hparams, agent_fn = td3_population(hopper, n)
  config = PipelineConfig(num_steps=10, batch_size=16, warmup_steps=200,
                          num_actor_processes=2, replay_capacity=10_000,
                          chunk_steps=16, replay_location='device')
  calls = 0
  episodes = []
  with Pipeline(hopper, agent_fn, learner.policy_params(state), hparams,
                config, seed=1) as pipeline:
    assert pipeline.replay_on_device
    pids = pipeline.pool.pids()
    while pipeline.env_steps.min() < target:
      batch = pipeline.next_batch(timeout=60)
      assert isinstance(batch, ReplaySample)
      state, metrics = learner.update(state, hparams, batch)
      pipeline.publish_async(learner.policy_params(state), hparams)
      episodes += pipeline.drain_episodes()
      calls += 1
    assert pipeline.wait_published(60)
    ratio = pipeline.update_to_data_ratio()
    inserted = pipeline.replay.inserted()
    sizes = pipeline.replay.sizes()
    saved = pipeline.replay.state_dict()  # flushes: everything counted
    assert pipeline.failures == []
  assert (inserted >= target).all()
  np.testing.assert_array_equal(sizes, np.minimum(inserted, 10_000))
  np.testing.assert_array_equal(saved['size'], sizes)
  # Every stored row is a real step (Hopper's observations are never all 0).
  rows = saved['data']['observation']
  for m in range(n):
    assert (np.abs(rows[m, :sizes[m]]).sum(axis=-1) > 0).all()
  assert calls >= (target - 200) // 10
  assert 0.9 <= ratio <= 1.0
  assert np.asarray(metrics['finite']).all()
  assert learner.compilations == 1  # update_from_replay only
  for m in range(n):
    mine = [r for r in episodes if r.member == m]
    assert mine and max(r.policy_version for r in mine) > 5
  assert all(gone(pid) for pid in pids)
  assert our_segments() == []


@pytest.mark.slow
def test_td3_population_on_mujoco_end_to_end():
  n, target = 4, 2000
  learner, state, hparams, agent_fn = td3_population(hopper, n)
  config = PipelineConfig(num_steps=10, batch_size=16, warmup_steps=200,
                          num_actor_processes=2, replay_capacity=10_000,
                          chunk_steps=16, eval_interval=500)
  calls = 0
  episodes = []
  with Pipeline(hopper, agent_fn, learner.policy_params(state), hparams,
                config, seed=1) as pipeline:
    pids = pipeline.pool.pids()
    assert len(pids) == 2 and pipeline.pool.groups == [(0, 1), (2, 3)]
    while pipeline.env_steps.min() < target:
      batch = pipeline.next_batch(timeout=60)
      if calls == 0:
        assert batch.observation.shape == (n, 10, 16, 11)
        assert batch.action.shape == (n, 10, 16, 3)
        assert batch.terminated.shape == (n, 10, 16)
        assert isinstance(batch.reward, jax.Array)
      state, metrics = learner.update(state, hparams, batch)
      pipeline.publish(learner.policy_params(state), hparams)
      episodes += pipeline.drain_episodes()
      calls += 1
    stats = pipeline.wait_stats()
    ratio = pipeline.update_to_data_ratio()
    inserted = pipeline.replay.inserted()
    sample = pipeline.replay.sample(np.random.default_rng(0), 1, 2000)
    assert pipeline.failures == []
  # Transitions arrived for every member; the learner ran calls.
  assert (inserted >= target).all()
  assert calls >= (target - 200) // 10
  assert stats.batches == calls
  assert np.isfinite(np.asarray(metrics['critic_loss'])).all()
  # The limiter kept update steps at or under, and near, one per env step.
  assert 0.9 <= ratio <= 1.0
  # Terminations and time-limit truncations both reached the replay, kept
  # apart (both flags are set only when a fall coincides with the limit).
  terminated, truncated = sample.terminated == 1, sample.truncated == 1
  assert (terminated & ~truncated).any() and (truncated & ~terminated).any()
  # Returns and lengths reported per member, training and evaluation.
  assert all(isinstance(r, EpisodeRecord) for r in episodes)
  for m in range(n):
    mine = [r for r in episodes if r.member == m]
    train = [r for r in mine if not r.evaluation]
    evals = [r for r in mine if r.evaluation]
    assert len(train) >= 20 and evals
    assert all(1 <= r.episode_length <= 40 for r in mine)
    assert all(np.isfinite(r.episode_return) for r in mine)
    # Later episodes were played with parameters the learner published.
    assert max(r.policy_version for r in mine) > 10
    assert mine[0]['episode_return'] == mine[0].episode_return
  # Shutdown is clean: no processes, no shared memory.
  assert all(gone(pid) for pid in pids)
  assert our_segments() == []


@pytest.mark.slow
def test_shared_layout_through_create_with_sac():
  env_id, n = 'InvertedPendulum-v5', 3
  spec = make_env_spec(gym.make(env_id))
  agent = agents.make_agent('sac', spec, SACConfig(hidden_sizes=(16,),
                                                   batch_size=8,
                                                   steps_per_call=5))
  hparams = population_hparams(agent, n)
  learner = PopulationLearner(agent)
  state = learner.init(jax.random.PRNGKey(0), hparams)
  run_config = RunConfig(
      env=env_id, agent='sac', population_size=n, warmup_steps=50,
      update_to_data_ratio=1.0, num_actors=1, replay_capacity=5000,
      eval_every=10**6, eval_episodes=1, replay_location='host')
  run_config = resolved(run_config)
  with contextlib.closing(datapath.create(run_config, agent, learner,
                                          shared_replay=True)) as pipeline:
    assert pipeline.replay.layout == 'shared'
    pipeline.publish(learner.policy_params(state), hparams)
    for _ in range(30):
      batch = pipeline.next_batch(timeout=60)
      assert batch.observation.shape == (n, 5, 8, 4)
      state, _ = learner.update(state, hparams, batch)
      pipeline.publish(learner.policy_params(state), hparams)
    # One ring holds every member's transitions.
    inserted = pipeline.replay.inserted()
    assert (inserted > 0).all()
    size = pipeline.replay.sizes()[0]  # read after: actors may add more
    assert min(inserted.sum(), 5000) <= size <= 5000
    assert pipeline.drain_episodes()
    with pytest.raises(ValueError, match='needs layout="per_member"'):
      pipeline.copy_member_data([0], [1])
  assert our_segments() == []


@pytest.mark.slow
def test_killed_actor_is_reported_and_next_batch_raises_without_hanging():
  learner, state, hparams, agent_fn = td3_population(hopper, 4)
  config = PipelineConfig(num_steps=10, batch_size=16, warmup_steps=100,
                          num_actor_processes=2, replay_capacity=5000,
                          max_actor_restarts=1)
  with Pipeline(hopper, agent_fn, learner.policy_params(state), hparams,
                config) as pipeline:
    def train(calls):
      nonlocal state
      for _ in range(calls):
        batch = pipeline.next_batch(timeout=60)
        state, _ = learner.update(state, hparams, batch)
        pipeline.publish(learner.policy_params(state), hparams)

    train(5)
    victim = pipeline.pool.pids()[0]
    os.kill(victim, signal.SIGKILL)  # restarted: the run goes on
    assert wait_until(lambda: len(pipeline.failures) == 1, 60)
    assert pipeline.failures[0].members == (0, 1)
    assert pipeline.failures[0].restarted
    train(20)
    assert gone(victim)
    # The restarted actor produced the data of those calls, so pids()[0] is
    # its process; should it have died on its own meanwhile, the pool says
    # why (a ProcessLookupError here would hide it).
    replacement = pipeline.pool.pids()[0]
    assert replacement != victim
    try:
      os.kill(replacement, signal.SIGKILL)  # restarts used up
    except ProcessLookupError:
      raise AssertionError(f'the restarted actor {replacement} is gone; '
                           f'failures: {pipeline.failures}') from None
    start = time.monotonic()
    with pytest.raises(ActorDiedError, match=r'(?s)members \[0, 1\].*SIGKILL'):
      train(10**6)
    assert time.monotonic() - start < 60
    with pytest.raises(ActorDiedError):
      pipeline.publish(learner.policy_params(state), hparams)
    pids = pipeline.pool.pids()
  assert all(gone(pid) for pid in pids)
  assert our_segments() == []


@pytest.mark.slow
def test_stalled_actor_raises_instead_of_hanging():
  env_fn = functools.partial(SleepyEnv, 100)
  learner, state, hparams, agent_fn = td3_population(env_fn, 2)
  config = PipelineConfig(num_steps=10, batch_size=16, warmup_steps=10**6,
                          num_actor_processes=1, replay_capacity=1000,
                          chunk_steps=10, stall_timeout_s=2.0,
                          shutdown_grace_s=0.5)
  pipeline = Pipeline(env_fn, agent_fn, learner.policy_params(state),
                      hparams, config)
  try:
    with pytest.raises(PipelineStalledError, match='no transitions arrived'
                       ) as info:
      pipeline.next_batch()
    assert 'needs 1000000 per member' in str(info.value)
    assert 'actor 0 members [0, 1]' in str(info.value)
    pid = pipeline.pool.pids()[0]
  finally:
    start = time.monotonic()
    pipeline.close()
  assert time.monotonic() - start < 30  # killed, not waited for (100 s)
  assert gone(pid)
  assert our_segments() == []


@pytest.mark.slow
def test_exception_in_the_training_loop_releases_everything():
  learner, state, hparams, agent_fn = td3_population(hopper, 2)
  config = PipelineConfig(num_steps=10, batch_size=16, warmup_steps=50,
                          num_actor_processes=1, replay_capacity=1000)
  with pytest.raises(ZeroDivisionError):
    with Pipeline(hopper, agent_fn, learner.policy_params(state), hparams,
                  config) as pipeline:
      pipeline.next_batch(timeout=60)
      pids = pipeline.pool.pids()
      pipeline.copy_member_data([1], [0])
      sizes = pipeline.replay.sizes()
      assert sizes[1] == sizes[0]
      1 / 0  # pylint: disable=pointless-statement
  assert all(gone(pid) for pid in pids)
  assert our_segments() == []


SCRIPT = textwrap.dedent('''
    import functools, signal, sys, jax
    from fastpbrl import agents
    from fastpbrl.agents.td3 import TD3Config
    from fastpbrl.learner.population import PopulationLearner, population_hparams
    from fastpbrl.datapath.actor_replay import Pipeline
    from fastpbrl.datapath.common import PipelineConfig
    from fastpbrl.core.types import make_env_spec
    import gymnasium as gym

    def main():
      # As in a terminal: a shell that starts jobs in the background (CI
      # runners do) makes them ignore SIGINT, and Python then installs no
      # KeyboardInterrupt handler.
      signal.signal(signal.SIGINT, signal.default_int_handler)
      env_id = 'InvertedPendulum-v5'
      config = TD3Config(hidden_sizes=(8,), batch_size=8, steps_per_call=5)
      agent = agents.make_agent('td3', make_env_spec(gym.make(env_id)), config)
      hparams = population_hparams(agent, 2)
      learner = PopulationLearner(agent)
      state = learner.init(jax.random.PRNGKey(0), hparams)
      with Pipeline(env_id, functools.partial(agents.make_agent, 'td3',
                                              config=config),
                    learner.policy_params(state), hparams,
                    PipelineConfig(num_steps=5, batch_size=8, warmup_steps=50,
                                   num_actor_processes=1,
                                   replay_capacity=1000)) as pipeline:
        calls = 0
        while True:
          batch = pipeline.next_batch(timeout=60)
          state, _ = learner.update(state, hparams, batch)
          pipeline.publish(learner.policy_params(state), hparams)
          calls += 1
          if calls == 3:
            print('READY', *pipeline.pool.pids(), flush=True)

    if __name__ == '__main__':
      main()
''')


def run_script(tmp_path):
  script = tmp_path / 'train.py'
  script.write_text(SCRIPT)
  proc = subprocess.Popen([sys.executable, str(script)], cwd=tmp_path,
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                          text=True, start_new_session=True)
  line = proc.stdout.readline()
  if not line.startswith('READY'):
    proc.kill()
    raise AssertionError(f'script did not start: {line}{proc.stderr.read()}')
  return proc, [int(p) for p in line.split()[1:]]


@pytest.mark.slow
def test_ctrl_c_stops_everything_within_seconds(tmp_path):
  proc, actor_pids = run_script(tmp_path)
  start = time.monotonic()
  os.killpg(proc.pid, signal.SIGINT)  # what a terminal's Ctrl-C does
  try:
    proc.wait(timeout=120)
  except subprocess.TimeoutExpired:
    os.killpg(proc.pid, signal.SIGKILL)  # leave nothing behind on failure
    raise
  stderr = proc.stderr.read()
  assert time.monotonic() - start < 120  # stops, not waits for a budget
  assert 'KeyboardInterrupt' in stderr
  assert all(gone(pid) for pid in actor_pids)
  assert our_segments(proc.pid) == []
  assert 'leaked' not in stderr


@pytest.mark.slow
def test_actors_exit_when_the_learner_process_dies(tmp_path):
  proc, actor_pids = run_script(tmp_path)
  os.kill(proc.pid, signal.SIGKILL)  # no chance to clean up
  proc.wait(timeout=10)
  assert wait_until(lambda: all(gone(pid) for pid in actor_pids), 60)
  # With the last process gone, the resource tracker unlinks the segments.
  assert wait_until(lambda: our_segments(proc.pid) == [], 60)


def pendulum():
  return gym.make('Pendulum-v1')


@pytest.mark.slow
def test_restarted_member_starts_with_an_empty_replay_and_its_own_warmup():
  # HyperTrick's restarted slot is a new experiment: its replay is emptied
  # (nothing of the evicted configuration's data is sampled again), it warms
  # up anew, and the learner discards its updates until then.
  n, warmup = 2, 100
  learner, state, hparams, agent_fn = td3_population(pendulum, n)
  config = PipelineConfig(num_steps=10, batch_size=16, warmup_steps=warmup,
                          num_actor_processes=1, replay_capacity=10_000,
                          chunk_steps=16)
  with Pipeline(pendulum, agent_fn, learner.policy_params(state), hparams,
                config, seed=2) as pipeline:
    for _ in range(30):
      batch = pipeline.next_batch(timeout=120)
      assert pipeline.last_active.all()
      state, _ = learner.update(state, hparams, batch, pipeline.last_active)
      pipeline.publish(learner.policy_params(state), hparams)
    before = pipeline.replay.inserted().copy()
    assert (pipeline.replay.sizes() >= 300).all()
    pipeline.restart_members([1])
    pipeline.publish(learner.policy_params(state), hparams)
    inactive_calls, deadline = 0, time.monotonic() + 300
    frozen = jax.tree.map(lambda x: np.asarray(x[1]), state)
    while True:
      assert time.monotonic() < deadline, 'member 1 never became active'
      batch = pipeline.next_batch(timeout=120)
      active = pipeline.last_active.copy()
      state, _ = learner.update(state, hparams, batch, active)
      pipeline.publish(learner.policy_params(state), hparams)
      if active[1]:
        break
      inactive_calls += 1
      assert active[0]
      # The restarted member's update is discarded while it warms up.
      jax.tree.map(lambda a, b: np.testing.assert_array_equal(
          np.asarray(a[1]), b), state, frozen)
    sizes = pipeline.replay.sizes()
    inserted = pipeline.replay.inserted()
    fresh = int(pipeline._fresh[1])  # transitions since the restart
  assert inactive_calls >= 1
  # Member 1's ring holds exactly the data collected since its restart: at
  # least its warm-up, none of the ~300+ transitions it had before.
  assert warmup <= sizes[1] == fresh < inserted[1] - before[1] + 1
  assert sizes[0] > sizes[1] + 200


def test_a_restart_during_sampling_marks_that_batch_inactive():
  # The prefetch thread reads the active mask, then samples. A restart
  # requested in between (the learner's thread runs while the prefetch
  # thread samples; under load the gap can be long) must still mark the
  # batch being sampled, which holds the old experiment's data, inactive
  # for the restarted member. Here the restart is requested from inside the
  # sample itself, so that interleaving happens every time.
  learner, state, hparams, agent_fn = td3_population(pendulum, 2)
  config = PipelineConfig(num_steps=10, batch_size=16, warmup_steps=100,
                          num_actor_processes=1, replay_capacity=10_000,
                          chunk_steps=16)
  with Pipeline(pendulum, agent_fn, learner.policy_params(state), hparams,
                config, seed=3) as pipeline:
    for _ in range(3):
      pipeline.next_batch(timeout=120)
      assert pipeline.last_active.all()
    sample, fired = pipeline.replay.sample, threading.Event()

    def sample_then_restart(*args, **kwargs):
      batch = sample(*args, **kwargs)
      if not fired.is_set():
        pipeline.restart_members([1])
        fired.set()
      return batch

    pipeline.replay.sample = sample_then_restart
    # No publish follows, so member 1's actor never starts its new
    # experiment and no batch may be active for it from now on: those
    # queued before the restart, the one sampled across it, and later ones.
    masks = []
    while len(masks) < config.prefetch_depth + 3:
      pipeline.next_batch(timeout=120)
      if fired.is_set():
        masks.append(pipeline.last_active.copy())
  masks = np.stack(masks)
  assert masks[:, 0].all() and not masks[:, 1].any(), masks
